"""Where the frameworks' own attention differs from the spec, as data.

Each `Deviation` names the native backend that shows it, what the spec says, what the framework
does (measured on torch 2.13 CPU and jax 0.10.2 CPU), a standalone reproducer that uses only
the framework (its final ``assert`` holds while the deviation does), and the fix-up of the
conformant adapter that covers it; the fix-up's code carries the deviation id in a comment.
``probe(backend)`` runs a minimal case through any attnspec backend and says whether the
deviation shows there. The kit's tests check both directions: every deviation still reproduces
on its native backend (a stale entry fails) and no conformant backend shows it.

Probes run on the backend's default device, which is the CPU for every built-in backend, so the
CPU-specific entries (``torch.nonfinite-query-row-zeroed``, ``jax.float16-jit-cpu-refused``) are
checked where they were measured; GPU kernels were not measured.

Measured and not a deviation (so not listed): torch returns 0 for a query row with no visible
key (math and flash CPU kernels, every float dtype, boolean mask or all -inf bias);
``torch.nn.attention.bias.causal_lower_right`` works on CPU, also when n > m (rows with no key
give 0, despite torch's warning that they give NaN); JAX's ``local_window_size=(l, r)`` lets
query i see [i - l, i + r], the spec's window; JAX drops a NaN key hidden by ``mask``,
``is_causal`` or the sequence lengths (it masks logits with ``where``); padded queries
(``query_seq_lengths``) give 0 in JAX. Gradients (torch.autograd through torch SDPA, math and
CPU flash kernels, float32, float64 and bfloat16): a row with no visible key (boolean mask or
all -inf bias) gets dq = 0 and adds nothing, and a masked key gets dk = dv = 0, all finite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec.backends._base import Backend
from attnspec.backends._compare import golden_and_reference, relative_error

__all__ = ["DEVIATIONS", "Deviation", "run"]

Case = tuple  # (q, k, v, options): NumPy arrays and sdpa keywords


@dataclass(frozen=True)
class Deviation:
    deviation_id: str
    backend: str  # the native backend that shows it
    feature: str
    spec_says: str
    native_does: str
    reproducer: str  # runnable Python using only the framework; its assert holds while it deviates
    fixed_by: str  # "<conformant backend>: <the fix-up that covers it>"
    case: Callable[[], Case]  # the minimal case, as NumPy
    shows: Callable[[Any, Case], bool]  # (backend result or its exception, case) -> deviates?
    # The conformance suite's case tags under which this deviation appears (all must be present):
    # a failing case of this backend that carries them counts as this deviation, not a failure.
    # Empty: the suite's generators never build such a case (it is checked by its probe alone).
    tags: frozenset[str] = frozenset()
    # the spec function the case calls: "sdpa", or "sdpa_vjp" (its result is (dq, dk, dv[, dbias])
    # for d_out = 1, from `run_vjp`)
    function: str = "sdpa"

    def probe(self, backend: Backend) -> bool:
        """Run the minimal case on ``backend``; True when this deviation reproduces there."""
        case = self.case()
        runner = {"sdpa_vjp": run_vjp, "mha": run_mha}.get(self.function, run)
        result = runner(backend, case)
        return bool(self.shows(result, case))


def run(backend: Backend, case: Case):
    """The case through ``backend``, back as NumPy (a tuple of them for (out, lse) and the like);
    an exception is returned, not raised."""
    q, k, v, options = case
    conv = {key: backend.asarray(val) if key in ("mask", "bias") else val for key, val in options.items()}
    try:
        out = backend.sdpa(backend.asarray(q), backend.asarray(k), backend.asarray(v), **conv)
    except Exception as e:  # a refusal is a result here
        return e
    return tuple(map(backend.to_numpy, out)) if isinstance(out, tuple) else backend.to_numpy(out)


def run_vjp(backend: Backend, case: Case):
    """sdpa_vjp of the case with d_out = 1 through ``backend``, as NumPy; an exception is returned."""
    q, k, v, options = case
    conv = {key: backend.asarray(val) if key in ("mask", "bias") else val for key, val in options.items()}
    try:
        out = backend.sdpa(backend.asarray(q), backend.asarray(k), backend.asarray(v), **conv)
        d_out = backend.asarray(np.ones(tuple(out.shape), q.dtype))
        grads = backend.sdpa_vjp(backend.asarray(q), backend.asarray(k), backend.asarray(v), d_out, **conv)
    except Exception as e:  # a refusal is a result here
        return e
    return tuple(backend.to_numpy(g) for g in grads)


# -- cases ----------------------------------------------------------------------------------

def _qkv(n=3, m=5, dk=4, dv=4, heads=1, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    return tuple(r.standard_normal(s).astype(dtype)
                 for s in ((heads, n, dk), (heads, m, dk), (heads, m, dv)))


def _hidden_nan_key() -> Case:
    q, k, v = _qkv()
    k[..., 4, :] = np.nan  # key 4 is masked from every query
    return q, k, v, {"mask": np.arange(5) < 4}


def _hidden_nan_value() -> Case:
    q, k, v = _qkv()
    v[..., 4, :] = np.nan
    return q, k, v, {"mask": np.arange(5) < 4}


def _nan_key_behind_neg_inf_bias() -> Case:
    q, k, v = _qkv()
    k[..., 4, :] = np.nan
    return q, k, v, {"bias": np.where(np.arange(5) < 4, 0.0, -np.inf).astype(np.float32)}


def _empty_row_by_mask() -> Case:
    q, k, v = _qkv()
    mask = np.ones((3, 5), bool)
    mask[1] = False  # query 1 sees no key
    return q, k, v, {"mask": mask}


def _empty_row_by_bias() -> Case:
    q, k, v = _qkv()
    bias = np.zeros((3, 5), np.float32)
    bias[1] = -np.inf
    return q, k, v, {"bias": bias}


def _floor_row() -> Case:
    q, k, v = _qkv()
    q[..., 1, :] = 0.0  # query 1's logits are its bias alone
    bias = np.zeros((3, 5), np.float32)
    bias[1] = np.finfo(np.float32).min  # query 1 sees keys 0-3 at float32's lowest finite logit
    return q, k, v, {"mask": np.arange(5) < 4, "bias": bias}


def _nan_query_row() -> Case:
    q, k, v = _qkv()
    q, k, v = q[None], k[None], v[None]  # rank 4 with dk == dv: torch picks its CPU flash kernel
    q[..., 1, 0] = np.nan  # every logit of query 1 is NaN
    return q, k, v, {}


def _neg_inf_logits_row() -> Case:
    q, k, v = _qkv()
    k = np.abs(k) + 0.1  # k[:, 0] > 0 for every key ...
    q[..., 1, :] = [-np.inf, 0, 0, 0]  # ... so every logit of query 1 is -inf
    return q, k, v, {"mask": np.arange(5) < 4}


def _dv_ne_dk() -> Case:
    return (*_qkv(dv=3), {})


def _float16() -> Case:
    return (*_qkv(dtype=np.float16), {})


def _bfloat16_single() -> Case:
    import ml_dtypes

    return (*_qkv(n=1, m=1, dk=1, dv=1, dtype=ml_dtypes.bfloat16), {})


def _float64() -> Case:
    return (*_qkv(n=5, m=7, dk=8, dv=8, heads=2, dtype=np.float64), {})


def _empty_row_lse() -> Case:
    q, k, v, options = _empty_row_by_mask()
    return q, k, v, {**options, "return_lse": True}


def _bfloat16_lse() -> Case:
    import ml_dtypes

    return (*_qkv(dtype=ml_dtypes.bfloat16), {"return_lse": True})


# -- what "shows" means for each --------------------------------------------------------------

def _any_nan(result, case) -> bool:
    return isinstance(result, np.ndarray) and bool(np.isnan(result).any())


def _row1_is_mean_v(result, case) -> bool:
    v = case[2]
    return isinstance(result, np.ndarray) and np.allclose(result[..., 1, :], v.mean(axis=-2), atol=1e-6)


def _row1_is_nan(result, case) -> bool:
    return isinstance(result, np.ndarray) and bool(np.isnan(result[..., 1, :]).all())


def _row1_is_zero(result, case) -> bool:
    return isinstance(result, np.ndarray) and bool((result[..., 1, :] == 0).all())


def _row1_is_masked_value(result, case) -> bool:
    v = case[2]
    return isinstance(result, np.ndarray) and np.allclose(result[..., 1, :], v[..., 4, :], atol=1e-6)


def _lse_row1_finite(result, case) -> bool:
    # JAX fills masked logits with -0.7 * float32 max = -2.38e38, and the lse of a row of them is that
    return isinstance(result, tuple) and bool(np.isfinite(result[-1][..., 1]).all()
                                              and (result[-1][..., 1] < -1e38).all())


def _lse_in_input_dtype(result, case) -> bool:
    return isinstance(result, tuple) and result[-1].dtype == case[0].dtype


def _refused(result, case) -> bool:
    return isinstance(result, Exception)


def _float32_level_error(result, case) -> bool:
    q, k, v, options = case
    (golden, _), _, _ = golden_and_reference(q, k, v, **options)
    # float64 work is off by ~1e-16 relative; a float32 softmax by ~1e-8 to 1e-7.
    return isinstance(result, np.ndarray) and relative_error(result, golden) > 1e-10


# -- reproducers (framework only) -------------------------------------------------------------

_TORCH = """\
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 4)
"""

_JAX = """\
import jax
import jax.numpy as jnp

