import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
bias = jnp.zeros((3, 5)).at[1].set(-jnp.inf)
out = attention(q, k, v, bias=bias[None, None])
assert jnp.isnan(out[0, 1]).all()  # the spec: 0
