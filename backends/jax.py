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

Length buckets: XLA compiles a program for every new shape, and compiling costs far more than
running attention at small sizes. So for concrete CPU arrays the adapter pads the query and key
lengths up to a bucket (8, 16, 32, ..., the next power of two, at least 8) on the host, hides the
padding through ``q_lengths``/``kv_lengths`` (padded keys are masked; padded query rows see
nothing and are cut off), runs the padded call and cuts the results back to the call's own sizes,
so one compiled program serves every length in its bucket. Gradients are padded and cut the same
way (d_out with zeros), the variants too (their ALiBi distances and dropout mask padded alike),
and mha's projections pad their rows. Lower-right causal, whose diagonal moves with the lengths,
traced arrays and arrays on an accelerator run at their own sizes;
``JaxBackend(length_buckets=False)`` turns the buckets off.

Inside the caller's own `jax.jit` the finiteness flags cannot be read back, so the choice is made
on device: `lax.cond` runs the fused kernel for all-finite inputs and the exact path (with the
full non-finite treatment) otherwise. ``q_lengths``/``kv_lengths`` must then be concrete (NumPy
or closed-over arrays): they shape the plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from attnspec.backends import _lsh_xp, _mha, _xp_core
from attnspec.backends._common import (
    alibi_distance,
    compute_dtype_name,
    fold_per_sequence,
    is_empty,
    static_plan,
    with_mask_and_bias,
)
from attnspec.backends._jax_arrays import (  # noqa: F401  (re-exported: jax_native and arrays use them)
    JaxArrays,
    _lengths_to_numpy,
    device_name,
    from_btnh,
    full_visibility,
    lengths_arrays,
    native_call,
    use_compilation_cache,
    with_head,
)
from attnspec.backends.base import VARIANT_FEATURES, variant_features
from attnspec.errors import SpecError
from attnspec.spec.options import LSH_OPTIONS, VARIANT_ARRAYS, take, with_options
from attnspec.spec.validate import SDPAPlan

__all__ = ["JaxBackend"]


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
def _exact(
    q, k, v, mask, bias, q_len, kv_len, variants=(None,) * 3, *, p: SDPAPlan, nonfinite_v, want_weights
):
    """The exact path: (out, weights, lse). ``variants`` are issue #15's ``(alibi, sinks, keep)``,
    None where the call has none."""
    alibi, sinks, keep = variants
    vis = full_visibility(p, mask, bias, q_len, kv_len)
    q, k, v = (with_head(x) for x in (q, k, v))
    return _xp_core.attention(
        jnp,
        p,
        q,
        k,
        v,
        vis,
        bias,
        nonfinite_v=nonfinite_v,
        want_weights=want_weights,
        alibi=alibi,
        sinks=sinks,
        keep=keep,
    )


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
        # XLA:GPU refuses to compile a jitted float16 jax.nn.dot_product_attention when one of
        # the sizes is 1 (n, m or the head dim: "Unsupported dot precision algorithm: 4"; H200,
        # JAX 0.11.2; eager calls and bfloat16 compile, and the precision setting does not matter)
        or (p.dtype == "float16" and _platform(q) == "gpu" and 1 in (p.n, p.m, p.dk, p.dv))
    )


@jax.jit
def _logit_floor_on_device(q, k, bias, scale):
    f32 = jnp.float32  # overflow to inf only makes the answer "not clear": the exact path
    bias = None if bias is None else bias.astype(f32)
    return _xp_core.logit_floor(jnp, q.astype(f32), k.astype(f32), bias, scale)


def _fill_limit(dtype) -> float:
    """Half of the finite fill jax.nn.dot_product_attention gives masked logits, -0.7 * finfo.max."""
    return -0.35 * float(jnp.finfo(dtype).max)