attention = jax.jit(jax.nn.dot_product_attention)
q, k, v = (jax.random.normal(jax.random.key(i), (1, s, 1, 4)) for i, s in enumerate((3, 5, 5)))
"""  # JAX layout (B, T, N, H)


# -- gradient cases (function="sdpa_vjp": the result is (dq, dk, dv[, dbias]) for d_out = 1) -----

def _empty_row_and_hidden_key() -> Case:
    q, k, v = _qkv()
    mask = np.ones((3, 5), bool)
    mask[1] = False  # query 1 sees no key
    mask[:, 4] = False  # key 4 is hidden from every query
    return q, k, v, {"mask": mask}


def _hidden_key_gets_dv(result, case) -> bool:
    return isinstance(result, tuple) and bool((result[2][..., 4, :] != 0).any())


def _dk_dv_nan(result, case) -> bool:
    return isinstance(result, tuple) and bool(np.isnan(result[1]).all() and np.isnan(result[2]).all())


# -- mha cases (function="mha") ----------------------------------------------------------------

_TORCH_MHA = """\
import torch

torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
x, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
"""


def run_mha(backend: Backend, case: Case):
    """mha of the case through ``backend``, as NumPy (out, or (out, weights)); an exception is
    returned. ``case`` is (query, key, value, options), options holding ``params`` (MHAParams)."""
    query, key, value, options = case
    conv = {k: backend.asarray(v) if isinstance(v, np.ndarray) else v for k, v in options.items()}
    try:
        result = backend.mha(backend.asarray(query), backend.asarray(key), backend.asarray(value), **conv)
    except Exception as e:  # a refusal is a result here
        return e
    return tuple(map(backend.to_numpy, result)) if isinstance(result, tuple) else backend.to_numpy(result)


def _mha_inputs(**options) -> Case:
    from attnspec.spec.mha import MHAParams

    r = np.random.default_rng(0)
    x, kv = r.standard_normal((2, 3, 8)), r.standard_normal((2, 5, 8))
    params = MHAParams.init(8, 2, seed=0)
    return x, kv, kv.copy(), {"params": params, "num_heads": 2, **options}


def _mha_mask() -> Case:
    return _mha_inputs(mask=np.array([True, True, False, True, False]))


def _mha_padded_batch() -> Case:
    return _mha_inputs(kv_lengths=np.array([0, 5]), return_weights=True)


def _mha_weights() -> Case:
    return _mha_inputs(return_weights=True)


def _spec_mha(case: Case, **changes):
    from attnspec.spec.mha import mha

    query, key, value, options = case
    return mha(query, key, value, **{**options, **changes})


def _attends_to_complement(result, case) -> bool:
    if not isinstance(result, np.ndarray):
        return False
    complement = _spec_mha(case, mask=~case[3]["mask"])
    return np.allclose(result, complement, atol=1e-9) and not np.allclose(result, _spec_mha(case), atol=1e-3)


def _batch0_nan(result, case) -> bool:
    return isinstance(result, tuple) and bool(np.isnan(result[0][0]).all())


def _weights_head_mean(result, case) -> bool:
    if not isinstance(result, tuple):
        return False
    _, per_head = _spec_mha(case)  # (2, H, 3, 5)
    w = result[1]
    return w.shape == per_head.mean(axis=1).shape and np.allclose(w, per_head.mean(axis=1), atol=1e-9)


DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        deviation_id="torch.masked-nonfinite-k",
        tags=frozenset(['masked_nonfinite']),
        backend="torch-native",
        feature="sdpa: NaN/inf in a masked key",
        spec_says="a masked key is absent: its k never reaches any row",
        native_does="a NaN in a key masked from every row makes every output NaN; a masked +inf "
                    "makes NaN the rows where q . k is +inf or NaN (the boolean mask is applied "
                    "by adding -inf, and +inf + -inf = NaN)",
        reproducer=_TORCH + """\
