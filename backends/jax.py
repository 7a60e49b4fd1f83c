"""JAX, made conformant: `jax.nn.dot_product_attention` under `jax.jit`, plus fix-ups.

Shape letters as in `attnspec.spec.sdpa`; JAX's own layout is (B, T, N, H) = (batch, length,
heads, head dim), so leading batch dims are broadcast and flattened into B, and heads and length
swap places, at the boundary. Constructing a JAX backend turns on ``jax_enable_x64``
(process-wide): without it JAX silently stores float64 inputs as float32.

Native options are used where they mean what the spec means: ``is_causal`` (upper-left),
``local_window_size`` (upper-left anchored, probed: query i sees [i - left, i + right]),
``query_seq_lengths`` and ``key_value_seq_lengths``. Lower-right causal and its window, an
explicit mask and the -inf entries of a bias go in as one boolean ``mask``. Fix-ups, each naming
the deviation of ``jax-native`` it repairs:

* rows with no visible key are set to 0 (``jax.empty-row-mean-v``, ``jax.neg-inf-bias-row-nan``);
* dv != dk: the narrower of (q, k) and v is zero-padded to the wider head dim and the output
  sliced back (``jax.dv-ne-dk-refused``). Zero columns add exact zeros to q . k and produce
  output columns that are dropped, so the result is unchanged;
* -inf bias entries go into ``mask`` too, since JAX replaces masked logits with ``where`` but
  only adds the bias (``jax.masked-nonfinite-k-bias``);
* NaN/inf in k or v: keys no row can see are zeroed; if non-finite values remain, the call
  takes the exact path (``jax.masked-nonfinite-v``). So does a non-finite q: inf in q or k can
  make every visible logit -inf, and JAX's finite fill for masked keys then wins the softmax
  (``jax.neg-inf-logits-attend-masked-keys``). Checking reads three flags back (a sync);
* float64 inputs take the exact path, because JAX computes the softmax in float32
  (``jax.float64-softmax-in-float32``);
* float16 inputs on CPU take the exact path, because XLA:CPU cannot compile the float16 matmul
  precision that `jax.nn.dot_product_attention` asks for under jit (``jax.float16-jit-cpu-refused``).

The exact path is `attnspec.backends._xp_core` with ``jax.numpy`` as its namespace (JAX implements
the array API standard), also under `jax.jit`; ``return_weights=True`` uses it too.

Inside the caller's own `jax.jit` the finiteness flags cannot be read back, so the choice is made
on device: `lax.cond` runs the fused kernel for all-finite inputs and the exact path (with the
full non-finite treatment) otherwise. ``q_lengths``/``kv_lengths`` must then be concrete (NumPy
or closed-over arrays): they shape the plan.
"""

from __future__ import annotations

import dataclasses
import math
import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from attnspec.backends import _lsh_xp, _xp_core
from attnspec.backends import _vjp
from attnspec.backends import _mha
from attnspec.backends._base import VARIANT_FEATURES, Backend, MHAArrays, variant_features
from attnspec.backends._common import (
    alibi_distance,
    compute_dtype_name,
    fold_per_sequence,
    is_empty,
    variant_keywords,
    lengths_column,
    refuse,
    static_plan,
    to_reference,
    validate,
    visibility,
    with_mask_and_bias,
)
from attnspec.spec._validate import ArrayInfo, SDPAPlan

__all__ = ["JaxBackend"]


def use_compilation_cache() -> str | None:
    """Turn on JAX's persistent compilation cache, unless the process already chose one.

    XLA compiles every new shape, and compiling is most of what the conformance suite spends on
    JAX; with the cache a second run reuses the first's executables (measured: the dev profile's
    JAX run takes about a third of the time warm). The directory is ``ATTNSPEC_JAX_CACHE``, or
    ``$XDG_CACHE_HOME/attnspec/jax`` (default ``~/.cache/attnspec/jax``); ``ATTNSPEC_JAX_CACHE=off``
    leaves JAX as it is. Returns the directory in use, or None.
    """
    chosen = os.environ.get("ATTNSPEC_JAX_CACHE", "")
    if chosen == "off":
        return jax.config.jax_compilation_cache_dir
    if jax.config.jax_compilation_cache_dir:  # the user's own setting wins
        return jax.config.jax_compilation_cache_dir
    if not chosen:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(base, "attnspec", "jax")
    jax.config.update("jax_compilation_cache_dir", chosen)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # the suite's are all small
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return chosen