def _clear_of_fill(p: SDPAPlan, q, k, bias) -> bool:
    """Whether every logit stays above half of JAX's finite fill for masked keys, so that a masked
    key's weight exp(fill - row max) is an exact 0 in the fused kernel (fixes jax.finite-mask-fill:
    a visible row whose logits all sit near finfo.min, from a large negative finite bias or huge
    q . k, would otherwise give its weight to the masked keys). Raises under a trace."""
    if all(_on_host(x) for x in (q, k)) and (bias is None or _on_host(bias)):
        q64, k64, bias64 = (None if x is None else np.asarray(x).astype(np.float64) for x in (q, k, bias))
        floor = float(_xp_core.logit_floor(np, q64, k64, bias64, p.scale))
    else:
        # no gradient flows through the choice: under an eager jax.vjp the floor is then a value
        q, k, bias = (None if x is None else jax.lax.stop_gradient(x) for x in (q, k, bias))
        floor = float(_logit_floor_on_device(q, k, bias, p.scale))
    return floor > _fill_limit(q.dtype)


@dataclasses.dataclass(frozen=True)
class Route:
    """How one call runs, chosen from the values of its inputs (`route`)."""

    drop_hidden: bool  # zero the keys no row can see first (NaN/inf in k or v, and rules to hide them)
    exact: bool  # the exact path, not the fused kernel
    nonfinite_v: bool  # v holds NaN/inf a row can see: the exact path's non-finite treatment


def route(p: SDPAPlan, q, k, v, mask, bias, q_len, kv_len, want_weights: bool) -> Route:
    """The route for concrete inputs. Raises TracerArrayConversionError under a trace."""
    sp = static_plan(p)
    has_rules = (
        p.causal
        or p.window
        or mask is not None
        or bias is not None
        or q_len is not None
        or kv_len is not None
    )
    finite_q, finite_k, finite_v = _finite(q, k, v)
    drop = not (finite_k and finite_v) and bool(has_rules)
    if drop:  # fixes jax.masked-nonfinite-v (and masked keys generally) where it can stay fused
        k, v = _drop_hidden_keys(k, v, mask, bias, q_len, kv_len, p=sp)
        finite_q, finite_k, finite_v = _finite(q, k, v)
    exact = (
        want_weights
        # fixes jax.masked-nonfinite-v and jax.neg-inf-logits-attend-masked-keys
        or not (finite_q and finite_k and finite_v)
        or not _fused_ok(p, q)
        or not _clear_of_fill(p, q, k, bias)  # fixes jax.finite-mask-fill
    )
    return Route(drop, exact, not finite_v)


def run(r: Route, p: SDPAPlan, q, k, v, mask, bias, q_len, kv_len, want_weights: bool):
    """sdpa on a chosen route; traceable (jax.vjp runs it on the route its concrete inputs chose)."""
    sp = static_plan(p)
    if r.drop_hidden:
        k, v = _drop_hidden_keys(k, v, mask, bias, q_len, kv_len, p=sp)
    if not r.exact:
        return _fused(q, k, v, mask, bias, q_len, kv_len, p=sp)
    result = _exact(
        q, k, v, mask, bias, q_len, kv_len, p=sp, nonfinite_v=r.nonfinite_v, want_weights=want_weights
    )
    return result[:2] if want_weights else result[0]


def _traced(q, k, v, mask, bias, q_len, kv_len, *, p: SDPAPlan, want_weights: bool, exact: bool):
    """sdpa inside the caller's trace, where finiteness cannot be read back to choose a path.

    The exact path with the full non-finite treatment is right for any input; when the fused
    kernel may be used, ``lax.cond`` picks it on device for all-finite inputs (both branches are
    compiled, one runs).
    """

    def exact_path():
        out, w, _ = _exact(
            q, k, v, mask, bias, q_len, kv_len, p=p, nonfinite_v=True, want_weights=want_weights
        )
        return (out, w) if want_weights else out

    if exact:
        return exact_path()
    fused_ok = _finite_flags(q, k, v).all() & (
        _logit_floor_on_device(q, k, bias, p.scale) > _fill_limit(q.dtype)
    )  # jax.finite-mask-fill
    return jax.lax.cond(fused_ok, lambda: _fused(q, k, v, mask, bias, q_len, kv_len, p=p), exact_path)


