import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
k = k.at[0, 4].set(jnp.nan)
bias = jnp.where(jnp.arange(5) < 4, 0.0, -jnp.inf)  # key 4 is hidden from every query
out = attention(q, k, v, bias=bias[None, None, None])
assert jnp.isnan(out).all()  # the spec: finite, key 4 is absent