class JaxArrays(Backend):
    """Array hooks shared by the ``jax`` and ``jax-native`` backends."""

    def __init__(self, x64: bool = True) -> None:
        if x64:  # without it JAX has no float64 at all
            jax.config.update("jax_enable_x64", True)
        use_compilation_cache()
        self._last = None  # the latest result, for synchronize()

    def devices(self) -> list[str]:
        return ["cpu"] + [f"{d.platform}:{d.id}" for d in jax.devices() if d.platform != "cpu"]

    def _device(self, name: str | None):
        if name is None or name == "cpu":
            return jax.devices("cpu")[0]
        for d in jax.devices():
            if f"{d.platform}:{d.id}" == name:
                return d
        raise ValueError(f"{self.name}: no device {name!r}; devices are {self.devices()}")

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> jax.Array:
        return jax.device_put(np.array(to_reference(x, dtype)), self._device(device))

    def to_numpy(self, x: jax.Array) -> np.ndarray:
        return np.asarray(x)

    def device_of(self, x: jax.Array) -> str:
        return device_name(x) or "traced"  # a tracer (inside the caller's jit) has no device yet

    def synchronize(self) -> None:
        # JAX dispatches asynchronously and has no global barrier for computations: wait on the
        # latest result instead.
        if self._last is not None:
            jax.block_until_ready(self._last)

    def numerics_policy(self) -> dict[str, object]:
        jax.config.update("jax_default_matmul_precision", "highest")
        return {
            "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
            "jax_enable_x64": jax.config.jax_enable_x64,
        }

    def _info(self, fn: str, name: str, x: object) -> ArrayInfo:
        if not isinstance(x, jax.Array):
            raise refuse(fn, name, x, "jax.Array")
        return ArrayInfo(tuple(x.shape), self.dtype_name(x))

    def _plan(self, fn, q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths,
              **variants) -> SDPAPlan:
        return validate(fn, self._info, _lengths_to_numpy, q, k, v, mask, bias, causal, window,
                        scale, q_lengths, kv_lengths, **variants)

    # -- gradients: autodiff through this backend's own forward (attnspec.backends._vjp) --------
    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.implements = _vjp.with_forwards(cls.implements)  # no vjp without its forward

    def supports(self, feature: str, **case) -> list[str]:
        return _vjp.refusals(self, feature, super().supports(feature, **case))

    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, causal=None, window=None,
                 scale=None, q_lengths=None, kv_lengths=None, softcap=None, alibi_slopes=None,
                 sinks=None, q_segment_ids=None, kv_segment_ids=None, dropout_mask=None,
                 dropout_p=None):
        return _vjp.sdpa_vjp(self, "jax", q, k, v, d_out, mask=mask, bias=bias, causal=causal,
                             window=window, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
                             **variant_keywords(locals()))

    def mha_vjp(self, query, key, value, params, d_out, *, num_heads, num_kv_heads=None, mask=None,
                bias=None, causal=None, window=None, scale=None, q_lengths=None, kv_lengths=None,
                softcap=None, alibi_slopes=None, sinks=None, q_segment_ids=None, kv_segment_ids=None,
                dropout_mask=None, dropout_p=None):
        return _vjp.mha_vjp(self, "jax", query, key, value, params, d_out, num_heads=num_heads,
                            num_kv_heads=num_kv_heads, mask=mask, bias=bias, causal=causal,
                            window=window, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
                            **variant_keywords(locals()))

    def lsh_attention_vjp(self, x, v, d_out, *, rotations, chunk_length, causal=False, kv_lengths=None,
                          dedup=False, scale=None):
        return _vjp.lsh_attention_vjp(self, "jax", x, v, d_out, rotations=rotations,
                                      chunk_length=chunk_length, causal=causal,
                                      kv_lengths=kv_lengths, dedup=dedup, scale=scale)


def _lengths_to_numpy(x):
    return np.asarray(x) if isinstance(x, jax.Array) else x


