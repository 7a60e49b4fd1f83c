"""ARCHITECTURE.md's import rules hold: each folder imports from attnspec only what its table allows.

Every ``import`` and ``from ... import`` of every module is read, those inside functions too (the
kit imports frameworks and heavy layers lazily, and a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
#: folder -> the name its modules have under attnspec (the root's leaf modules are their own)
FOLDERS = {
    "spec": "spec",
    "backends": "backends",
    "conformance": "conformance",
    "bench": "bench",
    "reports": "reports",
    "src/attnspec": "",
}


def allowed() -> dict[str, set[str]]:
    """The table at the end of ARCHITECTURE.md: folder -> the attnspec modules it may import."""
    rows = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        m = re.match(r"\| `([\w/]+)` \| (.+) \|$", line)
        if m:
            rows[m.group(1)] = {x.strip().strip("`") for x in m.group(2).split(",")}
    return rows


def imported(folder: str, root: Path = ROOT) -> dict[str, set[str]]:
    """attnspec's top-level names (``spec``, ``_errors``, ``the root`` for ``attnspec`` itself)
    the modules of ``folder`` import, each with the files that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted((root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] != "attnspec":
                    continue
                top = parts[1] if len(parts) > 1 else "the root"
                found.setdefault(top, set()).add(str(path.relative_to(root)))
    return found


def test_the_table_names_every_folder():
    assert set(allowed()) == set(FOLDERS)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_a_folder_imports_only_what_the_map_allows(folder):
    rules = allowed()[folder]
    if rules == {"everything"}:
        return
    own = FOLDERS[folder]
    bad = {top: files for top, files in imported(folder).items() if top != own and top not in rules}
    assert not bad, f"{folder} imports {sorted(bad)} (ARCHITECTURE.md allows {sorted(rules)}): {bad}"


def test_the_reader_sees_a_lazy_import(tmp_path):
    """A spec module importing a backend inside a function is found (and the map forbids it)."""
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "x.py").write_text("def f():\n    from attnspec.backends import get_backend\n")
    assert imported("spec", tmp_path) == {"backends": {"spec/x.py"}}
    assert "backends" not in allowed()["spec"]


def private_imports(folder: str, root: Path = ROOT) -> list[str]:
    """Imports by the modules of ``folder`` of a private module (a path segment starting with
    ``_``) or a private name of another folder's module: each as ``file: module.name``. A folder
    may use its own private helpers; what it takes from another folder must be public."""
    own = FOLDERS[folder]
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                pairs = [(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                pairs = [(a.name, "") for a in node.names]
            else:
                continue
            for module, name in pairs:
                parts = module.split(".")
                if parts[0] != "attnspec" or (own and len(parts) > 1 and parts[1] == own):
                    continue
                if any(p.startswith("_") for p in [*parts[1:], name] if p):
                    found.append(f"{path.relative_to(root)}: {module}.{name}".rstrip("."))
    return found


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_no_folder_takes_a_private_name_from_another(folder):
    assert private_imports(folder) == []


def test_the_private_import_reader_sees_one(tmp_path):
    """A backend importing a spec module's private helper, or a private module, is found; its
    own private module is not."""
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "x.py").write_text(
        "from attnspec.spec.sdpa import _helper, sdpa\n"
        "import attnspec.spec._hidden\n"
        "from attnspec.backends._own import thing\n"
    )
    assert private_imports("backends", tmp_path) == [
        "backends/x.py: attnspec.spec.sdpa._helper",
        "backends/x.py: attnspec.spec._hidden",
    ]


def chapter_private_imports(root: Path = ROOT) -> list[str]:
    """Private names crossing a conformance chapter (``conformance/test_*.py``): a chapter importing
    a ``_`` name (or ``_`` module) from another module, and any module of the package or the kit's
    tests importing a ``_`` name from a chapter. Each as ``file: module.name``. What chapters share
    lives in a public module (`attnspec.conformance.judge`, `attnspec.conformance.grads_cases`); a
    chapter may bind a public name to a local ``_`` alias (``judge_output as _judge_output``), which
    keeps its properties' source, and so Hypothesis' seeds for them, as it was."""
    found = []
    files = [p for folder in (*FOLDERS, "tests") for p in sorted((root / folder).rglob("*.py"))]
    for path in files:
        chapter = path.parent.name == "conformance" and path.name.startswith("test_")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module):
                continue
            parts = node.module.split(".")
            if node.level == 0 and parts[0] != "attnspec":
                continue
            from_chapter = parts[-1].startswith("test_")
            for a in node.names:
                private = a.name.startswith("_") or any(p.startswith("_") for p in parts[1:])
                if private and (chapter or from_chapter):
                    found.append(f"{path.relative_to(root)}: {node.module}.{a.name}")
    return found


def test_no_chapter_shares_a_private_name():
    assert chapter_private_imports() == []


def test_the_chapter_import_reader_sees_them(tmp_path):
    """A chapter taking a helper's private name, and a vectors module taking a chapter's, are found;
    a chapter's public name is not."""
    (tmp_path / "conformance").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "conformance" / "test_x.py").write_text(
        "from attnspec.conformance.test_sdpa import _judge_output, DTYPES\n"
        "from attnspec.conformance.hypothesis_helpers import _tag_visibility\n"
    )
    (tmp_path / "conformance" / "vectors_x.py").write_text(
        "def f():\n    from attnspec.conformance.test_grads import _vjp_case, golden_vjp\n"
    )
    assert chapter_private_imports(tmp_path) == [
        "conformance/test_x.py: attnspec.conformance.test_sdpa._judge_output",
        "conformance/test_x.py: attnspec.conformance.hypothesis_helpers._tag_visibility",
        "conformance/vectors_x.py: attnspec.conformance.test_grads._vjp_case",
    ]
