import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
mask = jnp.ones((3, 5), bool).at[1].set(False).at[:, 4].set(False)  # query 1 sees nothing
out, pullback = jax.vjp(lambda v: attention(q, k, v, mask=mask[None, None]), v)
(dv,) = pullback(jnp.ones_like(out))
assert (dv[0, 4] != 0).all()  # key 4 is hidden from every query; the spec: dv = 0