def device_name(x) -> str | None:
    """The name `JaxArrays.asarray` takes for the device of ``x`` (None for a traced array)."""
    try:
        (d,) = x.devices()
    except Exception:  # a tracer has no concrete device
        return None
    return "cpu" if d.platform == "cpu" else f"{d.platform}:{d.id}"


def _register_mha_arrays() -> None:
    """Make `MHAArrays` a pytree (its eight fields are children; None is an empty subtree), so
    ``jax.grad`` differentiates with respect to a whole parameter set."""
    try:
        jax.tree_util.register_dataclass(
            MHAArrays, data_fields=[f.name for f in dataclasses.fields(MHAArrays)], meta_fields=[])
    except ValueError:  # already registered (this module was imported twice)
        pass


_register_mha_arrays()


def lengths_arrays(p: SDPAPlan):
    """q_lengths, kv_lengths as JAX arrays (*batch, 1, 1, 1), or None; traced, never static."""
    return tuple(None if a is None else jnp.asarray(a) for a in lengths_column(p))


def with_head(x):
    return x[None] if x.ndim == 2 else x  # (L, d) -> (1, L, d): one head


def full_visibility(p: SDPAPlan, mask, bias, q_len, kv_len):
    """Every rule of the call as one bool array broadcasting to (*batch, Hq, n, m), or None."""
    vis = visibility(p.n, p.m, p.causal, p.window, q_len, kv_len, jnp.arange)
    return with_mask_and_bias(vis, mask, bias, -math.inf)


# -- the boundary: spec layout (*batch, H, L, d) <-> JAX layout (B, L, H, d) -------------------

def batch_size(p: SDPAPlan) -> int:
    return math.prod(p.batch)


def to_btnh(p: SDPAPlan, x, heads: int, length: int):
    x = jnp.broadcast_to(with_head(x), (*p.batch, heads, length, x.shape[-1]))  # (*batch, H, L, d)
    x = jnp.reshape(x, (batch_size(p), heads, length, x.shape[-1]))  # (B, H, L, d)
    return jnp.transpose(x, (0, 2, 1, 3))  # (B, L, H, d)


def from_btnh(p: SDPAPlan, out):
    out = jnp.transpose(out, (0, 2, 1, 3))  # (B, Hq, n, dv)
    return jnp.reshape(out, (*p.batch, p.hq, p.n, p.dv))  # (*batch, Hq, n, dv)


def to_bnts(p: SDPAPlan, x):
    """A mask or bias broadcasting to (*batch, Hq, n, m) -> (B, Hq or 1, n, m), as JAX wants."""
    heads = x.shape[-3] if x.ndim >= 3 else 1
    x = jnp.broadcast_to(x, (*p.batch, heads, p.n, p.m))  # (*batch, Hq or 1, n, m)
    return jnp.reshape(x, (batch_size(p), heads, p.n, p.m))  # (B, Hq or 1, n, m)


def seq_lengths(p: SDPAPlan, lengths):
    return None if lengths is None else jnp.reshape(lengths, (batch_size(p),)).astype(jnp.int32)  # (B,)


def native_call(p: SDPAPlan, q, k, v, mask, bias, q_len, kv_len, return_residual: bool = False):
    """`jax.nn.dot_product_attention` with each spec option as its closest native option.

    Returns (B, n, Hq, dv_or_dk), and with ``return_residual`` also JAX's logsumexp (B, n, Hq).
    ``mask`` and ``bias`` are in the spec's layout; lower-right causal (and a window anchored on
    it) has no native option, so it joins ``mask``.
    """
    upper = p.causal != "lower_right"
    explicit = None if upper else visibility(p.n, p.m, p.causal, p.window, None, None, jnp.arange)
    explicit = with_mask_and_bias(explicit, mask, None, None)
    return jax.nn.dot_product_attention(
        to_btnh(p, q, p.hq, p.n),
        to_btnh(p, k, p.hkv, p.m),
        to_btnh(p, v, p.hkv, p.m),
        bias=None if bias is None else to_bnts(p, bias),
        mask=None if explicit is None else to_bnts(p, explicit),
        scale=p.scale,
        is_causal=p.causal == "upper_left",
        query_seq_lengths=seq_lengths(p, q_len),
        key_value_seq_lengths=seq_lengths(p, kv_len),
        local_window_size=p.window if upper else None,
        return_residual=return_residual,
    )


# -- the conformant adapter -----------------------------------------------------------------