k[:, 4] = float("nan")  # key 4 is masked from every query
out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.arange(5) < 4)
assert out.isnan().all()  # the spec: finite, key 4 is absent
""",
        fixed_by="torch: _drop_hidden_keys zeroes keys no row sees; otherwise the exact path _exact",
        case=_hidden_nan_key,
        shows=_any_nan,
    ),
    Deviation(
        deviation_id="torch.masked-nonfinite-v",
        tags=frozenset(['masked_nonfinite']),
        backend="torch-native",
        feature="sdpa: NaN/inf in a masked value",
        spec_says="a masked key is absent: its v never reaches any row",
        native_does="NaN or inf in the value of a masked key makes every row NaN in those "
                    "columns (weight 0 times NaN or inf is NaN)",
        reproducer=_TORCH + """\
v[:, 4] = float("inf")  # key 4 is masked from every query
out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.arange(5) < 4)
assert out.isnan().all()  # the spec: finite, key 4 is absent
""",
        fixed_by="torch: _drop_hidden_keys zeroes keys no row sees; otherwise the exact path _exact",
        case=_hidden_nan_value,
        shows=_any_nan,
    ),
    Deviation(
        deviation_id="torch.nonfinite-query-row-zeroed",
        backend="torch-native",
        feature="sdpa: NaN or inf in a query",
        spec_says="NaN propagates: a row whose logits are NaN gives NaN",
        native_does="without attn_mask, the CPU flash kernel (chosen for rank-4 inputs with "
                    "dk == dv) returns 0 for a query row whose logits are all NaN (a NaN or inf "
                    "in q), as if the row saw no key; with a mask, or in the math kernel, NaN. Which rows "
                    "zero depends on how the keys split into the CPU's vector lanes: on AVX2 "
                    "float32 with few keys zeroes, float64 gives NaN; AVX-512 zeroed float64 too",
        reproducer=_TORCH + """\
