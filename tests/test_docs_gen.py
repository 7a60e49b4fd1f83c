"""docs/gen, the site's generated pages: rendered from the committed results, nothing run."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "reports" / "results"


def _load_gen():
    # by path, as the docs hook does (docs/ is not a package of the kit)
    spec = importlib.util.spec_from_file_location(
        "attnspec_docs_gen",
        ROOT / "docs" / "gen" / "__init__.py",
        submodule_search_locations=[str(ROOT / "docs" / "gen")],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_gen()

pytestmark = pytest.mark.skipif(not list(RESULTS.glob("atlas-*.json")), reason="no atlas results committed")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    out: dict[str, str] = {}
    nav = gen.write_pages(lambda path, text: out.__setitem__(path, text))
    assert nav == list(out), "write_pages must return every page it added, in order"
    return out


def test_every_question_names_real_clauses():
    from attnspec.backends.atlas.questions import QUESTIONS
    from attnspec.spec.clauses import CLAUSES

    data = sys.modules["attnspec_docs_gen.data"]
    assert {q.id for q in QUESTIONS} <= set(data.QUESTION_CLAUSES), "a question with no clause listed"
    unknown = {c for cs in data.QUESTION_CLAUSES.values() for c in cs} - set(CLAUSES)
    assert not unknown


def test_implementations_for_a_covered_clause():
    text = gen.implementations_for("sdpa.empty_row", page="spec/empty_row.md")
    rows = [line for line in text.splitlines() if line.startswith("| [`")]
    backends = {json.loads(p.read_text())["backend"] for p in RESULTS.glob("atlas-*.json")}
    assert len(rows) >= 5 and all("../atlas/index.md#impl-" in r for r in rows)
    assert any(f"`{b}`" in text for b in backends)
    deviating = [r for r in rows if "**deviates**" in r]
    assert deviating and all("#repro-empty-row" in r for r in deviating if "[reproducer]" in r)
    assert "mlx.empty-row-mean-v" in text  # declared in backends/atlas/deviations.toml
    # links are relative to the page the table goes on
    assert "](atlas/index.md#" in gen.implementations_for("sdpa.empty_row", page="index.md")


def test_implementations_for_an_unmeasured_clause_says_so():
    text = gen.implementations_for("lsh.dedup", page="spec/lsh.md")
    assert text.count("\n") == 1 and "asks no question" in text
    with pytest.raises(KeyError):
        gen.implementations_for("sdpa.no_such_clause")


def test_pages_written_and_small(pages):
    assert "atlas/index.md" in pages and "results/index.md" in pages
    assert any(p.startswith("results/backends/") for p in pages)
    assert any(p.startswith("results/functions/") for p in pages)
    for path, text in pages.items():
        assert len(text.encode()) < 400_000, f"{path}: {len(text)} characters"
        assert text.startswith("# ") or text.startswith("---\n"), path


def test_every_answer_with_a_reproducer_has_one_on_the_site(pages):
    grid = pages["atlas/index.md"]
    checked = 0
    for path in sorted(RESULTS.glob("atlas-*.json")):
        doc = json.loads(path.read_text())
        entry = pages[f"atlas/{gen.data.slug(doc['backend'])}.md"]
        shown = {
            m.group(1): html.unescape(m.group(2))
            for m in re.finditer(
                r'<pre class="atlas-repro" id="repro-([a-z0-9-]+)"[^>]*><code>(.*?)</code></pre>', entry, re.S
            )
        }
        for a in doc["answers"]:
            if not a["reproducer"]:
                continue
            anchor = gen.data.slug(a["id"])
            assert f"{gen.data.slug(doc['backend'])}.md#repro-{anchor})" in grid, (doc["backend"], a["id"])
            assert shown.get(anchor) == a["reproducer"].rstrip(), (doc["backend"], a["id"])
            checked += 1
    assert checked > 100


def test_results_pages_show_failures_with_cause_and_clauses(pages):
    failing = [json.loads(p.read_text()) for p in RESULTS.glob("conformance-*.json")]
    failing = [d for d in failing if d.get("failures")]
    if not failing:
        pytest.skip("no failure in the committed results")
    doc = failing[0]
    page = pages[f"results/backends/{gen.data.slug(doc['backend'])}.md"]
    assert "FAILS" in page
    f = doc["failures"][0]
    assert f["cause"].split(" [clause")[0][:60] in page
    assert all(f"`{c}`" in page for c in f.get("clauses") or [])