@partial(jax.jit, static_argnames=("p",))
def _fused(q, k, v, mask, bias, q_len, kv_len, *, p: SDPAPlan):
    vis = full_visibility(p, mask, bias, q_len, kv_len)
    if p.dv < p.dk:  # fixes jax.dv-ne-dk-refused: zero columns of v give dropped output columns
        v = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, p.dk - p.dv)])
    elif p.dv > p.dk:  # ... and zero columns of q and k add exact zeros to q . k
        q = jnp.pad(q, [(0, 0)] * (q.ndim - 1) + [(0, p.dv - p.dk)])
        k = jnp.pad(k, [(0, 0)] * (k.ndim - 1) + [(0, p.dv - p.dk)])
    # fixes jax.masked-nonfinite-k-bias: -inf bias entries go through JAX's where-masking
    mask = with_mask_and_bias(None, mask, bias, -math.inf)
    out = native_call(p, q, k, v, mask, bias, q_len, kv_len)  # (B, n, Hq, max(dk, dv))
    out = from_btnh(p, out[..., : p.dv])  # (*batch, Hq, n, dv)
    if vis is not None:
        # fixes jax.empty-row-mean-v and jax.neg-inf-bias-row-nan: no visible key -> 0
        # (a where, so the row's gradient stops here too: fixes jax.empty-row-grad-into-masked-values
        # and jax.neg-inf-bias-row-nan-grads)
        out = jnp.where(jnp.any(vis, axis=-1, keepdims=True), out, 0)
    return jnp.reshape(out, p.out_shape)


@partial(jax.jit, static_argnames=("p", "nonfinite_v", "want_weights"))
def _exact(q, k, v, mask, bias, q_len, kv_len, *, p: SDPAPlan, nonfinite_v: bool, want_weights: bool):
    vis = full_visibility(p, mask, bias, q_len, kv_len)
    return _xp_core.attention(jnp, p, with_head(q), with_head(k), with_head(v), vis, bias,
                              nonfinite_v=nonfinite_v, want_weights=want_weights)[:2]


@partial(jax.jit, static_argnames=("p", "nonfinite_v", "want_weights"))
def _exact_variants(q, k, v, mask, bias, q_len, kv_len, alibi, sinks, keep, *, p: SDPAPlan,
                    nonfinite_v: bool, want_weights: bool):
    vis = full_visibility(p, mask, bias, q_len, kv_len)
    return _xp_core.attention(jnp, p, with_head(q), with_head(k), with_head(v), vis, bias,
                              nonfinite_v=nonfinite_v, want_weights=want_weights, alibi=alibi,
                              sinks=sinks, keep=keep)


@partial(jax.jit, static_argnames=("p",))
def _drop_hidden_keys(k, v, mask, bias, q_len, kv_len, *, p: SDPAPlan):
    """Zero the keys (k and v) that no query row of any head in their group can see."""
    vis = full_visibility(p, mask, bias, q_len, kv_len)
    seen = jnp.any(jnp.broadcast_to(vis, (*p.batch, p.hq, p.n, p.m)), axis=-2)  # (*batch, Hq, m)
    seen = jnp.any(jnp.reshape(seen, (*p.batch, p.hkv, p.group, p.m)), axis=-2)  # (*batch, Hkv, m)
    seen = seen[..., None]  # (*batch, Hkv, m, 1)
    return jnp.where(seen, with_head(k), 0), jnp.where(seen, with_head(v), 0)


def _platform(x) -> str:
    """x's platform; a tracer (under jax.vjp, as sdpa_vjp runs it) has none: the default one."""
    try:
        return x.device.platform
    except AttributeError:
        return jax.default_backend()


@jax.jit
def _finite_flags(q, k, v):
    return jnp.stack([jnp.isfinite(x).all() for x in (q, k, v)])  # one compile, one transfer


def _on_host(x) -> bool:
    """Whether NumPy may read ``x`` in place: a concrete CPU array. Not a tracer, even one that
    would read as a value (jax.vjp's): a path picked from its values is not the traced path."""
    return not isinstance(x, jax.core.Tracer) and _platform(x) == "cpu"


