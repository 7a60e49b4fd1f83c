"""The declared deviations of this plugin's backends, as data: the same `Deviation` records as
attnspec's own catalogue (`attnspec.backends.deviations`). A backend lists its entries in its
class attribute ``deviations``; the conformance suite then counts a failing case that carries an
entry's ``tags`` as that deviation, and reports an entry whose cases all pass as stale."""

from __future__ import annotations

import numpy as np

from attnspec.backends.deviations import Deviation

__all__ = ["NAN_ROWS_DEVIATIONS"]


def _empty_row_case():
    r = np.random.default_rng(0)
    q, k, v = r.standard_normal((1, 3, 4)), r.standard_normal((1, 5, 4)), r.standard_normal((1, 5, 4))
    mask = np.ones((3, 5), bool)
    mask[1] = False  # query 1 sees no key
    return q, k, v, {"mask": mask}


def _row1_is_nan(result, case) -> bool:
    return isinstance(result, np.ndarray) and bool(np.isnan(result[..., 1, :]).all())


NAN_ROWS_DEVIATIONS = (
    Deviation(
        deviation_id="example-nan-rows.empty-row-nan",
        backend="example-nan-rows",
        feature="sdpa: a query row with no visible key (mask, causal, window, lengths, -inf bias)",
        spec_says="output 0 (and weights 0)",
        native_does="output NaN, and NaN weights: the softmax is exp(s) / sum(exp(s)), which is "
        "0 / 0 over a row of -inf logits",
        reproducer="""\
import numpy as np
from attnspec_example_plugin.nan_rows import NanRowsBackend

r = np.random.default_rng(0)
q, k, v = r.standard_normal((3, 4)), r.standard_normal((5, 4)), r.standard_normal((5, 4))
mask = np.ones((3, 5), bool)
mask[1] = False  # query 1 sees no key
out = NanRowsBackend().sdpa(q, k, v, mask=mask)
assert np.isnan(out[1]).all()  # the spec: 0
""",
        case=_empty_row_case,
        shows=_row1_is_nan,
        tags=frozenset({"no_visible_row"}),
    ),
)