q, k, v = q[None], k[None], v[None]  # rank 4: the flash kernel
q[0, 0, 1, 0] = float("nan")
out = F.scaled_dot_product_attention(q, k, v)
assert (out[0, 0, 1] == 0).all()  # the spec: NaN
""",
        fixed_by="torch: a non-finite q sends the call to the exact path _exact",
        case=_nan_query_row,
        shows=_row1_is_zero,
    ),
    Deviation(
        deviation_id="jax.empty-row-mean-v",
        tags=frozenset(['no_visible_row']),
        backend="jax-native",
        feature="sdpa: a query row with no visible key (mask, lengths)",
        spec_says="output 0",
        native_does="output mean(V) over all keys: masked logits are set to a large finite "
                    "negative, so an all-masked row gets a uniform softmax (also for "
                    "key_value_seq_lengths=0)",
        reproducer=_JAX + """\
mask = jnp.ones((3, 5), bool).at[1].set(False)  # query 1 sees no key
out = attention(q, k, v, mask=mask[None, None])
assert jnp.allclose(out[0, 1], v[0].mean(axis=0), atol=1e-6)  # the spec: 0
""",
        fixed_by="jax: _fused sets rows with no visible key to 0",
        case=_empty_row_by_mask,
        shows=_row1_is_mean_v,
    ),
    Deviation(
        deviation_id="jax.neg-inf-bias-row-nan",
        tags=frozenset(['bias_neg_inf', 'no_visible_row']),
        backend="jax-native",
        feature="sdpa: a row whose bias is -inf for every key",
        spec_says="-inf bias means the key is absent; a row with no key gives 0",
        native_does="NaN (the bias is only added to the logits, and softmax of all -inf is NaN)",
        reproducer=_JAX + """\