def _finite(q, k, v) -> list[bool]:
    """Whether each of q, k, v is all finite. Raises TracerArrayConversionError under a trace.

    On CPU the arrays are read in place with NumPy: a jitted check would compile once per new
    shape, and the conformance suite, drawing many shapes, spent a share of its JAX time there.
    """
    if all(_on_host(x) for x in (q, k, v)):
        return [bool(np.isfinite(np.asarray(x)).all()) for x in (q, k, v)]
    return np.asarray(_finite_flags(q, k, v)).tolist()


def _fused_ok(p: SDPAPlan, q) -> bool:
    """Whether the fused kernel can give the spec's answer for finite inputs of this dtype."""
    return not (
        p.dtype == "float64"  # fixes jax.float64-softmax-in-float32
        # fixes jax.float16-jit-cpu-refused and jax.bfloat16-tiny-dot-cpu-refused
        or (p.dtype in ("float16", "bfloat16") and _platform(q) == "cpu")
    )


def _traced(q, k, v, mask, bias, q_len, kv_len, *, p: SDPAPlan, want_weights: bool, exact: bool):
    """sdpa inside the caller's trace, where finiteness cannot be read back to choose a path.

    The exact path with the full non-finite treatment is right for any input; when the fused
    kernel may be used, ``lax.cond`` picks it on device for all-finite inputs (both branches are
    compiled, one runs).
    """
    def exact_path():
        out, w = _exact(q, k, v, mask, bias, q_len, kv_len, p=p, nonfinite_v=True, want_weights=want_weights)
        return (out, w) if want_weights else out

    if exact:
        return exact_path()
    return jax.lax.cond(_finite_flags(q, k, v).all(),
                        lambda: _fused(q, k, v, mask, bias, q_len, kv_len, p=p), exact_path)


def _nonfinite(v) -> bool:
    """Whether v holds NaN/inf; True (the treatment that is right for any v) under jax.jit."""
    try:
        if _on_host(v):
            return not bool(np.isfinite(np.asarray(v)).all())  # no compile per shape (see _finite)
        return not bool(jnp.all(jnp.isfinite(v)))
    except (jax.errors.TracerBoolConversionError, jax.errors.TracerArrayConversionError):
        return True