def _nonfinite(v) -> bool:
    """Whether v holds NaN/inf; True (the treatment that is right for any v) under jax.jit."""
    try:
        if _on_host(v):
            return not bool(np.isfinite(np.asarray(v)).all())  # no compile per shape (see _finite)
        return not bool(jnp.all(jnp.isfinite(v)))
    except (jax.errors.TracerBoolConversionError, jax.errors.TracerArrayConversionError):
        return True


@partial(jax.jit, static_argnames=("p", "r"))
def _vjp_on_route(q, k, v, *rest, mask, q_len, kv_len, p: SDPAPlan, r: Route):
    """(dq, dk, dv[, dbias]) of `run` on route ``r``: rest is (d_out,) or (bias, d_out)."""
    *bias, d_out = rest

    def forward(q, k, v, *bias):
        return run(r, p, q, k, v, mask, bias[0] if bias else None, q_len, kv_len, False)

    return jax.vjp(forward, q, k, v, *bias)[1](d_out)


@partial(jax.jit, static_argnames=("heads", "dtype"))
def _project(x, w, b, *, heads: int, dtype: str):
    return _mha.XPHeadOps(jnp).project(x, w, b, heads, dtype)


@partial(jax.jit, static_argnames=("dtype",))
def _unproject(x, w, b, *, dtype: str):
    return _mha.XPHeadOps(jnp).unproject(x, w, b, dtype)


class JaxHeadOps(_mha.XPHeadOps):
    """jax.numpy's head ops, with each projection one jitted program: run eagerly, every jnp
    primitive of it compiles on its own for each new shape. With ``buckets`` the rows of a
    concrete CPU input are padded to their length bucket first and the result cut back (a
    projection treats each row on its own, so the padding changes no value)."""

    def __init__(self, buckets: bool = False) -> None:
        super().__init__(jnp)
        self.buckets = buckets

    def project(self, x, w, b, heads, dtype):
        if not (self.buckets and all(a is None or _on_host(a) for a in (x, w, b))):
            return _project(x, w, b, heads=heads, dtype=dtype)
        length = x.shape[-2]
        out = _project(pad_axes(x, {-2: bucket(length)}), w, b, heads=heads, dtype=dtype)
        return crop(out, (*out.shape[:-2], length, out.shape[-1]))  # (..., heads, L, hd)

    def unproject(self, x, w, b, dtype):
        if not (self.buckets and all(a is None or _on_host(a) for a in (x, w, b))):
            return _unproject(x, w, b, dtype=dtype)
        length = x.shape[-2]
        out = _unproject(pad_axes(x, {-2: bucket(length)}), w, b, dtype=dtype)
        return crop(out, (*out.shape[:-2], length, out.shape[-1]))  # (..., n, E)


# -- length buckets (see the module docstring) ------------------------------------------------


def bucket(size: int) -> int:
    """The padded length for ``size``: the next power of two, at least 8."""
    return max(8, 1 << max(size - 1, 0).bit_length())


def pad_axes(x, sizes: dict[int, int], keep_ones: bool = False):
    """``x`` (a concrete array) with zeros (False) appended on the host along each axis of
    ``sizes`` (a negative axis -> its padded size). With ``keep_ones`` an axis of size 1, or one
    ``x`` lacks, stays as it is: a mask or bias broadcasts there."""
    if x is None:
        return None
    a = np.asarray(x)
    widths = [(0, 0)] * a.ndim
    for axis, size in sizes.items():
        if a.ndim >= -axis and not (keep_ones and a.shape[axis] == 1):
            widths[axis] = (0, size - a.shape[axis])
    if not any(after for _, after in widths):
        return x
    return jax.device_put(np.pad(a, widths), x.device)