bias = jnp.zeros((3, 5)).at[1].set(-jnp.inf)
out = attention(q, k, v, bias=bias[None, None])
assert jnp.isnan(out[0, 1]).all()  # the spec: 0
""",
        fixed_by="jax: _fused folds -inf bias into the mask and sets rows with no visible key to 0",
        case=_empty_row_by_bias,
        shows=_row1_is_nan,
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
        reproducer=_JAX + """\
q = q.at[0, 1].set(0.0)  # query 1's logits are its bias alone
bias = jnp.zeros((3, 5)).at[1].set(jnp.finfo(jnp.float32).min)
mask = jnp.arange(5) < 4  # key 4 is masked from every query
out = attention(q, k, v, bias=bias[None, None], mask=mask[None, None, None])
assert jnp.allclose(out[0, 1], v[0, 4], atol=1e-6)  # the spec: the mean of keys 0-3's values
""",
        fixed_by="jax: a call whose logits may reach half of the fill takes the exact path",
        case=_floor_row,
        shows=_row1_is_masked_value,
    ),
    Deviation(
        deviation_id="jax.masked-nonfinite-v",
        tags=frozenset(['masked_nonfinite']),
        backend="jax-native",
        feature="sdpa: NaN/inf in a masked value",
        spec_says="a masked key is absent: its v never reaches any row",
        native_does="NaN or inf in the value of a masked key makes every row NaN in those "
                    "columns (weight 0 times NaN or inf is NaN); padded queries too",
        reproducer=_JAX + """\
v = v.at[0, 4].set(jnp.nan)  # key 4 is masked from every query
out = attention(q, k, v, mask=(jnp.arange(5) < 4)[None, None, None])
assert jnp.isnan(out).all()  # the spec: finite, key 4 is absent
""",
        fixed_by="jax: _drop_hidden_keys zeroes keys no row sees; otherwise _exact with nonfinite_v",
        case=_hidden_nan_value,
        shows=_any_nan,
    ),
    Deviation(
        deviation_id="jax.masked-nonfinite-k-bias",
        tags=frozenset(['bias_neg_inf', 'masked_nonfinite']),
        backend="jax-native",
        feature="sdpa: NaN in a key hidden by a -inf bias",
        spec_says="-inf bias means the key is absent: its k never reaches any row",
        native_does="every row is NaN: the bias is added to a NaN logit (NaN + -inf = NaN); "
                    "keys hidden by mask, is_causal or lengths do not leak (JAX masks with where)",
        reproducer=_JAX + """\
k = k.at[0, 4].set(jnp.nan)
bias = jnp.where(jnp.arange(5) < 4, 0.0, -jnp.inf)  # key 4 is hidden from every query
out = attention(q, k, v, bias=bias[None, None, None])
assert jnp.isnan(out).all()  # the spec: finite, key 4 is absent
""",
        fixed_by="jax: _fused folds -inf bias entries into JAX's mask, which uses where",
        case=_nan_key_behind_neg_inf_bias,
        shows=_any_nan,
    ),
    Deviation(
        deviation_id="jax.neg-inf-logits-attend-masked-keys",
        backend="jax-native",
        feature="sdpa: a row whose visible logits are all -inf (inf in q or k)",
        spec_says="no visible key has a finite logit, so the row gives 0; masked keys stay absent",
        native_does="the row attends to the masked keys: they are filled with a finite -0.7 * "
                    "float32 max, which beats -inf, so their values come out (NaN without a mask)",
        reproducer=_JAX + """\
k = jnp.abs(k) + 0.1  # every k[..., 0] > 0
q = q.at[0, 1, 0].set(jnp.array([-jnp.inf, 0.0, 0.0, 0.0]))  # query 1: every logit is -inf
out = attention(q, k, v, mask=(jnp.arange(5) < 4)[None, None, None])
assert jnp.allclose(out[0, 1, 0], v[0, 4, 0], atol=1e-6)  # the masked key 4; the spec: 0
""",
        fixed_by="jax: a non-finite q or k sends the call to the exact path _exact",
        case=_neg_inf_logits_row,
        shows=_row1_is_masked_value,
    ),
    Deviation(
        deviation_id="jax.dv-ne-dk-refused",
        tags=frozenset(['dk_ne_dv']),
        backend="jax-native",
        feature="sdpa: value head dim dv != query/key head dim dk",
        spec_says="dv may differ from dk (the output has dv columns)",
        native_does="ValueError: value shape should be [B, S, K, dk]",
        reproducer=_JAX + """\
