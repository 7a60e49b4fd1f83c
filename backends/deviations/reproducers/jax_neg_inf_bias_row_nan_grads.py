import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
bias = jnp.zeros((3, 5)).at[1].set(-jnp.inf)  # query 1: every key absent
out, pullback = jax.vjp(lambda k, v: attention(q, k, v, bias=bias[None, None]), k, v)
dk, dv = pullback(jnp.ones_like(out))
assert jnp.isnan(dk).all() and jnp.isnan(dv).all()  # the spec: finite
