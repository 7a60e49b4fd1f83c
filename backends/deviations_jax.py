"""The declared deviations of ``jax.nn.dot_product_attention`` (``jax-native``), measured on
jax 0.10.2 CPU. Part of `attnspec.backends.deviations`."""

from __future__ import annotations

from attnspec.backends import deviation_cases as c
from attnspec.backends.deviation_probe import Deviation

__all__ = ["JAX_DEVIATIONS"]

# the reproducers' first lines (framework only); JAX layout (B, T, N, H)
_JAX = """\
import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
"""

JAX_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        deviation_id="jax.empty-row-mean-v",
        tags=frozenset(["no_visible_row"]),
        backend="jax-native",
        feature="sdpa: a query row with no visible key (mask, lengths)",
        spec_says="output 0",
        native_does="output mean(V) over all keys: masked logits are set to a large finite "
        "negative, so an all-masked row gets a uniform softmax (also for "
        "key_value_seq_lengths=0)",
        reproducer=_JAX
        + """\
mask = jnp.ones((3, 5), bool).at[1].set(False)  # query 1 sees no key
out = attention(q, k, v, mask=mask[None, None])
assert jnp.allclose(out[0, 1], v[0].mean(axis=0), atol=1e-6)  # the spec: 0
""",
        fixed_by="jax: _fused sets rows with no visible key to 0",
        case=c.empty_row_by_mask,
        shows=c.row1_is_mean_v,
    ),
    Deviation(
        deviation_id="jax.neg-inf-bias-row-nan",
        tags=frozenset(["bias_neg_inf", "no_visible_row"]),
        backend="jax-native",
        feature="sdpa: a row whose bias is -inf for every key",
        spec_says="-inf bias means the key is absent; a row with no key gives 0",
        native_does="NaN (the bias is only added to the logits, and softmax of all -inf is NaN)",
        reproducer=_JAX
        + """\
bias = jnp.zeros((3, 5)).at[1].set(-jnp.inf)
out = attention(q, k, v, bias=bias[None, None])
assert jnp.isnan(out[0, 1]).all()  # the spec: 0
""",
        fixed_by="jax: _fused folds -inf bias into the mask and sets rows with no visible key to 0",
        case=c.empty_row_by_bias,
        shows=c.row1_is_nan,
    ),
    Deviation(
        deviation_id="jax.finite-mask-fill",
        tags=frozenset(["finite_floor"]),
        backend="jax-native",
        feature="sdpa: a row whose visible logits are large negative finite (bias -1e9 .. finfo.min)",
        spec_says="a masked key is absent: it takes no weight, whatever the visible logits are",
        native_does="masked logits are set to -0.7 * finfo(dtype).max, a finite value, so where the "
        "visible logits are below it (a bias of finfo.min) the masked keys take all the "
        "weight, and near it a share of it",
        reproducer=_JAX
        + """\
q = q.at[0, 1].set(0.0)  # query 1's logits are its bias alone
bias = jnp.zeros((3, 5)).at[1].set(jnp.finfo(jnp.float32).min)
mask = jnp.arange(5) < 4  # key 4 is masked from every query
out = attention(q, k, v, bias=bias[None, None], mask=mask[None, None, None])
assert jnp.allclose(out[0, 1], v[0, 4], atol=1e-6)  # the spec: the mean of keys 0-3's values
""",
        fixed_by="jax: a call whose logits may reach half of the fill takes the exact path",
        case=c.floor_row,
        shows=c.row1_is_masked_value,
    ),
    Deviation(
        deviation_id="jax.masked-nonfinite-v",
        tags=frozenset(["masked_nonfinite"]),
        backend="jax-native",
        feature="sdpa: NaN/inf in a masked value",
        spec_says="a masked key is absent: its v never reaches any row",
        native_does="NaN or inf in the value of a masked key makes every row NaN in those "
        "columns (weight 0 times NaN or inf is NaN); padded queries too",
        reproducer=_JAX
        + """\
v = v.at[0, 4].set(jnp.nan)  # key 4 is masked from every query
out = attention(q, k, v, mask=(jnp.arange(5) < 4)[None, None, None])
assert jnp.isnan(out).all()  # the spec: finite, key 4 is absent
""",
        fixed_by="jax: _drop_hidden_keys zeroes keys no row sees; otherwise _exact with nonfinite_v",
        case=c.hidden_nan_value,
        shows=c.any_nan,
    ),
    Deviation(
        deviation_id="jax.masked-nonfinite-k-bias",
        tags=frozenset(["bias_neg_inf", "masked_nonfinite"]),
        backend="jax-native",
        feature="sdpa: NaN in a key hidden by a -inf bias",
        spec_says="-inf bias means the key is absent: its k never reaches any row",
        native_does="every row is NaN: the bias is added to a NaN logit (NaN + -inf = NaN); "
        "keys hidden by mask, is_causal or lengths do not leak (JAX masks with where)",
        reproducer=_JAX
        + """\
k = k.at[0, 4].set(jnp.nan)
bias = jnp.where(jnp.arange(5) < 4, 0.0, -jnp.inf)  # key 4 is hidden from every query
out = attention(q, k, v, bias=bias[None, None, None])
assert jnp.isnan(out).all()  # the spec: finite, key 4 is absent
""",
        fixed_by="jax: _fused folds -inf bias entries into JAX's mask, which uses where",
        case=c.nan_key_behind_neg_inf_bias,
        shows=c.any_nan,
    ),
    Deviation(
        deviation_id="jax.neg-inf-logits-attend-masked-keys",
        backend="jax-native",
        feature="sdpa: a row whose visible logits are all -inf (inf in q or k)",
        spec_says="no visible key has a finite logit, so the row gives 0; masked keys stay absent",
        native_does="the row attends to the masked keys: they are filled with a finite -0.7 * "
        "float32 max, which beats -inf, so their values come out (NaN without a mask)",
        reproducer=_JAX
        + """\
k = jnp.abs(k) + 0.1  # every k[..., 0] > 0
q = q.at[0, 1, 0].set(jnp.array([-jnp.inf, 0.0, 0.0, 0.0]))  # query 1: every logit is -inf
out = attention(q, k, v, mask=(jnp.arange(5) < 4)[None, None, None])
assert jnp.allclose(out[0, 1, 0], v[0, 4, 0], atol=1e-6)  # the masked key 4; the spec: 0
""",
        fixed_by="jax: a non-finite q or k sends the call to the exact path _exact",
        case=c.neg_inf_logits_row,
        shows=c.row1_is_masked_value,
    ),
    Deviation(
        deviation_id="jax.dv-ne-dk-refused",
        tags=frozenset(["dk_ne_dv"]),
        backend="jax-native",
        feature="sdpa: value head dim dv != query/key head dim dk",
        spec_says="dv may differ from dk (the output has dv columns)",
        native_does="ValueError: value shape should be [B, S, K, dk]",
        reproducer=_JAX
        + """\
try:
    attention(q, k, v[..., :3])
except ValueError as e:
    assert "value shape should be" in str(e)
else:
    raise AssertionError("jax accepted dv != dk")
""",
        fixed_by="jax: _fused zero-pads the narrower head dim and slices the output back",
        case=c.dv_ne_dk,
        shows=c.refused,
    ),
    Deviation(
        deviation_id="jax.float64-softmax-in-float32",
        tags=frozenset(["float64"]),
        backend="jax-native",
        feature="sdpa: float64 inputs",
        spec_says="computed in float64 (the result is as exact as float64 allows)",
        native_does="the softmax is always computed in float32, so float64 results are off by "
        "~1e-7 relative (measured 1.1e-7 on a 5x7 case) instead of ~1e-16",
        reproducer="""\
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
q, k, v = (np.random.default_rng(i).standard_normal((1, s, 1, 8)) for i, s in enumerate((5, 7, 7)))
out = np.asarray(jax.jit(jax.nn.dot_product_attention)(*map(jnp.asarray, (q, k, v))))
s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(8)
w = np.exp(s - s.max(axis=-1, keepdims=True))
ref = np.einsum("bnts,bsnh->btnh", w / w.sum(axis=-1, keepdims=True), v)
assert out.dtype == np.float64 and np.abs(out - ref).max() > 1e-10  # the spec: ~1e-16
""",
        fixed_by="jax: float64 calls take the exact path _exact (the array API core in float64)",
        case=c.float64,
        shows=c.float32_level_error,
    ),
    Deviation(
        deviation_id="jax.float16-jit-cpu-refused",
        tags=frozenset(["float16"]),
        backend="jax-native",
        feature="sdpa: float16 inputs, under jax.jit, on CPU",
        spec_says="float16 is a supported dtype",
        native_does="ValueError: The precision 'F16_F16_F32' is not supported by dot_general on "
        "CPU. JAX asks for that precision and falls back with a try/except that only "
        "catches errors at trace time, while under jit XLA raises at compile time; "
        "eager calls work",
        reproducer=_JAX
        + """\
q, k, v = (x.astype(jnp.float16) for x in (q, k, v))
try:
    attention(q, k, v)
except ValueError as e:
    assert "F16_F16_F32" in str(e)
else:
    raise AssertionError("jit accepted float16 on CPU")
""",
        fixed_by="jax: float16 calls on CPU take the exact path _exact (float32 compute)",
        case=c.float16,
        shows=c.refused,
    ),
    Deviation(
        deviation_id="jax.bfloat16-tiny-dot-cpu-refused",
        tags=frozenset(["bfloat16"]),
        backend="jax-native",
        feature="sdpa: bfloat16 inputs of size 1 (n = m = d = 1), jit, CPU, 'highest' precision",
        spec_says="bfloat16 is a supported dtype, at every size",
        native_does="JaxRuntimeError: Algorithm not supported by the ElementalIrEmitter: "
        "ALG_DOT_BF16_BF16_F32. With jax_default_matmul_precision='highest' (the "
        "conformance numerics policy), XLA:CPU lowers degenerate dots through an "
        "emitter without that algorithm; larger bfloat16 shapes compile",
        reproducer=_JAX
        + """\
import ml_dtypes

jax.config.update("jax_default_matmul_precision", "highest")
x = jnp.ones((1, 1, 1, 1), ml_dtypes.bfloat16)
try:
    jax.jit(jax.nn.dot_product_attention)(x, x, x)
except Exception as e:
    assert "BF16_BF16_F32" in str(e)
else:
    raise AssertionError("compiled")
""",
        fixed_by="jax: bfloat16 calls on CPU take the exact path _exact (float32 compute)",
        case=c.bfloat16_single,
        shows=c.refused,
    ),
    # -- the logsumexp (return_lse=True through return_residual=True) --
    Deviation(
        deviation_id="jax.lse-empty-row-finite",
        tags=frozenset(["lse", "no_visible_row"]),
        backend="jax-native",
        feature="sdpa(return_lse=True): the lse of a query row with no visible key (mask, lengths)",
        spec_says="-inf (the log of an empty denominator)",
        native_does="a finite -2.3819763e+38 (float32; -2.37932e+38 in bfloat16): the logsumexp of "
        "the masked logits, which JAX fills with -0.7 * float32 max, for rows hidden by "
        "mask, key_value_seq_lengths or query_seq_lengths alike; a row whose bias is "
        "-inf everywhere gives -inf (its logits are -inf, not filled)",
        reproducer=_JAX
        + """\
mask = jnp.ones((3, 5), bool).at[1].set(False)  # query 1 sees no key
out, lse = jax.nn.dot_product_attention(q, k, v, mask=mask[None, None], return_residual=True)
assert lse.shape == (1, 3, 1) and jnp.isfinite(lse[0, 1]).all() and lse[0, 1, 0] < -1e38  # the spec: -inf
""",
        fixed_by="jax: _variants computes the lse on the exact path, -inf for a row with no visible key",
        case=c.empty_row_lse,
        shows=c.lse_row1_finite,
    ),
    Deviation(
        deviation_id="jax.lse-in-input-dtype",
        tags=frozenset(["lse", "bfloat16"]),
        backend="jax-native",
        feature="sdpa(return_lse=True): bfloat16 (and float16) inputs",
        spec_says="the lse is float32 for float16 and bfloat16 inputs (float64 for float64), "
        "as FlashAttention and flex_attention return it",
        native_does="the lse comes back in the input dtype: JAX computes it in float32 and casts it "
        "to key.dtype, so bfloat16 inputs give a bfloat16 lse, rounded to 8 bits "
        "(measured 1.5625 for 1.56537). float16 gives a float16 lse when called eagerly; under "
        "jit on CPU float16 is refused (jax.float16-jit-cpu-refused), so the suite "
        "meets this only in bfloat16 there",
        reproducer=_JAX
        + """\
q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
out, lse = jax.nn.dot_product_attention(q, k, v, return_residual=True)
assert lse.dtype == jnp.bfloat16  # the spec: float32
""",
        fixed_by="jax: _variants computes the lse on the exact path, in float32 for bfloat16 inputs",
        case=c.bfloat16_lse,
        shows=c.lse_in_input_dtype,
    ),
    # -- gradients (sdpa_vjp through jax.vjp of the native call) --
    Deviation(
        deviation_id="jax.empty-row-grad-into-masked-values",
        function="sdpa_vjp",
        tags=frozenset(["vjp", "no_visible_row"]),
        backend="jax-native",
        feature="sdpa_vjp: a query row with no visible key (mask, lengths)",
        spec_says="the row contributes no gradient, and a masked key gets dk = dv = 0 exactly",
        native_does="the row's uniform softmax over all keys (jax.empty-row-mean-v) sends "
        "dO / m into the dv of every key, masked ones included (0.2 per entry for m = 5, "
        "d_out = 1); dq of the row is 0 and dk stays 0",
        reproducer=_JAX
        + """\
mask = jnp.ones((3, 5), bool).at[1].set(False).at[:, 4].set(False)  # query 1 sees nothing
out, pullback = jax.vjp(lambda v: attention(q, k, v, mask=mask[None, None]), v)
(dv,) = pullback(jnp.ones_like(out))
assert (dv[0, 4] != 0).all()  # key 4 is hidden from every query; the spec: dv = 0
""",
        fixed_by="jax: _fused sets rows with no visible key to 0 with where, which stops their gradient",
        case=c.empty_row_and_hidden_key,
        shows=c.hidden_key_gets_dv,
    ),
    Deviation(
        deviation_id="jax.neg-inf-bias-row-nan-grads",
        function="sdpa_vjp",
        tags=frozenset(["vjp", "bias_neg_inf", "no_visible_row"]),
        backend="jax-native",
        feature="sdpa_vjp: a row whose bias is -inf for every key",
        spec_says="the row contributes no gradient; every gradient stays finite",
        native_does="dk and dv are NaN for every key (and dq for every row): the NaN row of the "
        "forward (jax.neg-inf-bias-row-nan) flows back through the shared k and v",
        reproducer=_JAX
        + """\
bias = jnp.zeros((3, 5)).at[1].set(-jnp.inf)  # query 1: every key absent
out, pullback = jax.vjp(lambda k, v: attention(q, k, v, bias=bias[None, None]), k, v)
dk, dv = pullback(jnp.ones_like(out))
assert jnp.isnan(dk).all() and jnp.isnan(dv).all()  # the spec: finite
""",
        fixed_by="jax: _fused folds -inf bias into the mask and zeroes rows with no visible key with "
        "where, so no NaN is formed forward or backward",
        case=c.empty_row_by_bias,
        shows=c.dk_dv_nan,
    ),
)
