"""Pages generated at site build time from the committed results: the interactive atlas, the
conformance results per backend and per function, and the table of implementations each spec
clause's page shows. Pure rendering of ``reports/results/*.json`` and the declared deviations;
nothing here runs an implementation.

Wiring (docs/hooks.py and mkdocs.yml, the site core's):

- ``extra_css: [assets/atlas.css]`` and ``extra_javascript: [assets/atlas.js]`` in mkdocs.yml
  (the atlas grid's filters, sorting and reproducer dialog; plain JS, no framework, no CDN);
- ``write_pages(add_page)`` from a hook (``on_files``): it calls ``add_page(path, markdown)`` for
  every page (paths relative to docs/) and returns their paths in nav order, each section's
  ``index.md`` first;
- ``implementations_for(clause_id, page=...)`` from ``on_page_markdown`` of a spec page, with
  ``page`` the page's path relative to docs/ (``page.file.src_uri``), since its links are relative.

Importable as ``gen`` (docs/ on sys.path) or as ``docs.gen`` (the repository root on sys.path).
"""

from __future__ import annotations

from collections.abc import Callable

from .atlas_pages import INDEX as ATLAS_INDEX
from .atlas_pages import atlas_index, entry_page, implementations_for
from .data import atlas
from .results_pages import pages as results_pages

__all__ = ["implementations_for", "write_pages"]


def write_pages(add_page: Callable[[str, str], object]) -> list[str]:
    """Render every generated page through ``add_page(relative_path, markdown_text)``; return
    the paths in nav order (the atlas, its entries, then the results index, backends, functions)."""
    impls = atlas()
    written = [(ATLAS_INDEX, atlas_index(impls))]
    written += [(impl.page, entry_page(impl)) for impl in impls]
    written += results_pages()
    for path, text in written:
        add_page(path, text)
    return [path for path, _ in written]
