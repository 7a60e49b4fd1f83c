"""Visibility is written once: `attnspec.spec.masks.visible` ANDs every rule of a call.

The golden, the tolerance rule, the gradients, the suite's strategies and the authoring kit's
`attend_mask` all call it. The reader below finds a function that writes the rules again: one
that compares keys with the window's edges (``j <= anchor + window[1]``) and combines the result
with ``&`` or ``|``, or one that ANDs ``bias != -inf`` into a mask. Only the modules listed in
`ALLOWED` may, each for the reason given there.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGE = ("spec", "backends", "conformance", "bench", "reports", "src/attnspec")

#: (file, function) -> why it writes the rules itself
ALLOWED = {
    ("spec/masks.py", "window_mask"): "the public window builder",
    ("spec/masks.py", "visibility"): "the structural rules, which `visible` completes",
    ("spec/masks.py", "visible"): "the one function",
    ("spec/sdpa_loops.py", "sdpa_loops"): "the literal per-element definition, an independent check "
    "of the vectorized golden: sharing `visible` would defeat it",
    ("spec/sdpa_loops.py", "visible"): "the loop form's own per-pair rule (nested in sdpa_loops)",
    ("spec/_blocked_tiles.py", "hidden"): "the tiled golden decides per tile which rules can hide a "
    "key, in O(tile) memory; the whole grid is what it avoids",
    ("backends/_common.py", "visibility"): "the same rules in a framework's arrays (torch, JAX, array "
    "API), built from `arange` so they run inside a jit",
    ("backends/_common.py", "with_mask_and_bias"): "mask and bias != -inf in a framework's arrays",
    ("backends/_xp_blocked.py", "visible"): "the tiled form in a framework's arrays",
}


def _names(node: ast.AST) -> set[str]:
    """The identifiers, attributes and string keys under ``node`` (``options["mask"]`` gives mask)."""
    out = set()
    for x in ast.walk(node):
        if isinstance(x, ast.Name):
            out.add(x.id)
        elif isinstance(x, ast.Attribute):
            out.add(x.attr)
        elif isinstance(x, ast.arg):
            out.add(x.arg)
        elif isinstance(x, ast.Constant) and isinstance(x.value, str):
            out.add(x.value)
    return out


def _window_edge(node: ast.AST) -> bool:
    """``x - window[0]``, ``x + p.window[1]``, ``x - left``: one side of the window rule."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))):
        return False
    right = node.right
    if isinstance(right, ast.Subscript):
        return "window" in _names(right.value)
    return isinstance(right, ast.Name) and right.id in ("left", "right")


def _neg_inf(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        x = node.operand
        return (isinstance(x, ast.Attribute) and x.attr == "inf") or (
            isinstance(x, ast.Name) and x.id == "inf"
        )
    return isinstance(node, ast.Name) and node.id == "neg_inf"


def _compares(nodes: list[ast.AST], ops: tuple[type, ...], side) -> bool:
    return any(
        isinstance(n, ast.Compare)
        and any(isinstance(o, ops) for o in n.ops)
        and any(side(x) for x in [n.left, *n.comparators])
        for n in nodes
    )


def _combines(nodes: list[ast.AST], *ops: type) -> bool:
    return any(isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, ops) for n in nodes)


def _chained(nodes: list[ast.AST]) -> bool:
    """``lo - window[0] <= j <= hi + window[1]``: both edges of the window in one comparison."""
    return any(
        isinstance(n, ast.Compare) and sum(map(_window_edge, [n.left, *n.comparators])) == 2 for n in nodes
    )


def visibility_writers(source: str) -> list[tuple[str, str]]:
    """(function, rule) for each function of ``source`` that writes a visibility rule itself."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(ast.walk(fn))
        order = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
        if _compares(nodes, order, _window_edge) and (
            _combines(nodes, ast.BitAnd, ast.BitOr) or _chained(nodes)
        ):
            found.append((fn.name, "window"))
        if _compares(nodes, (ast.NotEq,), _neg_inf) and _combines(nodes, ast.BitAnd) and "mask" in _names(fn):
            found.append((fn.name, "mask & bias != -inf"))
    return found


def package_writers() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for folder in PACKAGE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for fn, rule in visibility_writers(path.read_text()):
                found.setdefault((str(path.relative_to(ROOT)), fn), []).append(rule)
    return found


def test_no_module_writes_visibility_again():
    extra = {k: v for k, v in package_writers().items() if k not in ALLOWED}
    assert not extra, (
        f"{extra}: these functions write visibility rules themselves; call "
        "attnspec.spec.masks.visible (or add the function to ALLOWED with the reason it cannot)"
    )


def test_every_allowed_writer_still_writes():
    """An entry of ALLOWED that no longer matches is stale: remove it."""
    assert set(ALLOWED) <= set(package_writers())


def test_only_visible_calls_the_structural_builder():
    """The structural `masks.visibility` has one caller in the package, `masks.visible`: a
    module that takes it would AND in the mask and bias itself."""
    takers = []
    for folder in PACKAGE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.ImportFrom)
                    and (node.module or "").endswith("masks")
                    and any(a.name == "visibility" for a in node.names)
                ):
                    takers.append(str(path.relative_to(ROOT)))
    assert takers == []


OLD_COPIES = {
    # spec/grads.py before #29
    "grads": """
def _sdpa_visibility(p, mask, bias, extras):
    vis = visibility(p.n, p.m, causal=p.causal, window=p.window)
    for extra in (mask, None if bias is None else bias.astype(np.float64) != -np.inf):
        if extra is not None:
            vis = extra if vis is None else vis & extra
    return vis
""",
    # conformance/hypothesis_helpers.py before #29
    "strategies": """
def full_visibility(plan, options):
    full = np.ones(plan.full_weights_shape, bool)
    if options.get("mask") is not None:
        full &= options["mask"]
    if options.get("bias") is not None:
        full &= options["bias"] != -np.inf
    return full
""",
    # a window rule written again
    "window": """
def grid(n, m, causal, window, q_ids, kv_ids):
    i, j = np.arange(n)[:, None], np.arange(m)
    vis = (j <= i) if causal else np.ones((n, m), bool)
    vis &= (j >= i - window[0]) & (j <= i + window[1])
    return vis & (q_ids[:, None] == kv_ids) & (q_ids[:, None] >= 0)
""",
}


@pytest.mark.parametrize("name", sorted(OLD_COPIES))
def test_the_reader_finds_a_copy(name):
    assert visibility_writers(OLD_COPIES[name])


@pytest.mark.parametrize(
    "module, function",
    [
        ("attnspec.spec.sdpa", "attention_core"),
        ("attnspec.spec.grads", "_sdpa_visibility"),
        ("attnspec.spec.tolerance", "visibility_view"),
        ("attnspec.conformance.hypothesis_helpers", "full_visibility"),
        ("attnspec.backends.authoring", "attend_mask"),
        ("attnspec.backends._common", "spec_visibility"),
    ],
)
def test_each_user_calls_visible(module, function):
    import importlib

    source = inspect.getsource(getattr(importlib.import_module(module), function))
    calls = {
        n.func.id
        for n in ast.walk(ast.parse(source.lstrip()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert "visible" in calls
