import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
out, lse = jax.nn.dot_product_attention(q, k, v, return_residual=True)
assert lse.dtype == jnp.bfloat16  # the spec: float32