def crop(x, shape: tuple[int, ...]):
    """The leading ``shape`` block of ``x`` (a concrete array, same rank), cut on the host."""
    if tuple(x.shape) == tuple(shape):
        return x
    a = np.asarray(x)[tuple(slice(0, size) for size in shape)]
    return jax.device_put(np.ascontiguousarray(a), x.device)


def padded_plan(p: SDPAPlan, n: int, m: int) -> SDPAPlan:
    """``p`` at lengths (n, m), with lengths that hide the padding: a query row past the call's
    own n sees no key (it is cut off), a key past its m is masked."""

    def lengths(given, size):
        return np.broadcast_to(np.asarray(size if given is None else given, np.int64), p.batch).copy()

    return dataclasses.replace(
        p, n=n, m=m, q_lengths=lengths(p.q_lengths, p.n), kv_lengths=lengths(p.kv_lengths, p.m)
    )


def pad_call(pp: SDPAPlan, q, k, v, mask, bias):
    """q, k, v, mask and bias padded to the lengths of the padded plan ``pp``."""
    q = pad_axes(q, {-2: pp.n})
    k, v = pad_axes(k, {-2: pp.m}), pad_axes(v, {-2: pp.m})
    mask, bias = (pad_axes(x, {-2: pp.n, -1: pp.m}, keep_ones=True) for x in (mask, bias))
    return q, k, v, mask, bias


