"""The minimal cases of the built-in deviations (`attnspec.backends.deviations`), as NumPy,
and what "shows" means for each: ``shows(result, case)`` is True when the backend's result (or
the exception it raised) deviates as declared. A plugin may reuse them for its own entries."""

from __future__ import annotations

import numpy as np

from attnspec.backends.compare import golden_and_reference, relative_error
from attnspec.backends.deviation_probe import Case

# -- cases ----------------------------------------------------------------------------------


def qkv(n=3, m=5, dk=4, dv=4, heads=1, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    return tuple(r.standard_normal(s).astype(dtype) for s in ((heads, n, dk), (heads, m, dk), (heads, m, dv)))


def hidden_nan_key() -> Case:
    q, k, v = qkv()
    k[..., 4, :] = np.nan  # key 4 is masked from every query
    return q, k, v, {"mask": np.arange(5) < 4}


def mask_batch_beyond_qk() -> Case:
    """v and the mask carry a batch axis of 2 that q and k do not have."""
    r = np.random.default_rng(0)
    q, k, v = (r.standard_normal(s).astype(np.float32) for s in ((1, 1, 3, 4), (1, 1, 5, 4), (2, 1, 5, 4)))
    return q, k, v, {"mask": np.ones((2, 1, 3, 5), bool)}


def hidden_nan_value() -> Case:
    q, k, v = qkv()
    v[..., 4, :] = np.nan
    return q, k, v, {"mask": np.arange(5) < 4}


def nan_key_behind_neg_inf_bias() -> Case:
    q, k, v = qkv()
    k[..., 4, :] = np.nan
    return q, k, v, {"bias": np.where(np.arange(5) < 4, 0.0, -np.inf).astype(np.float32)}


def with_empty_row(q, k, v, *, by: str) -> Case:
    """``(q, k, v)`` with query 1 seeing no key, hidden ``by`` a boolean "mask" or a -inf "bias"
    row (in q's dtype). The atlas asks the same question (`attnspec.backends.atlas.questions`)."""
    sees = np.ones((q.shape[-2], k.shape[-2]), bool)
    sees[1] = False  # query 1 sees no key
    return q, k, v, {"mask": sees} if by == "mask" else {"bias": np.where(sees, 0.0, -np.inf).astype(q.dtype)}


def empty_row_by_mask() -> Case:
    return with_empty_row(*qkv(), by="mask")


def empty_row_by_bias() -> Case:
    return with_empty_row(*qkv(), by="bias")


def floor_row() -> Case:
    q, k, v = qkv()
    q[..., 1, :] = 0.0  # query 1's logits are its bias alone
    bias = np.zeros((3, 5), np.float32)
    bias[1] = np.finfo(np.float32).min  # query 1 sees keys 0-3 at float32's lowest finite logit
    return q, k, v, {"mask": np.arange(5) < 4, "bias": bias}


def nan_query_row() -> Case:
    q, k, v = qkv()
    q, k, v = q[None], k[None], v[None]  # rank 4 with dk == dv: torch picks its CPU flash kernel
    q[..., 1, 0] = np.nan  # every logit of query 1 is NaN
    return q, k, v, {}


def neg_inf_logits_row() -> Case:
    q, k, v = qkv()
    k = np.abs(k) + 0.1  # k[:, 0] > 0 for every key ...
    q[..., 1, :] = [-np.inf, 0, 0, 0]  # ... so every logit of query 1 is -inf
    return q, k, v, {"mask": np.arange(5) < 4}


def dv_ne_dk() -> Case:
    return (*qkv(dv=3), {})


def float16() -> Case:
    return (*qkv(dtype=np.float16), {})


def bfloat16_single() -> Case:
    import ml_dtypes

    return (*qkv(n=1, m=1, dk=1, dv=1, dtype=ml_dtypes.bfloat16), {})


def float64() -> Case:
    return (*qkv(n=5, m=7, dk=8, dv=8, heads=2, dtype=np.float64), {})


def empty_row_lse() -> Case:
    q, k, v, options = empty_row_by_mask()
    return q, k, v, {**options, "return_lse": True}


def bfloat16_lse() -> Case:
    import ml_dtypes

    return (*qkv(dtype=ml_dtypes.bfloat16), {"return_lse": True})


# -- what "shows" means for each --------------------------------------------------------------


def any_nan(result, case) -> bool:
    return isinstance(result, np.ndarray) and bool(np.isnan(result).any())


def row1_is_mean_v(result, case) -> bool:
    v = case[2]
    return isinstance(result, np.ndarray) and np.allclose(result[..., 1, :], v.mean(axis=-2), atol=1e-6)


def row1_is_nan(result, case) -> bool:
    return isinstance(result, np.ndarray) and bool(np.isnan(result[..., 1, :]).all())


def row1_is_zero(result, case) -> bool:
    return isinstance(result, np.ndarray) and bool((result[..., 1, :] == 0).all())


def row1_is_masked_value(result, case) -> bool:
    v = case[2]
    return isinstance(result, np.ndarray) and np.allclose(result[..., 1, :], v[..., 4, :], atol=1e-6)


def lse_row1_finite(result, case) -> bool:
    # JAX fills masked logits with -0.7 * float32 max = -2.38e38, and the lse of a row of them is that
    return isinstance(result, tuple) and bool(
        np.isfinite(result[-1][..., 1]).all() and (result[-1][..., 1] < -1e38).all()
    )


def lse_in_input_dtype(result, case) -> bool:
    return isinstance(result, tuple) and result[-1].dtype == case[0].dtype


def refused(result, case) -> bool:
    return isinstance(result, Exception)


def float32_level_error(result, case) -> bool:
    q, k, v, options = case
    (golden, _), _, _ = golden_and_reference(q, k, v, **options)
    # float64 work is off by ~1e-16 relative; a float32 softmax by ~1e-8 to 1e-7.
    return isinstance(result, np.ndarray) and relative_error(result, golden) > 1e-10


# -- gradient cases (function="sdpa_vjp": the result is (dq, dk, dv[, dbias]) for d_out = 1) -----


def empty_row_and_hidden_key() -> Case:
    q, k, v = qkv()
    mask = np.ones((3, 5), bool)
    mask[1] = False  # query 1 sees no key
    mask[:, 4] = False  # key 4 is hidden from every query
    return q, k, v, {"mask": mask}


def hidden_key_gets_dv(result, case) -> bool:
    return isinstance(result, tuple) and bool((result[2][..., 4, :] != 0).any())


def dk_dv_nan(result, case) -> bool:
    return isinstance(result, tuple) and bool(np.isnan(result[1]).all() and np.isnan(result[2]).all())


# -- mha cases (function="mha": (query, key, value, options), params in options) -------------


def mha_inputs(**options) -> Case:
    from attnspec.spec.mha import MHAParams

    r = np.random.default_rng(0)
    x, kv = r.standard_normal((2, 3, 8)), r.standard_normal((2, 5, 8))
    params = MHAParams.init(8, 2, seed=0)
    return x, kv, kv.copy(), {"params": params, "num_heads": 2, **options}


def mha_mask() -> Case:
    return mha_inputs(mask=np.array([True, True, False, True, False]))


def mha_padded_batch() -> Case:
    return mha_inputs(kv_lengths=np.array([0, 5]), return_weights=True)


def mha_weights() -> Case:
    return mha_inputs(return_weights=True)


def spec_mha(case: Case, **changes):
    from attnspec.spec.mha import mha

    query, key, value, options = case
    return mha(query, key, value, **{**options, **changes})


def attends_to_complement(result, case) -> bool:
    if not isinstance(result, np.ndarray):
        return False
    complement = spec_mha(case, mask=~case[3]["mask"])
    return np.allclose(result, complement, atol=1e-9) and not np.allclose(result, spec_mha(case), atol=1e-3)


def batch0_nan(result, case) -> bool:
    return isinstance(result, tuple) and bool(np.isnan(result[0][0]).all())


def weights_head_mean(result, case) -> bool:
    if not isinstance(result, tuple):
        return False
    _, per_head = spec_mha(case)  # (2, H, 3, 5)
    w = result[1]
    return w.shape == per_head.mean(axis=1).shape and np.allclose(w, per_head.mean(axis=1), atol=1e-9)
