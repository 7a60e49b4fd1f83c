"""The mutation run's parts (#28): the reference conforms, the gap the issue names is now caught,
the driver maps a mutated line to the conventions it reaches, and the report renders.

The run itself is `nox -s mutation` (hours); CI runs its sample of 20 mutants."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MUTATION = REPO / "tests" / "mutation"
sys.path.insert(0, str(MUTATION))

import check_mutant  # noqa: E402
import filters  # noqa: E402
from results import summarise  # noqa: E402

CHECK = [sys.executable, "-m", "attnspec", "check"]
CONVENTION = ["--convention", f"{MUTATION / 'reference_convention.py'}:SPEC_KEYWORDS", "--arrays", "numpy"]


def _check(target: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CHECK, f"{target}:sdpa", *CONVENTION, "--profile", "dev", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )


@pytest.mark.proof
def test_reference_conforms(tmp_path):
    """The mutation target is a correct sdpa: every mutant starts from a verdict of CONFORMS."""
    proc = _check(MUTATION / "reference_sdpa.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CONFORMS" in proc.stderr and "needs run (26 of 26)" in proc.stderr


@pytest.mark.proof
def test_window_one_key_too_wide_fails(tmp_path):
    """The gap the issue names: a window showing one key too many on the right passed every sdpa
    property in dev and default; corner_window_edge catches it now."""
    source = (MUTATION / "reference_sdpa.py").read_text()
    edge = "cols[None, :] <= a[:, None] + window[1]"
    assert source.count(edge) == 1
    mutant = tmp_path / "wide_window.py"
    mutant.write_text(source.replace(edge, edge + " + 1"))
    proc = _check(mutant, tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "corner_window_edge" in proc.stderr


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize(
    ("module", "text", "expected"),
    [
        ("conventions/__init__.py", "why.append(\"the flash convention's causal is lower-right", {"flash"}),
        (
            "conventions/__init__.py",
            'kw["enable_gqa"] = True',
            {"torch_sdpa", "torch_sdpa+canonical", "torch_sdpa_keywords"},
        ),
        (
            "conventions/__init__.py",
            "kw[name] = full_mask(p, lib, kw[name], dev)",
            {"jax", "keras", "jax+canonical"},
        ),
        (
            "conventions/flash.py",
            'kw["softmax_scale"] = p.scale',
            {"flash_kvcache", "flash_varlen", "flash_kvcache_paged"},
        ),
        ("conventions/paged.py", 'kw["sliding_window"] = p.window[0] + 1', {"vllm_paged"}),
        (
            "conventions/paged.py",
            "size = block_sizes[seed % len(block_sizes)]",
            {"flash_kvcache_paged", "vllm_paged"},
        ),
    ],
)
def test_a_mutated_line_reaches_its_conventions(monkeypatch, module, text, expected):
    monkeypatch.setattr(check_mutant, "PRISTINE", REPO / "backends")
    _, conventions = check_mutant.reached(module, _line_of(REPO / "backends" / module, text))
    assert set(conventions) == expected


def test_the_correct_functions_keep_their_signatures_contracts():
    """A correct function is as strict as the library it stands for, or a convention mutant that
    breaks the contract passes through it: the tutorial's Q @ K^T takes no GQA but one kv head,
    FlashAttention's maxima are the longest sequences, a canonical function takes 4-D arrays and
    full-size masks."""
    import adapters
    import numpy as np

    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 4, 3, 8)), rng.standard_normal((1, 2, 5, 8))
    with pytest.raises(ValueError, match="do not broadcast"):
        adapters.tutorial_ok(q, k, k)
    out, weights = adapters.tutorial_ok(q, k[:, :1], k[:, :1])  # one kv head broadcasts, as matmul does
    assert out.shape == (1, 4, 3, 8) and weights.shape == (1, 4, 3, 5)
    packed, cu = rng.standard_normal((5, 2, 8)), np.array([0, 2, 5], np.int32)
    assert adapters.flash_varlen_ok(packed, packed, packed, cu, cu, 3, 3).shape == (5, 2, 8)
    with pytest.raises(ValueError, match="max_seqlen_k=4"):
        adapters.flash_varlen_ok(packed, packed, packed, cu, cu, 3, 4)
    with pytest.raises(ValueError, match="4-D"):
        adapters.torch_sdpa_canonical_ok(q[0], k[0], k[0])
    with pytest.raises(ValueError, match="full-size"):
        adapters.torch_sdpa_canonical_ok(q, q, q, np.ones((1, 1, 3, 3), bool))
    assert adapters.torch_sdpa_canonical_ok(q, q, q, np.ones((1, 4, 3, 3), bool)).shape == (1, 4, 3, 8)
    assert set(adapters.SUBJECTS) == set(check_mutant.CONVENTION_CLASSES)


def test_filters_know_annotations_and_definitions():
    import ast

    path = REPO / "backends" / "conventions" / "__init__.py"
    tree = ast.parse(path.read_text())
    assert filters.definition_at(tree, _line_of(path, "def extend(")) == "Convention.extend"
    assert filters.definition_at(tree, _line_of(path, 'kw["enable_gqa"] = True')) == "TorchSDPA.call"
    spans = filters.annotation_spans(tree)
    line = _line_of(path, "def _first(result: Any) -> Any:")
    assert any(s[0] == line for s, _ in spans)  # result: Any and -> Any
    assert "Convention.extend" in filters.OUT_OF_SCOPE
    # a sample key does not move when the line is indented differently or moves
    assert filters.sample_key("f.py", "op", "    x = a + b", 10) == filters.sample_key(
        "f.py", "op", "x = a + b", 6
    )


def test_results_and_page():
    from attnspec.reports.mutation import mutation_page

    mutants = [
        {
            "id": str(i),
            "target": "reference",
            "file": "tests/mutation/reference_sdpa.py",
            "line": i,
            "col": 0,
            "definition": "sdpa",
            "operator": "NumberReplacer",
            "occurrence": 0,
            "outcome": o,
            "why": "",
            "before": "a",
            "after": "b",
        }
        for i, o in enumerate(
            ["killed"] * 6 + ["timed_out", "survived_equivalent", "survived_gap", "skipped"]
        )
    ]
    mutants[7]["reason"] = "the same function"
    data = summarise(mutants, 12.0, None)
    t = data["totals"]
    assert (t["generated"], t["run"], t["killed"], t["survived_gap"]) == (10, 9, 6, 1)
    assert t["score"] == pytest.approx(7 / 8)
    page = mutation_page({**data, "workers": 2})
    assert "87.5%" in page and "the same function" in page and "1 mutants survive" in page


def test_a_bad_results_file_is_refused(tmp_path):
    from attnspec.reports._io import ResultsError
    from attnspec.reports.mutation import load

    path = tmp_path / "mutation.json"
    path.write_text('{"schema": "attnspec.mutation/0"}')
    with pytest.raises(ResultsError, match="schema"):
        load(path)


def test_a_long_target_gets_a_bounded_file_name():
    """Found by the conventions' run: a function named by a long path through a convention named by
    another path gave a suite-timing file name past the 255-byte limit, and the run died (OSError)."""
    from attnspec.conformance.run import slug

    long = (
        f"{MUTATION / 'adapters.py'}:torch_sdpa_keywords_ok@{MUTATION / 'adapters.py'}:TORCH_SDPA_KEYWORDS"
        * 2
    )
    assert slug("numpy") == "numpy" and slug("numpy", 100) == "numpy"
    a, b = slug(long, 100), slug(long + "x", 100)
    assert len(a) == len(b) == 100 and a != b and a[:60] == b[:60]


def test_the_segments_tour_pads_queries_and_keys():
    """Found by the conventions' run: padding on both sides was left to a few drawn cases, so a
    varlen packing that paired padding queries with padding keys passed; the tour always has it."""
    import numpy as np

    from attnspec.conformance.corners import Tour
    from attnspec.conformance.hypothesis_helpers import variant_cases

    for seed in range(5):
        case = variant_cases("float32").attn_tour(Tour("segments", seed))
        assert case.feature == "segments"
        assert (np.asarray(case.options["q_segment_ids"])[..., -1] == -1).all()
        assert (np.asarray(case.options["kv_segment_ids"])[..., -1] == -1).all()


def test_every_recorded_mutant_names_a_line_that_exists():
    """The mutation records name a mutant by its file and source line, so an edit or a reflow of
    that line orphans the record: an equivalent entry would then excuse nothing, a CI sample entry
    would name a mutant that is no longer generated. Each must name a line of its file (stripped,
    as equivalent.toml writes them; whole, as ci_sample.toml does)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    orphans = []
    for record, strip in (("equivalent.toml", True), ("ci_sample.toml", False)):
        for entry in tomllib.loads((MUTATION / record).read_text(encoding="utf-8"))["mutant"]:
            lines = (REPO / entry["file"]).read_text(encoding="utf-8").splitlines()
            wanted = entry["before"] if strip else entry["line"]
            if wanted not in ([line.strip() for line in lines] if strip else lines):
                orphans.append(f"{record}: {entry['file']}: {wanted!r}")
    assert not orphans, "\n".join(orphans)
