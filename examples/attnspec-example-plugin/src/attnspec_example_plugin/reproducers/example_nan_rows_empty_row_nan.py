import numpy as np
from attnspec_example_plugin.nan_rows import NanRowsBackend

r = np.random.default_rng(0)
q, k, v = r.standard_normal((3, 4)), r.standard_normal((5, 4)), r.standard_normal((5, 4))
mask = np.ones((3, 5), bool)
mask[1] = False  # query 1 sees no key
out = NanRowsBackend().sdpa(q, k, v, mask=mask)
assert np.isnan(out[1]).all()  # the spec: 0
