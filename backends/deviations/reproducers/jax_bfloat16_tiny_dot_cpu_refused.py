import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
import ml_dtypes

jax.config.update("jax_default_matmul_precision", "highest")
x = jnp.ones((1, 1, 1, 1), ml_dtypes.bfloat16)
try:
    jax.jit(jax.nn.dot_product_attention)(x, x, x)
except Exception as e:
    assert "BF16_BF16_F32" in str(e)
else:
    raise AssertionError("compiled")
