"""Backends that draw their own dropout mask (variant ``dropout_drawn``), for the statistical
property of ``attnspec.conformance.test_dropout``: a correct control and two shipped bugs.

Each is `mutants.Naive` with a mask drawn from NumPy's global generator (which the property
seeds) and passed on as a given mask, so the arithmetic after the draw is the control's.
"""

from __future__ import annotations

import numpy as np
from mutants import Naive


class Drawing(Naive):
    name = "naive-drawing"
    variants = Naive.variants | {"dropout_drawn"}
    #: "1 - p" keeps each weight with probability 1 - p; "p" is the bug that keeps with rate p
    keep_rate = "1 - p"

    def sdpa(self, q, k, v, *, dropout_mask=None, dropout_p=None, **kw):
        if dropout_mask is None and dropout_p:
            batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
            u = np.random.random_sample((*batch, *q.shape[-3:-1], k.shape[-2]))  # (..., Hq, n, m)
            dropout_mask = u >= dropout_p if self.keep_rate == "1 - p" else u < dropout_p
        return super().sdpa(q, k, v, dropout_mask=dropout_mask, dropout_p=dropout_p, **kw)


class KeepRateP(Drawing):
    name = "mutant-drawn-keep-rate-p"
    keep_rate = "p"


class NotRescaled(Drawing):
    name = "mutant-drawn-not-rescaled"
    bug = "dropout_not_rescaled"  # Naive's: kept weights not divided by 1 - p


#: mutant name -> (its factory's name here, what its failure message must say)
DRAWN_MUTANTS = {
    "drawn_keep_rate_p": ("KeepRateP", "keep rate"),
    "drawn_not_rescaled": ("NotRescaled", "not 0 or w / (1 - p)"),
}
#: pytest -k of the runs: the drawn-dropout property only
DRAWN_RUN = "dropout_drawn"
