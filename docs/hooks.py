"""mkdocs hooks of the attnspec site (mkdocs.yml, ``hooks:``).

- ``on_files``: adds the generated pages (the specification, from docs/spec/_rules.toml and the
  code; the atlas and report pages of ``docs/gen``), the repository's Markdown files and the other
  repository files the pages link to (`_build.repo_links`), and drops from the nav the pages that
  do not exist in this checkout yet (the guide pages the lead writes on main).
- ``on_page_markdown``: rewrites links to repository files to their place in the site.
- ``on_page_content``: LaTeX to MathML (`_build.mathml`).
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent


def _on_path() -> None:
    """docs/ on sys.path: _build (ours) and gen (the atlas' generator) import from it. mkdocs puts
    it there only while it loads this file, so every hook that imports checks again."""
    if str(DOCS) not in sys.path:
        sys.path.insert(0, str(DOCS))


_on_path()

from _build import mathml, spec_pages  # noqa: E402
from _build.repo_links import PREFIX, Links, github_slug  # noqa: E402

log = logging.getLogger("mkdocs.plugins.attnspec")

#: repository Markdown files that are pages of the site in any case, at repo/<path>
REPO_MARKDOWN = (
    "CONTRIBUTING.md",
    "ARCHITECTURE.md",
    "spec/README.md",
    "spec/CHANGELOG.md",
    "conformance/VECTORS.md",
    "reports/performance.md",
    "reports/gpu.md",
    "reports/mutation.md",
)

_links = Links(ROOT)


def _gen_pages(add_page) -> list[str]:
    """The atlas and report pages of ``docs/gen``, when it exists in this checkout."""
    _on_path()
    try:
        from gen import write_pages
    except ImportError as e:
        log.info(f"docs/gen does not provide write_pages yet ({e}): no atlas or report pages")
        return []
    return list(write_pages(add_page))


def _prune(nav: list, exists) -> list:
    """``nav`` without the entries whose page does not exist (and sections left empty)."""
    kept = []
    for item in nav:
        if isinstance(item, str):
            if exists(item):
                kept.append(item)
        elif isinstance(item, dict):
            ((title, value),) = item.items()
            if isinstance(value, list):
                value = _prune(value, exists)
                if value:
                    kept.append({title: value})
            elif isinstance(value, str) and ("://" in value or exists(value)):
                kept.append(item)
    return kept


def on_config(config):
    config["mdx_configs"].setdefault("toc", {})["slugify"] = github_slug
    return config


def _with_generated(nav: list, gen_nav: list[str]) -> list:
    """``nav`` with the pages of ``docs/gen``: the atlas (its index first) under "Atlas", the
    results' index and their pages by backend and by function first under "Reports"."""
    atlas = [p for p in gen_nav if p.startswith("atlas/")]
    results = [p for p in gen_nav if p not in atlas]
    grouped: list = [p for p in results if p.count("/") < 2]
    for folder, title in (("backends", "By backend"), ("functions", "By function")):
        pages = [p for p in results if p.split("/")[1:2] == [folder] and p.count("/") == 2]
        if pages:
            grouped.append({title: pages})
    grouped += [p for p in results if p.count("/") >= 2 and p.split("/")[1] not in ("backends", "functions")]
    nav = list(nav)
    for title, entries in (("Atlas", atlas), ("Reports", grouped)):
        if not entries:
            continue
        titles = [next(iter(item)) if isinstance(item, dict) else None for item in nav]
        if title in titles:
            section = nav[titles.index(title)]
            section[title] = [*entries, *section[title]]
        elif "Reports" in titles:  # the atlas goes before the reports
            nav.insert(titles.index("Reports"), {title: entries})
        else:
            nav.append({title: entries})
    return nav


def on_files(files: Files, config) -> Files:
    global _links
    _links = Links(ROOT)  # afresh on every build: `mkdocs serve` rebuilds in one process
    generated: dict[str, str] = {}

    def add_page(path: str, markdown: str) -> None:
        generated[path] = markdown

    _on_path()
    for path, text in spec_pages.pages().items():
        add_page(path, text)
    gen_nav = _gen_pages(add_page)
    for path, text in generated.items():
        if files.get_file_from_path(path) is not None:
            files.remove(files.get_file_from_path(path))
        files.append(File.generated(config, path, content=text))

    # the repository's files: its Markdown as pages, the rest as they are, all under repo/
    _links.collect([(f.src_uri, f.content_string) for f in files if f.is_documentation_page()], REPO_MARKDOWN)
    for path, text in _links.pages.items():
        files.append(File.generated(config, PREFIX + path, content=text))
    for path, text in _links.listings.items():
        if files.get_file_from_path(path) is None:
            files.append(File.generated(config, path, content=text))
    for path in sorted(_links.copies):
        files.append(File.generated(config, PREFIX + path, abs_src_path=str(ROOT / path)))

    nav = _with_generated(config["nav"] or [], gen_nav)
    config["nav"] = _prune(nav, lambda p: files.get_file_from_path(p) is not None)
    return files


#: the semantics page, whose clause table links each clause to its section of the specification
SEMANTICS = PREFIX + "spec/README.md"
_CLAUSE_ROW = re.compile(r"^\| `([a-z0-9_.]+)` \|", re.M)


def _link_clauses(markdown: str) -> str:
    """The semantics page's clause table (between its clauses markers), each id a link."""
    pages = spec_pages.clause_pages(spec_pages.load_groups())
    head, sep, rest = markdown.partition("<!-- clauses:begin -->")
    table, end, tail = rest.partition("<!-- clauses:end -->")
    if not sep or not end:
        return markdown

    def link(mt: re.Match) -> str:
        cid = mt.group(1)
        if cid not in pages:
            return mt.group(0)
        return f"| [`{cid}`](../../{pages[cid]}#{cid}) |"

    return head + sep + _CLAUSE_ROW.sub(link, table) + end + tail


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == SEMANTICS:
        markdown = _link_clauses(markdown)
    return _links.rewrite(page.file.src_uri, markdown)


def on_page_content(html: str, page, config, files) -> str:
    return mathml.to_mathml(html, page.file.src_uri)