try:
    attention(q, k, v[..., :3])
except ValueError as e:
    assert "value shape should be" in str(e)
else:
    raise AssertionError("jax accepted dv != dk")
""",
        fixed_by="jax: _fused zero-pads the narrower head dim and slices the output back",
        case=_dv_ne_dk,
        shows=_refused,
    ),
    Deviation(
        deviation_id="jax.float64-softmax-in-float32",
        tags=frozenset(['float64']),
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
        case=_float64,
        shows=_float32_level_error,
    ),
    Deviation(
        deviation_id="jax.float16-jit-cpu-refused",
        tags=frozenset(['float16']),
        backend="jax-native",
        feature="sdpa: float16 inputs, under jax.jit, on CPU",
        spec_says="float16 is a supported dtype",
        native_does="ValueError: The precision 'F16_F16_F32' is not supported by dot_general on "
                    "CPU. JAX asks for that precision and falls back with a try/except that only "
                    "catches errors at trace time, while under jit XLA raises at compile time; "
                    "eager calls work",
        reproducer=_JAX + """\
q, k, v = (x.astype(jnp.float16) for x in (q, k, v))
try:
    attention(q, k, v)
except ValueError as e:
    assert "F16_F16_F32" in str(e)
else:
    raise AssertionError("jit accepted float16 on CPU")
