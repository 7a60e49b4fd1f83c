import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
q, k, v = (x.astype(jnp.float16) for x in (q, k, v))
try:
    attention(q, k, v)
except ValueError as e:
    assert "F16_F16_F32" in str(e)
else:
    raise AssertionError("jit accepted float16 on CPU")
