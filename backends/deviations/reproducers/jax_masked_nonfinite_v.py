import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
v = v.at[0, 4].set(jnp.nan)  # key 4 is masked from every query
out = attention(q, k, v, mask=(jnp.arange(5) < 4)[None, None, None])
assert jnp.isnan(out).all()  # the spec: finite, key 4 is absent
