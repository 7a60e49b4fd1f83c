import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
mask = jnp.ones((3, 5), bool).at[1].set(False)  # query 1 sees no key
out = attention(q, k, v, mask=mask[None, None])
assert jnp.allclose(out[0, 1], v[0].mean(axis=0), atol=1e-6)  # the spec: 0
