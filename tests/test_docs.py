"""The documentation site's invariants, checked without building it (``nox -s docs`` builds it)."""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import re
import sys
from pathlib import Path

import pytest

from attnspec.spec.clauses import CLAUSES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RULES = tomllib.loads((DOCS / "spec" / "_rules.toml").read_text())


@pytest.fixture(scope="module")
def build():
    """docs/_build, imported as docs/hooks.py imports it."""
    sys.path.insert(0, str(DOCS))
    try:
        import _build.examples
        import _build.pictures
        import _build.repo_links
        import _build.spec_pages
        import _build.svg

        yield _build
    finally:
        sys.path.remove(str(DOCS))


def _rule_ids() -> list[str]:
    return [c["id"] for g in RULES["group"] for c in g.get("clauses", [])]


def test_every_clause_in_exactly_one_group():
    ids = _rule_ids()
    twice = sorted({cid for cid in ids if ids.count(cid) > 1})
    assert not twice, f"clauses in more than one group of docs/spec/_rules.toml: {twice}"
    assert set(ids) == set(CLAUSES), (
        f"missing from docs/spec/_rules.toml: {sorted(set(CLAUSES) - set(ids))}; "
        f"not clauses: {sorted(set(ids) - set(CLAUSES))}"
    )


def test_every_clause_has_definition_and_example(build):
    for g in RULES["group"]:
        assert g["intro"].strip(), f"group {g['slug']} has no intro"
        for c in g["clauses"]:
            assert c.get("math", "").strip(), f"{c['id']} has no LaTeX definition"
    assert set(build.examples.EXAMPLES) == set(CLAUSES)


def test_latex_converts():
    convert = pytest.importorskip("latex2mathml.converter").convert
    for g in RULES["group"]:
        blocks = re.findall(r"\$\$(.+?)\$\$", g["intro"], re.S)
        blocks += [c["math"] for c in g["clauses"]]
        for c in g["clauses"]:
            blocks += re.findall(r"\$([^$]+)\$", c.get("text", ""))
        for latex in blocks:
            assert convert(latex.strip()).startswith("<math"), latex


def _nav_pages(nav) -> list[str]:
    found = []
    for item in nav:
        value = item if isinstance(item, str) else next(iter(item.values()))
        if isinstance(value, list):
            found += _nav_pages(value)
        elif "://" not in value:
            found.append(value)
    return found


def test_every_nav_page_exists():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    generated = {"spec/index.md", *(f"spec/{g['slug']}.md" for g in RULES["group"])}
    missing = []
    for page in _nav_pages(config["nav"]):
        source = ROOT / page[len("repo/") :] if page.startswith("repo/") else DOCS / page
        if page not in generated and not source.is_file():
            missing.append(page)
    assert not missing, f"nav pages with no source: {missing}"
    assert generated <= set(_nav_pages(config["nav"])), "a specification page is not in the nav"


def test_repo_links_rewritten(build):
    links = build.repo_links.Links(ROOT)
    page = "See [the semantics](../../spec/README.md#decisions) and [code](../../backends/authoring.py).\n"
    page += "```\n[not a link](../../spec/README.md)\n```\n"
    out = links.rewrite("guide/check.md", page)
    assert "(../repo/spec/README.md#decisions)" in out
    assert "(../repo/backends/authoring.py)" in out
    assert "[not a link](../../spec/README.md)" in out  # code is left alone
    # a repository page's links: into docs/, to a sibling, to a folder with a README
    text = "[guide](docs/guide/check.md) [spec](spec/README.md) [c](examples/c-sdpa/)"
    out = links.rewrite("repo/CONTRIBUTING.md", text)
    assert "(../guide/check.md)" in out
    assert "(spec/README.md)" in out
    assert "(examples/c-sdpa/README.md)" in out
    assert links.rewrite("index.md", "[x](../no/such/file.md)") == "[x](../no/such/file.md)"


def test_repo_links_collected(build):
    links = build.repo_links.Links(ROOT)
    links.collect([("guide/x.md", "[a](../../spec/README.md) [b](../../backends/authoring.py)")], ())
    assert "spec/README.md" in links.pages
    assert "backends/authoring.py" in links.copies
    assert "spec/CHANGELOG.md" in links.pages  # followed from spec/README.md


def test_versions_from_changelog(build):
    versions = build.spec_pages.clause_versions()
    assert versions["sdpa_fp8.definition"][0] == "1.1.0"
    assert versions["sdpa.empty_row"][0] == "1.0.0"


def test_every_example_runs(build):
    """Each clause's worked example runs against the spec and its picture is an (n, m) grid."""
    for cid in CLAUSES:
        worked = build.examples.run(cid)
        assert worked is not None and worked.values, cid
        assert "return" in worked.source, cid
        if worked.picture is not None:
            assert worked.picture.ndim == 2 and worked.picture.dtype == bool, cid


def test_every_clause_has_a_picture(build):
    """Each clause's section draws one picture: its example's visibility grid, or one computed from
    the spec by `_build.pictures`; never both (one would hide the other)."""
    import warnings

    for cid in CLAUSES:
        has_mask = build.examples.run(cid).picture is not None
        assert has_mask != (cid in build.pictures.PICTURES), cid
        if has_mask:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            pic = build.pictures.PICTURES[cid]()
        n, m = pic.cells.shape
        assert n and pic.caption and pic.legend, cid
        for extra in (pic.shade, pic.text):
            assert extra is None or extra.shape == (n, m), cid
        drawn = build.svg.draw(pic, cid)
        assert drawn.count("<rect") >= n * m, cid


def test_gqa_picture_is_contiguous_groups(build):
    """The GQA picture is the spec's own head map: query head h reads kv head h // G."""
    read = build.pictures._head_map(6, 2)
    assert (read.argmax(1) == [0, 0, 0, 1, 1, 1]).all()


def test_every_relative_link_in_the_repository_resolves(build):
    """`mkdocs build --strict` fails on a link to a moved file; this finds it in a second."""
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    dead = []
    for name in tracked.stdout.split():
        page = ROOT / name
        for target in build.repo_links.targets(page.read_text(encoding="utf-8")):
            split = build.repo_links.split_link(target)
            if split is None or not split[0]:
                continue
            path = (page.parent / split[0]).resolve()
            if path.is_relative_to(DOCS) and not path.exists():
                continue  # a page the site generates (spec/, atlas/, results/): the strict build checks it
            if not path.exists():
                dead.append(f"{name}: {target}")
    assert not dead, "links to nothing:\n" + "\n".join(dead)
