import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
q = q.at[0, 1].set(0.0)  # query 1's logits are its bias alone
bias = jnp.zeros((3, 5)).at[1].set(jnp.finfo(jnp.float32).min)
mask = jnp.arange(5) < 4  # key 4 is masked from every query
out = attention(q, k, v, bias=bias[None, None], mask=mask[None, None, None])
assert jnp.allclose(out[0, 1], v[0, 4], atol=1e-6)  # the spec: the mean of keys 0-3's values
