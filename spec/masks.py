"""Boolean visibility masks (True = may attend).

Shape letters: n queries, m keys. Every builder returns exactly the visibility that the matching
`sdpa` keyword produces, so ``sdpa(q, k, v, mask=causal_mask(n, m, "lower_right"))`` equals
``sdpa(q, k, v, causal="lower_right")`` bit for bit.
"""

from __future__ import annotations

import numpy as np

from attnspec._errors import SpecError
from attnspec.spec._validate import check_causal, check_lengths, check_window, is_int


def _check_size(fn: str, name: str, value: object) -> int:
    if not is_int(value) or value < 0:
        raise SpecError(f"{fn}: {name}={value!r} must be an int >= 0")
    return int(value)


def _anchor(n: int, m: int, align: str | None) -> np.ndarray:
    """i' for each query row: i, or i + m - n for the lower-right alignment. Shape (n, 1)."""
    i = np.arange(n)[:, None]
    return i + (m - n) if align == "lower_right" else i


def causal_mask(n: int, m: int, align: str = "upper_left") -> np.ndarray:
    """(n, m) causal visibility.

    ``"upper_left"``: key j is visible from query i iff j <= i (torch and JAX ``is_causal``).
    ``"lower_right"``: iff j <= i + m - n, so the last query sees the last key (FlashAttention,
    and what a KV cache of m keys with n new queries needs).
    """
    n, m = _check_size("causal_mask", "n", n), _check_size("causal_mask", "m", m)
    if check_causal("causal_mask", align) is None:
        raise SpecError("causal_mask: align=None is not an alignment; expected 'upper_left' or 'lower_right'")
    return np.arange(m)[None, :] <= _anchor(n, m, align)


def window_mask(n: int, m: int, left: int, right: int, align: str | None = None) -> np.ndarray:
    """(n, m) sliding-window visibility: key j visible iff i' - left <= j <= i' + right.

    i' = i unless ``align="lower_right"``, where i' = i + m - n. This is the window that
    ``sdpa(window=(left, right), causal=align)`` applies (the causal rule itself is separate).
    """
    n, m = _check_size("window_mask", "n", n), _check_size("window_mask", "m", m)
    check_window("window_mask", (left, right))
    check_causal("window_mask", align)
    j, anchor = np.arange(m)[None, :], _anchor(n, m, align)
    return (j >= anchor - left) & (j <= anchor + right)


def padding_mask(lengths: np.ndarray | int, m: int) -> np.ndarray:
    """Key padding: shape ``lengths.shape + (1, 1, m)``, True where key j < length.

    Broadcasts against (..., Hq, n, m) when ``lengths`` is over the batch dims, exactly like
    ``sdpa(kv_lengths=lengths)``.
    """
    m = _check_size("padding_mask", "m", m)
    lengths = _lengths("padding_mask", lengths, m, "m")
    return np.arange(m) < lengths[..., None, None, None]


def query_padding_mask(lengths: np.ndarray | int, n: int) -> np.ndarray:
    """Query padding: shape ``lengths.shape + (1, n, 1)``, True where query i < length.

    A masked query row has no visible key, so its output is 0: the same as ``sdpa(q_lengths=...)``.
    """
    n = _check_size("query_padding_mask", "n", n)
    lengths = _lengths("query_padding_mask", lengths, n, "n")
    return (np.arange(n) < lengths[..., None, None])[..., None]


def _lengths(fn: str, lengths: object, limit: int, limit_name: str) -> np.ndarray:
    if isinstance(lengths, np.ndarray):
        shape = lengths.shape
    elif is_int(lengths):
        shape = ()
    else:
        shape = None  # check_lengths reports the type
    return check_lengths(fn, "lengths", lengths, shape or (), limit, limit_name)


def visibility(
    n: int,
    m: int,
    *,
    causal: str | None,
    window: tuple[int, int] | None,
    q_lengths: np.ndarray | None,
    kv_lengths: np.ndarray | None,
) -> np.ndarray | None:
    """The structural visibility of an sdpa call, AND-combined; None when everything is visible.

    The result broadcasts against (*batch, Hq, n, m). Explicit mask and bias are combined by the
    caller, since they are data rather than rules.
    """
    vis = None

    def both(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
        return b if a is None else a & b

    if causal is not None:
        vis = both(vis, causal_mask(n, m, causal))
    if window is not None:
        vis = both(vis, window_mask(n, m, window[0], window[1], causal))
    if kv_lengths is not None:
        vis = both(vis, padding_mask(kv_lengths, m))
    if q_lengths is not None:
        vis = both(vis, query_padding_mask(q_lengths, n))
    return vis
