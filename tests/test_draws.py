"""Which cases the conformance suite draws: the same for every backend name and install location
(`attnspec.conformance.plugin.stable_case_key`), and a refused draw is drawn again
(`conformance/conftest.py`, ``_refused``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from suite_runs import suite_command

SELECTION = "test_sdpa.py and test_matches_golden and float64"


def _cases(cwd: Path, backend: str) -> list[tuple]:
    """The sdpa matches_golden float64 cases of a dev run of ``backend`` started in ``cwd``, in order."""
    cwd.mkdir(parents=True, exist_ok=True)
    journal = cwd / "journal.jsonl"
    cmd = suite_command(backend, "dev", "--attn-journal", str(journal), "-k", SELECTION)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    return [
        (e["feature"], e["status"], json.dumps(e["shapes"], sort_keys=True), tuple(e["tags"]))
        for e in events
        if e["event"] == "case"
    ]


def test_every_backend_name_and_install_location_draws_the_same_cases(tmp_path):
    """Hypothesis keys derandomized draws by the pytest node id, which holds the backend's name and
    the path the suite was collected from; the plugin keys them by property and parameters only.
    Before that, CI's installed suite and a checkout drew different cases, and so did two names of
    one backend."""
    by_name = _cases(tmp_path / "a", "numpy")
    by_path = _cases(tmp_path / "b" / "c", "attnspec.backends.numpy:NumpyBackend")
    assert len(by_name) > 12  # corners and drawn cases
    assert by_name == by_path


def test_a_refused_draw_is_drawn_again(tmp_path):
    """A backend refusing biases and causal masks meets more cases it can run than one recording every
    refusal as a case: its refusals are replaced, up to the profile's count of redraws."""
    plugin = tmp_path / "refusing.py"
    plugin.write_text(
        "from attnspec.backends.numpy import NumpyBackend\n"
        "class Refusing(NumpyBackend):\n"
        "    name = 'no-bias-no-causal'\n"
        "    def supports(self, feature, **kw):\n"
        "        why = super().supports(feature, **kw)\n"
        "        return why + [f'takes no {o}' for o in ('bias', 'causal') if kw.get(o) is not None]\n"
    )
    cases = _cases(tmp_path, "refusing:Refusing")
    ran = [c for c in cases if c[1] == "passed"]
    refused = [c for c in cases if c[1] == "unsupported"]
    full = [c for c in _cases(tmp_path / "full", "numpy") if c[1] == "passed"]
    assert len(refused) > 3, "the selection draws biases and causal masks: some draws must be refused"
    # a refused drawn case is not one of the 12: the run still meets 12 drawn cases it can run,
    # besides the corners (which carry a bias, so are refused and recorded)
    drawn_ran = [c for c in ran if not c[0].startswith("corner_")]
    drawn_full = [c for c in full if not c[0].startswith("corner_")]
    assert len(drawn_ran) == len(drawn_full) == 12, (len(drawn_ran), len(drawn_full))


def test_a_reproducer_rebuilds_every_array_with_its_shape():
    """A reproducer's arrays are Python literals; an empty one (n = 0, an empty cache) keeps its
    shape: ``np.array([])`` would be (0,), and the reproducer would fail on its own inputs (found
    by a new user's MLX check: the repro of an n = 0 failure raised SpecError on q.ndim=1)."""
    import ml_dtypes
    import numpy as np

    from attnspec.conformance.fp8_cases import _array
    from attnspec.conformance.hypothesis_helpers import array_source

    for shape in [(1, 2, 0, 4), (2, 0), (0,), (3, 1)]:
        for x, expr in [
            (np.ones(shape, np.float32), "np.float32"),
            (np.ones(shape, ml_dtypes.bfloat16), "ml_dtypes.bfloat16"),
            (np.ones(shape, bool), "np.float32"),
            (np.ones(shape, np.int32), "np.float32"),
        ]:
            rebuilt = eval(array_source(x, expr), {"np": np, "ml_dtypes": ml_dtypes})
            assert rebuilt.shape == x.shape and np.array_equal(
                rebuilt.astype(np.float64), x.astype(np.float64)
            )
        fp8 = np.ones(shape, np.float32).astype(ml_dtypes.float8_e4m3fn)
        assert eval(_array(fp8), {"np": np, "ml_dtypes": ml_dtypes}).shape == shape


def _drawn_by(tmp_path: Path, source: str, hooked: bool, wrapped: bool = False) -> list[int]:
    """The integers a derandomized property written as ``source`` draws, seeded by the plugin's hook
    (as in a suite run) when ``hooked``, else by Hypothesis' digest of its source text; ``wrapped``:
    pytest sees it through a `functools.wraps` wrapper, as `with_corners` makes one."""
    import importlib.util
    from types import SimpleNamespace

    from attnspec.conformance import plugin

    path = tmp_path / f"prop_{abs(hash(source))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    item = SimpleNamespace(
        obj=module.wrapped if wrapped else module.test_prop,
        config=SimpleNamespace(getoption=lambda name: "numpy"),
        path=Path("test_sdpa.py"),
        originalname="test_prop",
        name="test_prop[float32]",
        callspec=SimpleNamespace(params={"dtype": "float32", "attn_backend_name": "numpy"}),
    )
    if hooked:
        plugin.pytest_runtest_call(item)
    item.obj()
    return module.seen


_PROPERTY = """import functools

from hypothesis import given, settings, strategies as st

seen = []


@settings(derandomize=True, max_examples=8, database=None)
@given(st.integers(0, 10**9))
def test_prop(x):
    seen.append({})


wrapped = functools.wraps(test_prop)(lambda: test_prop())
"""


def test_a_property_laid_out_anew_draws_the_same_cases(tmp_path):
    """A suite run seeds each property by its name and parameters (`plugin.case_seed`), so a
    formatter's reflow of a property's body leaves its cases as they were; Hypothesis' own seed, a
    digest of the source text, does not (the control)."""
    plain, reflowed = _PROPERTY.format("x"), _PROPERTY.format("\n        x\n    ")
    hooked = _drawn_by(tmp_path, plain, hooked=True)
    assert hooked == _drawn_by(tmp_path, reflowed, hooked=True)
    assert len(set(hooked)) > 4
    assert hooked == _drawn_by(tmp_path, reflowed, hooked=True, wrapped=True)
    assert _drawn_by(tmp_path, plain, hooked=False) != _drawn_by(tmp_path, reflowed, hooked=False)
