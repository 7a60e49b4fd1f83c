"""The `spec_keywords` convention: a function that takes the spec's own keywords and returns what
`attnspec.spec.sdpa` returns, on NumPy arrays. The reference implementation of the mutation run
(tests/mutation/reference_sdpa.py) is checked through it:

    attnspec check tests/mutation/reference_sdpa.py:sdpa \\
        --convention tests/mutation/reference_convention.py:SPEC_KEYWORDS --arrays numpy
"""

from __future__ import annotations

from typing import Any, ClassVar

from attnspec.backends import Convention

#: the spec's keywords, passed as they are whenever a call sets them
PASSED = (
    "mask",
    "bias",
    "causal",
    "window",
    "scale",
    "q_lengths",
    "kv_lengths",
    "softcap",
    "alibi_slopes",
    "sinks",
    "q_segment_ids",
    "kv_segment_ids",
    "dropout_mask",
    "dropout_p",
)


class SpecKeywords(Convention):
    name = "spec_keywords"
    signature = (
        "fn(q, k, v, *, <every keyword of attnspec.spec.sdpa>) -> what attnspec.spec.sdpa returns, "
        "on NumPy arrays"
    )
    arrays = "numpy"
    cannot: ClassVar[dict[str, str | None]] = {}
    causal_flag = "upper_left"
    window_argument = True
    variants = frozenset(
        {"softcap", "alibi", "sinks", "lse", "segments", "causal_lower_right_lengths", "dropout"}
    )

    def call(self, fn, lib, p, q, k, v, options: dict[str, Any]):
        kw = {name: options[name] for name in PASSED if options.get(name) is not None}
        if options.get("return_weights"):
            kw["return_weights"] = True
        if p.return_lse:
            kw["return_lse"] = True
        result = fn(q, k, v, **kw)
        # exactly what attnspec.spec.sdpa returns: the output alone, or a tuple of the output, then
        # the weights and the lse when asked for; anything else is the function's error
        wanted = 1 + bool(options.get("return_weights")) + bool(p.return_lse)
        got = len(result) if isinstance(result, tuple) else 1
        if got != wanted or (wanted == 1 and isinstance(result, tuple)):
            raise TypeError(
                f"returned {type(result).__name__} of {got}, expected what attnspec.spec.sdpa returns: "
                f"{'a tuple of ' + str(wanted) if wanted > 1 else 'the output array alone'}"
            )
        if wanted == 1:
            return result, None
        out, rest = result[0], list(result[1:])
        weights = rest.pop(0) if options.get("return_weights") else None
        return ((out, rest[0]) if p.return_lse else out), weights


SPEC_KEYWORDS = SpecKeywords()
