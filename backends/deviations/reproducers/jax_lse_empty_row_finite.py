import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
mask = jnp.ones((3, 5), bool).at[1].set(False)  # query 1 sees no key
out, lse = jax.nn.dot_product_attention(q, k, v, mask=mask[None, None], return_residual=True)
assert lse.shape == (1, 3, 1) and jnp.isfinite(lse[0, 1]).all() and lse[0, 1, 0] < -1e38  # the spec: -inf