class JaxBackend(JaxArrays):
    """jax.nn.dot_product_attention with the spec's semantics; exact jnp path where it cannot."""

    name = "jax"
    variants = frozenset(VARIANT_FEATURES)

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
             q_lengths=None, kv_lengths=None, softcap=None, alibi_slopes=None, sinks=None,
             q_segment_ids=None, kv_segment_ids=None, dropout_mask=None, dropout_p=None,
             return_weights=False, return_lse=False):
        variants = variant_keywords(locals())
        p = self._plan("jax.sdpa", q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths,
                       **variants)
        if is_empty(p):
            # a tracer (mha_vjp's jax.vjp through an empty mha) has no device: the default one
            device = None if isinstance(q, jax.core.Tracer) else q.device
            result = _xp_core.empty(jnp, p, q.dtype, device, return_weights, sinks)
            self._last = result
            return result
        if variant_features({**variants, "causal": causal}):
            result = self._variants(p, q, k, v, mask, bias, return_weights, alibi_slopes, sinks,
                                    q_segment_ids, kv_segment_ids, dropout_mask)
            self._last = result
            return result
        sp = static_plan(p)
        q_len, kv_len = lengths_arrays(p)
        has_rules = p.causal or p.window or mask is not None or bias is not None or q_len is not None \
            or kv_len is not None
        try:
            finite_q, finite_k, finite_v = _finite(q, k, v)
        except jax.errors.TracerArrayConversionError:
            # traced by the caller's jax.jit: the flags are not known yet, so decide on device
            result = _traced(q, k, v, mask, bias, q_len, kv_len, p=sp, want_weights=return_weights,
                             exact=return_weights or not _fused_ok(p, q))
            self._last = result
            return result
        if not (finite_k and finite_v) and has_rules:
            # fixes jax.masked-nonfinite-v (and masked keys generally) where it can stay fused
            k, v = _drop_hidden_keys(k, v, mask, bias, q_len, kv_len, p=sp)
            finite_q, finite_k, finite_v = _finite(q, k, v)
        exact = (
            return_weights
            # fixes jax.masked-nonfinite-v and jax.neg-inf-logits-attend-masked-keys
            or not (finite_q and finite_k and finite_v)
            or not _fused_ok(p, q)
        )
        if exact:
            result = _exact(q, k, v, mask, bias, q_len, kv_len, p=sp, nonfinite_v=not finite_v,
                            want_weights=return_weights)
            result = result if return_weights else result[0]
        else:
            result = _fused(q, k, v, mask, bias, q_len, kv_len, p=sp)
        self._last = result
        return result

    def _variants(self, p, q, k, v, mask, bias, want_weights, alibi_slopes, sinks, q_segment_ids,
                  kv_segment_ids, keep):
        """The variants of issue #15, all on the exact path: jax.nn has none of them (no softcap,
        ALiBi, sinks, segment ids or lengths-aligned causal), and its logsumexp (return_residual)
        is not the spec's. The segment ids are read back (a sync; concrete ids only) for the
        per-sequence anchors."""
        # fixes jax.lse-empty-row-finite and jax.lse-in-input-dtype: the lse comes from the exact
        # path, -inf for a row with no visible key and float32 (float64 for float64 inputs)
        q_ids, kv_ids = _lengths_to_numpy(q_segment_ids), _lengths_to_numpy(kv_segment_ids)
        rules, per_sequence = fold_per_sequence(p, q_ids, kv_ids)
        if per_sequence is not None:
            seq = jnp.asarray(per_sequence)
            mask = seq if mask is None else mask & seq
        alibi = None
        if alibi_slopes is not None:  # -slope[h] * |i' - j|, i' from the call's own alignment
            ct = compute_dtype_name(p.dtype)  # as the golden: slopes in the compute dtype
            dist = jnp.asarray(alibi_distance(p, q_ids, kv_ids), dtype=ct)  # (..., 1, n, m)
            alibi = -alibi_slopes.astype(ct)[..., :, None, None] * dist  # (..., Hq, n, m)
        q_len, kv_len = lengths_arrays(rules)
        out, weights, lse = _exact_variants(q, k, v, mask, bias, q_len, kv_len, alibi, sinks, keep,
                                            p=static_plan(rules), nonfinite_v=_nonfinite(v),
                                            want_weights=want_weights)
        return _xp_core.results(p, out, weights, lse)

    def mha(self, query, key, value, params, *, num_heads, num_kv_heads=None, mask=None,
            bias=None, causal=None, window=None, scale=None, q_lengths=None, kv_lengths=None,
            softcap=None, alibi_slopes=None, sinks=None, q_segment_ids=None, kv_segment_ids=None,
            dropout_mask=None, dropout_p=None, return_weights=False, return_lse=False):
        # `attnspec.backends._mha`: jnp projections, then self.sdpa per head
        result = _mha.run(self, "jax.mha", _mha.XPHeadOps(jnp), self._info, _lengths_to_numpy,
                          lambda: device_name(query), query, key, value, params, num_heads=num_heads,
                          num_kv_heads=num_kv_heads, mask=mask, bias=bias, causal=causal, window=window,
                          scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
                          return_weights=return_weights, **variant_keywords(locals()))
        self._last = result
        return result

    def lsh_attention(self, x, v, *, rotations, chunk_length, causal=False, kv_lengths=None,
                      dedup=False, scale=None, return_buckets=False):
        p = _lsh_xp.plan("jax.lsh_attention", self._info, _lengths_to_numpy, x, v, rotations,
                         chunk_length, causal, kv_lengths, dedup, scale)
        if p.L == 0 or 0 in p.batch:
            result = _lsh_xp.empty(jnp, p, x.dtype, None)
        else:
            kv = _lsh_xp.kv_flat(p)
            result = _lsh(x, v, rotations, None if kv is None else jnp.asarray(kv),
                          p=dataclasses.replace(p, kv_lengths=None),
                          nonfinite_v=_nonfinite(v))
        self._last = result
        return result if return_buckets else result[0]


@partial(jax.jit, static_argnames=("p", "nonfinite_v"))
def _lsh(x, v, rotations, kv, *, p, nonfinite_v: bool):
    """`attnspec.backends._lsh_xp` with jax.numpy as its namespace; the plan is static, kv traced."""
    return _lsh_xp.lsh_attention(jnp, p, x, v, rotations, kv, nonfinite_v=nonfinite_v)
