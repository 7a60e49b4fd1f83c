"""The conformance vectors a GPU kernel author checks against (#27): serving, paged and FP8 cases.

Three families, registered after sdpa's and the others' so their bundles and case ids stay put
(VECTORS.md, "Kernel bundles"):

- `ServingVectors` (bundles ``sdpa_serving-DTYPE``, function sdpa): the serving-shaped calls of
  `attnspec.conformance.serving_cases` (decode, GQA decode, chunked prefill, empty caches,
  windows with sinks, kernel head dims and tile-edge lengths), drawn through the feature tour,
  and the six fixed `KERNEL_CASES` as corners; judged as conformance/test_serving.py judges them.
- `PagedVectors` (``sdpa_paged-DTYPE``, function sdpa): each of those cases that has kv lengths,
  its keys and values laid out as the adversarial paged cache of
  `attnspec.backends.conventions.paged` (`paging_for`, `page`): a shuffled pool of blocks, NaN in
  every slot that holds no key of a sequence, unused table entries pointing at NaN trap blocks.
  q and out are in FlashAttention's (B, n, Hq, d) layout; vLLM's packed query rides along.
- `FP8Vectors` (``sdpa_fp8-float8_e4m3fn``, ``sdpa_fp8-float8_e5m2``): the cases of
  `attnspec.conformance.fp8_cases`, stored as safetensors F8_E4M3 / F8_E5M2 with their float32
  descales, each written twice: under the P precision claim ``float32`` and under FA3's
  ``float8_e4m3fn`` (`attnspec.spec.tolerance_fp8`); ``option.p_precision`` says which.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from attnspec.conformance.vectors import (
    PROFILE_CASES,
    Expected,
    Family,
    SDPAVectors,
    VectorCase,
    drawn_vector,
    json_options,
    register,
)

__all__ = ["FP8Vectors", "PagedVectors", "ServingVectors"]

#: the integer dtype of the paged layout's tables and lengths (FlashAttention's and vLLM's)
INDEX_DTYPE = np.int32


def _numbered(name: str, dtype: str, found: list[VectorCase]) -> list[VectorCase]:
    for i, c in enumerate(found):
        c.id = f"{name}-{dtype}-{i:04d}-{c.feature}"
    return found


def serving_spec_cases(dtype: str, count: int) -> list[Any]:
    """The serving SDPACases of a bundle: ``count`` per feature through the tour (none of
    ``kernel_shapes`` at the dev profile's count), each seeded by family, feature, dtype and index
    as `Family.cases` seeds, then the fixed kernel cases."""
    from attnspec.conformance.corners import Tour
    from attnspec.conformance.serving_cases import KERNEL_CASES, SERVING_FEATURES, _serving_case, kernel_case

    found = []
    for feature in SERVING_FEATURES:
        # as serving_cases does, the dev profile draws no kernel shape besides the fixed six
        for i in range(0 if feature == "kernel_shapes" and count <= PROFILE_CASES["dev"] else count):
            tour = Tour(feature, zlib.crc32(f"sdpa_serving|{feature}|{dtype}|{i}".encode()))
            found.append(_serving_case(tour.choosing(SERVING_FEATURES), dtype, SERVING_FEATURES))
    return found + [kernel_case(kind, dtype) for kind in KERNEL_CASES]


# -- serving -----------------------------------------------------------------------------------


class ServingVectors(SDPAVectors):
    """sdpa on serving-shaped calls: the inputs, outputs and judging of the sdpa bundles; the
    property is test_serving.py's matches_golden; no case asks for weights or lse."""

    name = "sdpa_serving"

    @property
    def function(self) -> str:
        return "sdpa"

    @property
    def features(self) -> tuple[str, ...]:
        from attnspec.conformance.serving_cases import SERVING_FEATURES

        return SERVING_FEATURES

    def cases(self, dtype: str, count: int) -> list[VectorCase]:
        return _numbered(self.name, dtype, [self._serving(c) for c in serving_spec_cases(dtype, count)])

    def _serving(self, case: Any) -> VectorCase:
        found = self._vector(case)
        found.prop, found.family = "matches_golden", self.name
        return found


# -- paged ---------------------------------------------------------------------------------------


class PagedVectors(ServingVectors):
    """sdpa over a paged KV cache (VECTORS.md, "sdpa_paged"): ``q`` (B, n, Hq, dk), the pools
    ``k_cache`` (num_blocks, block_size, Hkv, dk) and ``v_cache`` (..., dv), ``block_table``
    (B, W) and ``cache_seqlens`` (B,) int32, ``q_lengths`` (B,) int32 when the case has them, and
    vLLM's ``query`` (sum(q_lengths), Hq, dk) with ``cu_seqlens_q`` (B + 1,) int32; ``out`` is
    (B, n, Hq, dv). `run` reads the pool back through the table into the spec's contiguous
    layout and calls the backend's sdpa (a paged kernel's own runner passes the pool as is). Its
    function and features are the serving family's."""

    name = "sdpa_paged"
    positional = ("q", "k_cache", "v_cache")

    def cases(self, dtype: str, count: int) -> list[VectorCase]:
        cases = [self._paged(c) for c in serving_spec_cases(dtype, count) if "kv_lengths" in c.options]
        return _numbered(self.name, dtype, cases)

    def _paged(self, case: Any) -> VectorCase:
        from attnspec.backends.conventions.paged import page, paging_for, paging_seed

        contiguous = self._vector(case)
        qf = case.q.transpose(0, 2, 1, 3)  # (B, Hq, n, dk) -> (B, n, Hq, dk)
        kf, vf = (x.transpose(0, 2, 1, 3) for x in (case.k, case.v))  # (B, m, Hkv, d)
        kv = np.asarray(case.options["kv_lengths"], np.int64)
        paging = paging_for(kv, case.k.shape[-2], paging_seed(qf, kf, vf, lengths=kv))
        b, n = qf.shape[:2]
        q_len = np.asarray(case.options.get("q_lengths", np.full(b, n)), np.int64)
        inputs = {
            "q": np.ascontiguousarray(qf),
            "k_cache": page(kf, paging),  # (num_blocks, block_size, Hkv, dk)
            "v_cache": page(vf, paging),  # (num_blocks, block_size, Hkv, dv)
            "block_table": paging.table.astype(INDEX_DTYPE),  # (B, W)
            "cache_seqlens": paging.lengths.astype(INDEX_DTYPE),  # (B,)
            # vLLM's packed query: sequence after sequence, rows past q_lengths left out
            "query": np.concatenate([qf[i, : q_len[i]] for i in range(b)]) if b else qf[:0, 0],
            "cu_seqlens_q": np.concatenate([[0], np.cumsum(q_len)]).astype(INDEX_DTYPE),  # (B + 1,)
        }
        if "q_lengths" in case.options:
            inputs["q_lengths"] = q_len.astype(INDEX_DTYPE)
        inputs.update(
            {
                k: v
                for k, v in case.options.items()
                if isinstance(v, np.ndarray) and k not in ("kv_lengths", "q_lengths")
            }
        )
        e = contiguous.expected["out"]  # (B, Hq, n, dv), zero rows (B, Hq, n)
        zero = None if e.zero_rows is None else np.ascontiguousarray(e.zero_rows.transpose(0, 2, 1))
        out = Expected(np.ascontiguousarray(e.golden.transpose(0, 2, 1, 3)), e.dtype, e.allowed, zero)
        tags = {*case.tags, "paged", f"block_size_{paging.block_size}"}
        return drawn_vector("sdpa", case, inputs, {"out": out}, tags=tags, family=self.name)

    def _spec_case(self, case: VectorCase) -> Any:
        """The contiguous sdpa call of a paged case: each sequence's keys read through its table,
        (B, Hkv, W * block_size, d), NaN past its length (the pool's own NaN), kv_lengths from
        cache_seqlens."""
        from attnspec.conformance.hypothesis_helpers import SDPACase

        arrays, options = self.spec_call(case)
        q, k, v = (arrays.pop(n) for n in ("q", "k", "v"))
        return SDPACase(case.feature, case.dtype, q, k, v, {**arrays, **options}, frozenset(case.tags))

    def spec_call(self, case: VectorCase) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        x = case.inputs
        bs, width = x["k_cache"].shape[1], x["block_table"].shape[1]
        j = np.arange(width * bs)
        blocks = x["block_table"].astype(np.int64)[:, j // bs]  # (B, W * bs): key j's physical block
        arrays = {
            "q": np.ascontiguousarray(x["q"].transpose(0, 2, 1, 3)),  # (B, Hq, n, dk)
            "k": np.ascontiguousarray(
                x["k_cache"][blocks, j % bs].transpose(0, 2, 1, 3)
            ),  # (B, Hkv, W*bs, dk)
            "v": np.ascontiguousarray(
                x["v_cache"][blocks, j % bs].transpose(0, 2, 1, 3)
            ),  # (B, Hkv, W*bs, dv)
            "kv_lengths": x["cache_seqlens"].astype(np.int64),
        }
        if "q_lengths" in x:
            arrays["q_lengths"] = x["q_lengths"].astype(np.int64)
        arrays.update({k: v for k, v in x.items() if k not in (*_PAGED_LAYOUT, "q_lengths")})
        return arrays, {k: tuple(v) if isinstance(v, list) else v for k, v in case.options.items()}

    def refusals(self, backend: Any, case: VectorCase, device: str | None) -> list[str]:
        arrays, options = self.spec_call(case)
        shapes = {f"{n}_shape": arrays[n].shape for n in ("q", "k", "v")}
        extra = {n: a for n, a in arrays.items() if n not in ("q", "k", "v")}
        return backend.supports("sdpa", dtype=case.dtype, device=device, **shapes, **extra, **options)

    def call(self, backend: Any, arrays: dict[str, Any], options: dict[str, Any]) -> tuple:
        result = backend.sdpa(
            arrays["q"],
            arrays["k"],
            arrays["v"],
            **{k: v for k, v in arrays.items() if k not in ("q", "k", "v")},
            **options,
        )
        return result if isinstance(result, tuple) else (result,)

    def finish(self, case: VectorCase, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for n, a in got.items()}  # -> (B, n, Hq, dv)

    def causes(self, case: VectorCase, got: dict[str, np.ndarray]) -> list[str]:
        out = got.get("out")
        e = case.expected["out"]
        if out is None or out.shape != e.golden.shape:
            return []
        found = self.spec_causes(
            self._spec_case(case),
            out.astype(np.float64).transpose(0, 2, 1, 3),  # (B, n, Hq, dv) -> (B, Hq, n, dv)
            e.golden.transpose(0, 2, 1, 3),
            e.allowed,
            None,
        )
        if any(c.startswith("a hidden key's NaN/inf reached") for c in found):
            found.append(
                "every pool slot that holds no key of a sequence is NaN (slots past its cache_seqlens, "
                "blocks outside its block_table, the trap blocks its unused table entries point at): "
                "the kernel read past cache_seqlens or outside the block table"
            )
        return found


#: the paged case's tensors that the contiguous call replaces
_PAGED_LAYOUT = ("q", "k_cache", "v_cache", "block_table", "cache_seqlens", "query", "cu_seqlens_q")


# -- FP8 -----------------------------------------------------------------------------------------


class FP8Vectors(Family):
    """sdpa_fp8: ``q``, ``k``, ``v`` stored FP8 (a wide q over an FP8 cache at times), their
    float32 descales ``q_descale``, ``k_descale``, ``v_descale`` (broadcastable to (*batch, Hkv),
    0-d for one per tensor), lengths by name; options ``out_dtype`` and ``p_precision``, the claim
    the allowed error assumes (`attnspec.spec.tolerance_fp8`). Every drawn case is written once
    per claim in `P_PRECISIONS`, the float32 ones first; `run` gives a backend the cases of the
    claim it makes (``fp8_p_precision``) and declares the others unsupported."""

    name = "sdpa_fp8"
    positional = ("q", "k", "v")

    @property
    def dtypes(self) -> tuple[str, ...]:  # type: ignore[override]
        from attnspec.spec.fp8 import FP8_DTYPES

        return FP8_DTYPES

    @property
    def features(self) -> tuple[str, ...]:
        from attnspec.conformance.fp8_cases import FP8_FEATURES

        return FP8_FEATURES

    def cases(self, dtype: str, count: int) -> list[VectorCase]:
        from attnspec.conformance.corners import Tour
        from attnspec.conformance.fp8_cases import FP8_FEATURES, _fp8_case
        from attnspec.spec.tolerance_fp8 import P_PRECISIONS

        drawn = []
        for feature in FP8_FEATURES:
            for i in range(count):
                tour = Tour(feature, zlib.crc32(f"{self.name}|{feature}|{dtype}|{i}".encode()))
                drawn.append(_fp8_case(tour.choosing(FP8_FEATURES), dtype, FP8_FEATURES))
        return _numbered(self.name, dtype, [self._vector(c, claim) for claim in P_PRECISIONS for c in drawn])

    def _vector(self, case: Any, claim: str) -> VectorCase:
        from attnspec.spec.fp8 import plan_fp8
        from attnspec.spec.tolerance_fp8 import fp8_golden

        fp = plan_fp8("sdpa_fp8", case.q, case.k, case.v, case.options)
        with np.errstate(all="ignore"):
            g = fp8_golden(case.q, case.k, case.v, p_precision=claim, **case.options)
        expected = {"out": Expected(g.out, fp.out_dtype, g.allowed_out)}
        if fp.sdpa.return_lse:
            assert g.lse is not None and g.allowed_lse is not None  # asked for: the golden has them
            expected["lse"] = Expected(g.lse, fp.lse_dtype, g.allowed_lse)
        inputs = {"q": case.q, "k": case.k, "v": case.v}
        inputs.update({k: np.asarray(v) for k, v in case.options.items() if isinstance(v, np.ndarray)})
        options = {**json_options(case.options), "p_precision": claim}
        return drawn_vector(
            self.name, case, inputs, expected, options=options, tags={*case.tags, f"p_{claim}"}
        )

    def spec_call(self, case: VectorCase) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, options = super().spec_call(case)
        options.pop("p_precision", None)  # a claim about the kernel, not an argument
        return arrays, options

    def causes(self, case: VectorCase, got: dict[str, np.ndarray]) -> list[str]:
        """A descale left out or applied twice, or P rounded to e4m3 under a float32 claim: the
        suite's own FP8 causes (`attnspec.conformance.causes.fp8_causes`)."""
        from attnspec.conformance.causes import fp8_causes

        if "out" not in got:
            return []
        arrays, options = self.spec_call(case)
        q, k, v = (arrays.pop(n) for n in self.positional)
        claim = str(case.options.get("p_precision", "float32"))
        with np.errstate(all="ignore"):
            return fp8_causes(q, k, v, {**options, **arrays}, got["out"], case.expected["out"].allowed, claim)

    def refusals(self, backend: Any, case: VectorCase, device: str | None) -> list[str]:
        claim = getattr(backend, "fp8_p_precision", "float32")
        if case.options.get("p_precision") != claim:
            return [
                f"{backend.name} claims fp8_p_precision={claim!r}; this case's allowed error assumes "
                f"{case.options.get('p_precision')!r} (its twin under the other claim is in the bundle)"
            ]
        arrays, options = self.spec_call(case)
        wide = {options.get("out_dtype") or "bfloat16", arrays["q"].dtype.name} - {case.dtype}
        shapes = {f"{n}_shape": arrays[n].shape for n in self.positional}
        extra = {n: a for n, a in arrays.items() if n not in self.positional}
        return backend.supports(
            "sdpa_fp8",
            dtype=case.dtype,
            device=device,
            dtypes=tuple(sorted(wide)),
            **shapes,
            **extra,
            **options,
        )

    def outputs(self, options: dict[str, Any]) -> tuple[str, ...]:
        return ("out", *(("lse",) if options.get("return_lse") else ()))

    def call(self, backend: Any, arrays: dict[str, Any], options: dict[str, Any]) -> tuple:
        result = backend.sdpa_fp8(
            *(arrays[n] for n in self.positional),
            **{k: v for k, v in arrays.items() if k not in self.positional},
            **options,
        )
        return result if isinstance(result, tuple) else (result,)


for _family in (ServingVectors(), PagedVectors(), FP8Vectors()):
    register(_family)