class JaxBackend(JaxArrays):
    """jax.nn.dot_product_attention with the spec's semantics; exact jnp path where it cannot."""

    name = "jax"
    variants = frozenset(VARIANT_FEATURES)

    def __init__(self, length_buckets: bool = True) -> None:
        super().__init__()
        self.length_buckets = length_buckets

    def _buckets(self, p: SDPAPlan, *arrays) -> SDPAPlan | None:
        """The padded plan of a call that runs in length buckets, or None: buckets are off, the
        diagonal is lower-right (it moves with the lengths), an array is traced or not on the
        CPU, or the lengths already are bucket sizes."""
        if not self.length_buckets or p.causal == "lower_right":
            return None
        if not all(x is None or _on_host(x) for x in arrays):
            return None
        n, m = bucket(p.n), bucket(p.m)
        return None if (n, m) == (p.n, p.m) else padded_plan(p, n, m)

    def _padded_sdpa(self, p: SDPAPlan, pp: SDPAPlan, q, k, v, mask, bias, want_weights: bool):
        """sdpa at the padded plan ``pp``, its results cut back to ``p``'s sizes."""
        q, k, v, mask, bias = pad_call(pp, q, k, v, mask, bias)
        q_len, kv_len = lengths_arrays(pp)
        result = run(
            route(pp, q, k, v, mask, bias, q_len, kv_len, want_weights),
            pp,
            q,
            k,
            v,
            mask,
            bias,
            q_len,
            kv_len,
            want_weights,
        )
        if want_weights:
            return crop(result[0], p.out_shape), crop(result[1], p.weights_shape)
        return crop(result, p.out_shape)

    def _padded_vjp(self, p: SDPAPlan, pp: SDPAPlan, mask):
        """The whole vjp (`_vjp_on_route`) at the padded plan ``pp``: q, k, v, bias and d_out are
        padded (d_out with zeros, so padded rows send back nothing), the gradients cut back."""
        q_len, kv_len = lengths_arrays(pp)

        def whole(q, k, v, *rest):
            *bias, d_out = rest
            shapes = [x.shape for x in (q, k, v, *bias)]
            q, k, v, mask_p, bias_p = pad_call(pp, q, k, v, mask, bias[0] if bias else None)
            d_out = pad_axes(d_out, {-2: pp.n})
            r = route(pp, q, k, v, mask_p, bias_p, q_len, kv_len, False)
            grads = _vjp_on_route(
                q,
                k,
                v,
                *([bias_p] if bias else []),
                d_out,
                mask=mask_p,
                q_len=q_len,
                kv_len=kv_len,
                p=static_plan(pp),
                r=r,
            )
            return [crop(g, shape) for g, shape in zip(grads, shapes)]

        return whole

    @with_options()
    def sdpa(self, q, k, v, **options):
        o = take("jax.sdpa", options)
        mask, bias, return_weights, sinks = o["mask"], o["bias"], o["return_weights"], o["sinks"]
        p = self._plan_of("jax.sdpa", q, k, v, o)
        if is_empty(p):
            # a tracer (mha_vjp's jax.vjp through an empty mha) has no device: the default one
            device = None if isinstance(q, jax.core.Tracer) else q.device
            result = _xp_core.empty(jnp, p, q.dtype, device, return_weights, sinks)
            self._last = result
            return result
        if variant_features(o):
            result = self._variants(
                p,
                q,
                k,
                v,
                mask,
                bias,
                return_weights,
                o["alibi_slopes"],
                sinks,
                o["q_segment_ids"],
                o["kv_segment_ids"],
                o["dropout_mask"],
            )
            self._last = result
            return result
        chosen = self.__dict__.pop("_route", None)  # sdpa_vjp's, from its concrete inputs
        if chosen is None and (pp := self._buckets(p, q, k, v, mask, bias)) is not None:
            result = self._padded_sdpa(p, pp, q, k, v, mask, bias, return_weights)
            self._last = result
            return result
        q_len, kv_len = lengths_arrays(p)
        try:
            chosen = chosen or route(p, q, k, v, mask, bias, q_len, kv_len, return_weights)
        except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
            # traced by the caller's jax.jit: the values are not known yet, so decide on device
            result = _traced(
                q,
                k,
                v,
                mask,
                bias,
                q_len,
                kv_len,
                p=static_plan(p),
                want_weights=return_weights,
                exact=return_weights or not _fused_ok(p, q),
            )
            self._last = result
            return result
        result = run(chosen, p, q, k, v, mask, bias, q_len, kv_len, return_weights)
        self._last = result
        return result

    @contextlib.contextmanager
    def _routed(self, q, k, v, options: dict):
        """sdpa_vjp runs on the route its concrete inputs choose, chosen here before jax.vjp
        traces the forward: under a trace the values cannot be read, and the on-device choice
        (`_traced`) compiles both routes, forward and backward. The forward is the function a
        concrete sdpa call runs, so the gradients are those of the forward the user calls. The
        whole vjp (forward and pullback) is then one jitted program, `_vjp_on_route`: one XLA
        compile per new shape where jax.vjp of the jitted forward needs two and more."""
        try:
            p = self._plan_of("jax.sdpa_vjp", q, k, v, options)
            variants = variant_features(options)
            o = {name: options[name] for name in VARIANT_ARRAYS}
            mask, bias = options["mask"], options["bias"]
            pp = (
                None
                if is_empty(p)
                else self._buckets(
                    p, q, k, v, mask, bias, *(x for x in o.values() if isinstance(x, jax.Array))
                )
            )
            if pp is not None and variants:
                self._vjp_on_route = self._padded_variants_vjp(p, mask, bias, o)
            elif pp is not None:
                self._vjp_on_route = self._padded_vjp(p, pp, mask)
            elif not is_empty(p) and not variants:
                q_len, kv_len = lengths_arrays(p)
                chosen = route(p, q, k, v, mask, bias, q_len, kv_len, False)
                self._route = chosen  # for the forward, should the engine trace it itself
                self._vjp_on_route = partial(
                    _vjp_on_route, mask=mask, q_len=q_len, kv_len=kv_len, p=static_plan(p), r=chosen
                )
        except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError, SpecError):
            pass  # traced by the caller (decided on device), or bad input (the vjp names it)
        try:
            yield
        finally:
            self.__dict__.pop("_route", None)  # never left for another call
            self.__dict__.pop("_vjp_on_route", None)

    def _variants(
        self, p, q, k, v, mask, bias, want_weights, alibi_slopes, sinks, q_segment_ids, kv_segment_ids, keep
    ):
        """The variants of issue #15, all on the exact path: jax.nn has none of them (no softcap,
        ALiBi, sinks, segment ids or lengths-aligned causal), and its logsumexp (return_residual)
        is not the spec's. The segment ids are read back (a sync; concrete ids only) for the
        per-sequence anchors."""
        # fixes jax.lse-empty-row-finite and jax.lse-in-input-dtype: the lse comes from the exact
        # path, -inf for a row with no visible key and float32 (float64 for float64 inputs)
        rules, q, k, v, mask, bias, alibi, keep = self._variant_call(
            p, q, k, v, mask, bias, alibi_slopes, sinks, q_segment_ids, kv_segment_ids, keep
        )
        out, weights, lse = _variants_on(rules, q, k, v, mask, bias, alibi, sinks, keep, want_weights)
        if (rules.n, rules.m) != (p.n, p.m):  # ran in length buckets: cut back to the call's sizes
            out = crop(out, (*out.shape[:-2], p.n, out.shape[-1]))
            weights = None if weights is None else crop(weights, (*weights.shape[:-2], p.n, p.m))
            lse = None if lse is None else crop(lse, (*lse.shape[:-1], p.n))
        return _xp_core.results(p, out, weights, lse)

    def _variant_call(self, p, q, k, v, mask, bias, alibi_slopes, sinks, q_segment_ids, kv_segment_ids, keep):
        """(rules, q, k, v, mask, bias, alibi, keep) for `_variants_on`: the per-sequence rules
        folded into the mask, the ALiBi term built, and all of it padded to the length buckets
        when the call runs in them (the rules' plan then has the padded lengths)."""
        q_ids, kv_ids = _lengths_to_numpy(q_segment_ids), _lengths_to_numpy(kv_segment_ids)
        rules, per_sequence = fold_per_sequence(p, q_ids, kv_ids)
        if per_sequence is not None:
            seq = jnp.asarray(per_sequence)
            mask = seq if mask is None else mask & seq
        padded = self._buckets(rules, q, k, v, mask, bias, alibi_slopes, sinks, keep)
        if padded is not None:
            rules = padded
            q, k, v, mask, bias = pad_call(rules, q, k, v, mask, bias)
            keep = pad_axes(keep, {-2: rules.n, -1: rules.m}, keep_ones=True)
        alibi = None
        if alibi_slopes is not None:  # -slope[h] * |i' - j|, i' from the call's own alignment
            ct = compute_dtype_name(p.dtype)  # as the golden: slopes in the compute dtype
            dist = alibi_distance(p, q_ids, kv_ids)  # (..., 1, n, m), NumPy float64
            if padded is not None:
                widths = [(0, 0)] * (dist.ndim - 2) + [(0, rules.n - p.n), (0, rules.m - p.m)]
                dist = np.pad(dist, widths)
            dist = jnp.asarray(dist.astype(ct))
            alibi = -alibi_slopes.astype(ct)[..., :, None, None] * dist  # (..., Hq, n, m)
        return rules, q, k, v, mask, bias, alibi, keep

    def _padded_variants_vjp(self, p, mask, bias, options: dict):
        """The whole vjp of a variant call, run in length buckets: jax.vjp of `_variants_on` at
        the padded lengths (one compiled program per bucket, not per length), d_out padded with
        zeros and the gradients cut back. Leaves: q, k, v, then bias, then sinks, as given."""
        o = {name: options.get(name) for name in VARIANT_ARRAYS}

        def whole(q, k, v, *rest):
            *leaves, d_out = rest
            shapes = [x.shape for x in (q, k, v, *leaves)]
            b = leaves[0] if bias is not None else None
            sinks = leaves[-1] if o["sinks"] is not None else None
            rules, qp, kp, vp, mask_p, bias_p, alibi, keep = self._variant_call(
                p,
                q,
                k,
                v,
                mask,
                b,
                o["alibi_slopes"],
                sinks,
                o["q_segment_ids"],
                o["kv_segment_ids"],
                o["dropout_mask"],
            )
            padded_leaves = (
                [qp, kp, vp] + ([bias_p] if b is not None else []) + ([sinks] if sinks is not None else [])
            )

            def forward(q, k, v, *extra):
                rest = list(extra)
                b = rest.pop(0) if bias is not None else None
                s = rest.pop(0) if o["sinks"] is not None else None
                return _variants_on(rules, q, k, v, mask_p, b, alibi, s, keep, False)[0]

            _, pullback = jax.vjp(forward, *padded_leaves)
            grads = pullback(pad_axes(d_out, {-2: rules.n}))
            return [crop(g, shape) for g, shape in zip(grads, shapes)]

        return whole

    @with_options()
    def mha(self, query, key, value, params, *, num_heads, num_kv_heads=None, **options):
        # `attnspec.backends._mha`: jnp projections, then self.sdpa per head
        inputs, o = (query, key, value, params, num_heads, num_kv_heads), take("jax.mha", options)
        ops = JaxHeadOps(self.length_buckets)
        self._last = _mha.run(self, "jax.mha", ops, _lengths_to_numpy, lambda: device_name(query), inputs, o)
        return self._last

    @with_options(table=LSH_OPTIONS)
    def lsh_attention(self, x, v, **options):
        p, o = _lsh_xp.plan("jax.lsh_attention", self._info, _lengths_to_numpy, x, v, options)
        rotations = o["rotations"]
        if p.L == 0 or 0 in p.batch:
            result = _lsh_xp.empty(jnp, p, x.dtype, None)
        else:
            kv = _lsh_xp.kv_flat(p)
            result = _lsh(
                x,
                v,
                rotations,
                None if kv is None else jnp.asarray(kv),
                p=dataclasses.replace(p, kv_lengths=None),
                nonfinite_v=_nonfinite(v),
            )
        self._last = result
        return result if o["return_buckets"] else result[0]


