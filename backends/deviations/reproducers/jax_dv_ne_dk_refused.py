import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
try:
    attention(q, k, v[..., :3])
except ValueError as e:
    assert "value shape should be" in str(e)
else:
    raise AssertionError("jax accepted dv != dk")