""",
        fixed_by="jax: float16 calls on CPU take the exact path _exact (float32 compute)",
        case=_float16,
        shows=_refused,
    ),
    Deviation(
        deviation_id="jax.bfloat16-tiny-dot-cpu-refused",
        tags=frozenset(['bfloat16']),
        backend="jax-native",
        feature="sdpa: bfloat16 inputs of size 1 (n = m = d = 1), jit, CPU, 'highest' precision",
        spec_says="bfloat16 is a supported dtype, at every size",
        native_does="JaxRuntimeError: Algorithm not supported by the ElementalIrEmitter: "
                    "ALG_DOT_BF16_BF16_F32. With jax_default_matmul_precision='highest' (the "
                    "conformance numerics policy), XLA:CPU lowers degenerate dots through an "
                    "emitter without that algorithm; larger bfloat16 shapes compile",
        reproducer=_JAX + """\
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
        case=_bfloat16_single,
        shows=_refused,
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
        reproducer=_JAX + """\
mask = jnp.ones((3, 5), bool).at[1].set(False)  # query 1 sees no key
out, lse = jax.nn.dot_product_attention(q, k, v, mask=mask[None, None], return_residual=True)
assert lse.shape == (1, 3, 1) and jnp.isfinite(lse[0, 1]).all() and lse[0, 1, 0] < -1e38  # the spec: -inf
""",
        fixed_by="jax: _variants computes the lse on the exact path, -inf for a row with no visible key",
        case=_empty_row_lse,
        shows=_lse_row1_finite,
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
        reproducer=_JAX + """\
q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
out, lse = jax.nn.dot_product_attention(q, k, v, return_residual=True)
assert lse.dtype == jnp.bfloat16  # the spec: float32
""",
        fixed_by="jax: _variants computes the lse on the exact path, in float32 for bfloat16 inputs",
        case=_bfloat16_lse,
        shows=_lse_in_input_dtype,
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
        reproducer=_JAX + """\
mask = jnp.ones((3, 5), bool).at[1].set(False).at[:, 4].set(False)  # query 1 sees nothing
out, pullback = jax.vjp(lambda v: attention(q, k, v, mask=mask[None, None]), v)
(dv,) = pullback(jnp.ones_like(out))
assert (dv[0, 4] != 0).all()  # key 4 is hidden from every query; the spec: dv = 0
""",
        fixed_by="jax: _fused sets rows with no visible key to 0 with where, which stops their gradient",
        case=_empty_row_and_hidden_key,
        shows=_hidden_key_gets_dv,
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
        reproducer=_JAX + """\
bias = jnp.zeros((3, 5)).at[1].set(-jnp.inf)  # query 1: every key absent
out, pullback = jax.vjp(lambda k, v: attention(q, k, v, bias=bias[None, None]), k, v)
dk, dv = pullback(jnp.ones_like(out))
assert jnp.isnan(dk).all() and jnp.isnan(dv).all()  # the spec: finite
""",
        fixed_by="jax: _fused folds -inf bias into the mask and zeroes rows with no visible key with "
                 "where, so no NaN is formed forward or backward",
        case=_empty_row_by_bias,
        shows=_dk_dv_nan,
    ),
    # -- torch.nn.MultiheadAttention (function="mha": the case is (query, key, value, options) with
    # params and num_heads in options; the result is (out, weights) from `run_mha`) --
    Deviation(
        deviation_id="torch.mha-mask-polarity",
        function="mha",
        tags=frozenset(["mha", "mask"]),
        backend="torch-native",
        feature="mha: a boolean mask, passed to torch.nn.MultiheadAttention as attn_mask",
        spec_says="mask True = may attend (as in sdpa and torch SDPA's attn_mask)",
        native_does="a boolean attn_mask (and key_padding_mask) of nn.MultiheadAttention is True = "
                    "blocked, so the spec's mask passed as it is attends to exactly the keys it "
                    "hides (a row it allows fully is blocked fully)",
        reproducer=_TORCH_MHA + """\
allowed = torch.tensor([True, True, False, True, False]).expand(3, 5)  # True = may attend
out, _ = mha(x, kv, kv, attn_mask=allowed, need_weights=False)
hidden_keys_only, _ = mha(x, kv[:, [2, 4]], kv[:, [2, 4]], need_weights=False)
assert torch.allclose(out, hidden_keys_only, atol=1e-6)  # the spec: attend to keys 0, 1 and 3
""",
        fixed_by="torch: mha hands the mask to self.sdpa, which reads True = may attend",
        case=_mha_mask,
        shows=_attends_to_complement,
    ),
    Deviation(
        deviation_id="torch.mha-empty-row-nan",
        function="mha",
        tags=frozenset(["mha", "no_visible_row", "return_weights"]),
        backend="torch-native",
        feature="mha: a query row with no visible key, with need_weights=True (torch's default)",
        spec_says="attention output 0, so the layer's output is b_o; the row's weights are 0",
        native_does="NaN output and NaN weights for the row (all keys padded by key_padding_mask, "
                    "or blocked by a boolean or -inf float attn_mask); need_weights=False takes "
                    "its SDPA path, which gives b_o as the spec does",
        reproducer=_TORCH_MHA + """\
padding = torch.tensor([[True] * 5, [False] * 5])  # batch 0: every key is padding
out, w = mha(x, kv, kv, key_padding_mask=padding)  # need_weights=True by default
assert out[0].isnan().all() and w[0].isnan().all()  # the spec: out_proj.bias, weights 0
out, _ = mha(x, kv, kv, key_padding_mask=padding, need_weights=False)
assert torch.allclose(out[0], mha.out_proj.bias.expand(3, 8))  # its SDPA path agrees with the spec
""",
        fixed_by="torch: mha calls self.sdpa, whose rows with no visible key are 0, so out = b_o",
        case=_mha_padded_batch,
        shows=_batch0_nan,
    ),
    Deviation(
        deviation_id="torch.mha-weights-head-averaged",
        function="mha",
        tags=frozenset(["mha", "return_weights"]),
        backend="torch-native",
        feature="mha: attention weights (need_weights=True)",
        spec_says="weights per head, (..., H, n, m)",
        native_does="weights averaged over the heads, (N, n, m): average_attn_weights=True is the "
                    "default; average_attn_weights=False gives (N, H, n, m)",
        reproducer=_TORCH_MHA + """\
_, w = mha(x, kv, kv)
_, per_head = mha(x, kv, kv, average_attn_weights=False)
assert w.shape == (2, 3, 5) and torch.allclose(w, per_head.mean(dim=1))  # the spec: (2, 2, 3, 5)
""",
        fixed_by="torch: mha returns self.sdpa's per-head weights",
        case=_mha_weights,
        shows=_weights_head_mean,
    ),
)
