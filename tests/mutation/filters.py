"""What the mutation run mutates, and which generated mutants it sets aside before running, each
rule with its reason (reports/mutation.md lists the counts).

- ``annotation``: a mutant inside a type annotation. Every module here starts with ``from
  __future__ import annotations``, so annotations are strings that are never evaluated: such a
  mutant is the same program (equivalent by construction).
- ``out of scope``: a definition of the convention modules that no conformance verdict of a correct
  or wrong function can reach (see OUT_OF_SCOPE), each with the tests that cover it instead.
- ``sample``: with ``--sample ci``, every mutant not listed in ci_sample.toml.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent

#: the modules of the conventions' target, under backends/ (the atlas' conventions are measured by
#: `nox -s atlas` against the frameworks themselves, which a worker does not install)
CONVENTION_MODULES = ("conventions/__init__.py", "conventions/flash.py", "conventions/paged.py")

TARGETS = {
    "reference": {"paths": ["tests/mutation/reference_sdpa.py"]},
    "conventions": {"paths": [f"site/attnspec/backends/{m}" for m in CONVENTION_MODULES]},
}

#: definition -> why the suite's verdicts cannot reach it (and what tests it instead)
OUT_OF_SCOPE = {
    "Convention.extend": "builds a new convention from arguments and validates them; "
    "tests/test_check.py and tests/test_fp8_convention.py check it",
    "Convention.descale_keywords": "FP8 descales (sdpa_fp8): the FP8 conventions are outside the issue's list; "
    "tests/test_mutants_fp8.py and tests/test_fp8_convention.py check them",
    "Convention._fp8_refusals": "FP8 refusals (sdpa_fp8), as Convention.descale_keywords",
    "fp8_call_needs": "FP8 needs (sdpa_fp8), as Convention.descale_keywords",
    "Convention.__repr__": "text for a reader, never a verdict",
    "register_convention": "the registry's API; tests/test_check.py checks it",
    "get_convention": "the registry's API (names, MODULE:ATTR, +canonical); tests/test_check.py checks it",
    "describe": "the text `attnspec conventions` prints",
    "_variant_refusal": "the text of a refusal; which needs are refused is decided by Convention.refusals",
    "_Paged.output_causes": "the cause a failure's line names (a NaN read from the pool), never whether it fails; "
    "tests/test_paged.py checks it",
}


def definition_at(tree: ast.Module, line: int) -> str:
    """``Class.method``, ``function`` or ``<module>`` holding ``line``."""
    for node in tree.body:
        if not (node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and sub.lineno <= line <= (sub.end_lineno or sub.lineno):
                    return f"{node.name}.{sub.name}"
            return node.name
        if isinstance(node, ast.FunctionDef):
            return node.name
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            return names[0] if names else "<module>"
    return "<module>"


def annotation_spans(tree: ast.Module) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (line, col) of every annotation in the module."""
    spans = []
    for node in ast.walk(tree):
        found = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            found += [
                a.annotation
                for a in (
                    *args.posonlyargs,
                    *args.args,
                    *args.kwonlyargs,
                    *filter(None, [args.vararg, args.kwarg]),
                )
                if a.annotation
            ]
            if node.returns:
                found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
        spans += [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in found]
    return spans


def sample_key(file: str, operator: str, source_line: str, col: int) -> str:
    """A mutant's name that survives edits elsewhere in its file: the file, the operator, the
    source line it changes (stripped) and where on that line."""
    indent = len(source_line) - len(source_line.lstrip())
    return f"{file}|{operator}|{source_line.strip()}|{col - indent}"


def load_sample(name: str) -> set[str]:
    data = tomllib.loads((HERE / f"{name}_sample.toml").read_text())
    return {sample_key(m["file"], m["operator"], m["line"], m["col"]) for m in data["mutant"]}


def short_path(module_path: str) -> str:
    """A module path as the report names it: site/attnspec/backends/x.py -> backends/x.py."""
    return module_path.removeprefix("site/attnspec/")


def apply_filters(db: Path, target: str, workdir: Path, sample: str | None) -> dict[str, int]:
    """Mark the set-aside mutants of a fresh session skipped, with the rule in their output."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    keep = load_sample(sample) if sample else None
    trees: dict[str, ast.Module] = {}
    lines: dict[str, list[str]] = {}
    spans: dict[str, list] = {}
    counts = {"annotation": 0, "out of scope": 0, "sample": 0}
    with use_db(str(db), WorkDB.Mode.open) as wdb:
        for item in list(wdb.pending_work_items):
            mutation = item.mutations[0]
            path = str(mutation.module_path)
            if path not in trees:
                text = (workdir / path).read_text()
                trees[path], lines[path] = ast.parse(text), text.splitlines()
                spans[path] = annotation_spans(trees[path])
            (line, col), end = mutation.start_pos, mutation.end_pos
            rule = None
            if any(s <= (line, col) and end <= e for s, e in spans[path]):
                rule = "annotation"
            elif definition_at(trees[path], line) in OUT_OF_SCOPE:
                rule = "out of scope"
            elif (
                keep is not None
                and sample_key(short_path(path), mutation.operator_name, lines[path][line - 1], col)
                not in keep
            ):
                rule = "sample"
            if rule:
                counts[rule] += 1
                wdb.set_result(
                    item.job_id, WorkResult(output=f"filtered: {rule}", worker_outcome=WorkerOutcome.SKIPPED)
                )
    return counts
