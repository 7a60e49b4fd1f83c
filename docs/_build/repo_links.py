"""Links to repository files, made to work in the site.

The guide pages and the repository's Markdown link to other files of the repository by relative
paths that work on GitHub (``../../spec/README.md`` from docs/guide/, ``backends/authoring.py``
from CONTRIBUTING.md). In the site every repository file outside docs/ lives under ``repo/``, at
its repository path: a Markdown file becomes a page (``spec/README.md`` -> ``repo/spec/README.md``,
served as ``repo/spec/``), any other file is copied as it is, a folder links to its README.md.
`Links` finds what the pages link to (following links from the repository pages it adds, so their
own links resolve too) and rewrites each link to the page or file's place in the site. A link whose
target does not exist is left as written, so that the strict build reports it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable
from pathlib import Path

PREFIX = "repo/"
#: the page that stands for a linked folder without a README.md: a list of its files, as GitHub shows
LISTING = "index.md"
_SKIP = ("__pycache__", ".")
_INLINE = re.compile(r"(\]\(\s*<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\s*\))")
_REFERENCE = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*<?)(\S+?)(>?(?:\s.*)?)$", re.M)
_HTML = re.compile(r"((?:href|src)=\")([^\"]+)(\")")
_FENCE = re.compile(r"^\s*(```|~~~)")


def github_slug(value: str, separator: str = "-") -> str:
    """GitHub's id of a heading: lower case, punctuation dropped (``<`` and ``>`` of a code span
    included, their text kept), each space one separator. The site's headings take the same ids
    (docs/hooks.py), so the repository's Markdown links its own headings alike."""
    value = re.sub(r"[^\w\- ]", "", value.strip().lower())
    return value.replace(" ", separator)


def repo_path(src_uri: str) -> str:
    """The repository path of the page or file at ``src_uri`` in the site."""
    return src_uri[len(PREFIX) :] if src_uri.startswith(PREFIX) else f"docs/{src_uri}"


def site_path(path: str) -> str:
    """Where repository file ``path`` lives in the site (docs-relative)."""
    return path[len("docs/") :] if path.startswith("docs/") else PREFIX + path


def _outside_code(text: str, fix: Callable[[str], str]) -> str:
    """``fix`` applied to the text outside fenced code blocks and inline code spans."""
    out, chunk, fenced = [], [], None
    for line in text.splitlines(keepends=True):
        mark = _FENCE.match(line)
        if fenced is None and mark:
            out.append(fix("".join(chunk)))
            chunk, fenced = [line], mark.group(1)
        elif fenced is not None:
            chunk.append(line)
            if line.strip().startswith(fenced) and len(chunk) > 1:
                out.append("".join(chunk))
                chunk, fenced = [], None
        else:
            chunk.append(line)
    out.append("".join(chunk) if fenced is not None else fix("".join(chunk)))
    return "".join(out)


def _outside_spans(text: str, fix: Callable[[str], str]) -> str:
    parts = re.split(r"(`+[^`]*?`+)", text)
    return "".join(p if i % 2 else fix(p) for i, p in enumerate(parts))


def targets(text: str) -> list[str]:
    found: list[str] = []

    def collect(chunk: str) -> str:
        for pattern in (_INLINE, _REFERENCE, _HTML):
            found.extend(mt.group(2) for mt in pattern.finditer(chunk))
        return chunk

    _outside_code(text, lambda t: _outside_spans(t, collect))
    return found


def split_link(target: str) -> tuple[str, str] | None:
    """(path, #fragment) of a relative link; None for a URL, an anchor, an absolute path."""
    if not target or target.startswith(("#", "/")) or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None
    path, hash_, fragment = target.partition("#")
    path = path.split("?", 1)[0]
    return path, hash_ + fragment


def listing(root: Path, folder: str) -> str:
    """A page listing the files of ``folder`` (its subfolders named, not followed)."""
    entries = sorted(p for p in (root / folder).iterdir() if not p.name.startswith(_SKIP))
    lines = [f"# `{folder}/`", "", "The files of this folder of the repository.", ""]
    for p in entries:
        lines.append(f"- `{p.name}/`" if p.is_dir() else f"- [`{p.name}`]({p.name})")
    return "\n".join(lines) + "\n"


