import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
k = jnp.abs(k) + 0.1  # every k[..., 0] > 0
q = q.at[0, 1, 0].set(jnp.array([-jnp.inf, 0.0, 0.0, 0.0]))  # query 1: every logit is -inf
out = attention(q, k, v, mask=(jnp.arange(5) < 4)[None, None, None])
assert jnp.allclose(out[0, 1, 0], v[0, 4, 0], atol=1e-6)  # the masked key 4; the spec: 0