@partial(jax.jit, static_argnames=("p", "nonfinite_v"))
def _lsh(x, v, rotations, kv, *, p, nonfinite_v: bool):
    """`attnspec.backends._lsh_xp` with jax.numpy as its namespace; the plan is static, kv traced."""
    return _lsh_xp.lsh_attention(jnp, p, x, v, rotations, kv, nonfinite_v=nonfinite_v)


def _variants_on(rules: SDPAPlan, q, k, v, mask, bias, alibi, sinks, keep, want_weights: bool):
    """(out, weights, lse) of a variant call on the exact path, its rules folded into ``rules``."""
    q_len, kv_len = lengths_arrays(rules)
    sp = static_plan(rules)
    try:
        _, finite_k, finite_v = _finite(q, k, v)
        hidden_nonfinite = not (finite_k and finite_v)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        hidden_nonfinite = True  # traced: dropping is right for any k, v
    if hidden_nonfinite:
        # the keys no row sees are zeroed first, as on the plain route: the forward drops
        # their logits with a where, but a NaN k still reaches dq as 0 * NaN in dS @ K, and
        # softcap's tanh' at a NaN logit reaches dk (fixes jax.masked-nonfinite-v under autodiff)
        k, v = _drop_hidden_keys(k, v, mask, bias, q_len, kv_len, p=sp)
    nonfinite_v = _nonfinite(v)
    return _exact(
        q,
        k,
        v,
        mask,
        bias,
        q_len,
        kv_len,
        (alibi, sinks, keep),
        p=sp,
        nonfinite_v=nonfinite_v,
        want_weights=want_weights,
    )