class Links:
    """What the site's pages link to in the repository, and how to rewrite those links."""

    def __init__(self, root: Path):
        self.root = root
        self.pages: dict[str, str] = {}  # repository path -> text, of the Markdown files added as pages
        self.copies: set[str] = set()  # repository paths copied as plain files
        self.listings: dict[str, str] = {}  # docs-relative path -> text, of docs/ folders' listings

    def resolve(self, from_src_uri: str, target: str) -> str | None:
        """The repository path ``target`` points at from the page at ``from_src_uri``, when it is
        a file outside docs/ that exists (or a folder with a README.md); else None."""
        split = split_link(target)
        if split is None or not split[0]:
            return None
        base = posixpath.dirname(repo_path(from_src_uri))
        path = posixpath.normpath(posixpath.join(base, split[0]))
        if path.startswith("..") or path.startswith("docs/") or path == "docs":
            return None
        full = self.root / path
        if full.is_dir() and path != ".":
            for index in ("README.md", LISTING):  # a folder's own index page, else a listing
                if (full / index).is_file():
                    return f"{path}/{index}"
            return f"{path}/{LISTING}"
        return path if full.is_file() else None

    def collect(self, pages: Iterable[tuple[str, str]], repo_markdown: Iterable[str]) -> None:
        """Find the repository files linked from ``pages`` ((src_uri, markdown) pairs), starting
        with the Markdown files ``repo_markdown`` that are pages in any case; linked Markdown files
        become pages too and their links are followed."""
        todo = [(src, text) for src, text in pages]
        for path in repo_markdown:
            if (self.root / path).is_file() and path not in self.pages:
                self.pages[path] = (self.root / path).read_text()
                todo.append((PREFIX + path, self.pages[path]))
        while todo:
            src, text = todo.pop()
            for target in targets(text):
                self._docs_folder(src, target)
                found = self.resolve(src, target)
                if found is None or found in self.pages or found in self.copies:
                    continue
                if found.endswith(f"/{LISTING}") and not (self.root / found).is_file():
                    self.pages[found] = listing(self.root, found.rpartition("/")[0])
                    todo.append((PREFIX + found, self.pages[found]))
                elif found.endswith(".md"):
                    self.pages[found] = (self.root / found).read_text()
                    todo.append((PREFIX + found, self.pages[found]))
                else:
                    self.copies.add(found)

    def _docs_folder(self, src: str, target: str) -> None:
        """A repository page's link to a folder of docs/ with no index page: list its pages."""
        split = split_link(target)
        if not src.startswith(PREFIX) or split is None or not split[0]:
            return
        path = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path(src)), split[0]))
        full = self.root / path
        if path.startswith("docs/") and full.is_dir() and not (full / LISTING).is_file():
            self.listings.setdefault(posixpath.join(site_path(path), LISTING), listing(self.root, path))

    def rewrite(self, src_uri: str, text: str) -> str:
        """``text`` of the page at ``src_uri`` with every link to a repository file pointing at
        that file's place in the site."""
        here = posixpath.dirname(src_uri)
        in_repo = src_uri.startswith(PREFIX)

        def fix_target(target: str) -> str:
            split = split_link(target)
            if split is None or not split[0]:
                return target
            path = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path(src_uri)), split[0]))
            found = self.resolve(src_uri, target)
            if found is not None:
                dest = site_path(found)
            elif in_repo and path.startswith("docs/"):
                dest = site_path(path)  # a repository page's link into docs/
                if (self.root / path).is_dir():
                    dest = posixpath.join(dest, LISTING)
            else:
                return target
            return posixpath.relpath(dest, here or ".") + split[1]

        def fix(chunk: str) -> str:
            for pattern in (_INLINE, _REFERENCE, _HTML):
                chunk = pattern.sub(lambda mt: mt.group(1) + fix_target(mt.group(2)) + mt.group(3), chunk)
            return chunk

        return _outside_code(text, lambda t: _outside_spans(t, fix))
