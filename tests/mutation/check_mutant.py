"""One mutant's verdict, for cosmic-ray's ``test-command`` (`nox -s mutation`): exit 0 when the
mutant survives, 1 when the conformance suite kills it.

    python tests/mutation/check_mutant.py --target reference      # reference_sdpa.py mutated
    python tests/mutation/check_mutant.py --target conventions    # a convention module mutated
    python tests/mutation/check_mutant.py --target conventions --baseline   # unmutated: record

It runs what ``attnspec check`` runs (the capability probe, the suite through the crash-isolating
runner, the coverage rule of a verdict), in the ``dev`` profile, one job, stopping at the first
failure (``-x`` and ``ATTNSPEC_FAIL_FAST=1``: no shrinking, no sweep).

- reference: ``reference_sdpa.py:sdpa`` through the ``spec_keywords`` convention. Killed when the
  verdict is FAILS or INCOMPLETE.
- conventions: the mutated line is found by comparing the worker's installed convention modules
  with their pristine copies, and mapped (through the modules' AST) to the conventions whose code
  runs it. For each, cheapest first: the correct function of adapters.py through it, killed on
  FAILS or INCOMPLETE, when it refuses a need the unmutated convention expresses, or when the
  coverage it reports (cases run and declined per need, totals) differs from the unmutated
  convention's (the baseline: the runs are derandomized, so a correct function through an
  unmutated convention reports the same numbers every time); then each known-wrong function,
  killed when it CONFORMS (the convention hid it).

The worker's tree is this file's ``../..``; it holds ``site/`` (its own install of attnspec, which
cosmic-ray mutates in place) and ``pristine/`` (the unmutated modules). Each verdict is appended
as a JSON line to ``mutation-log.jsonl`` there, with its time and what killed it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SITE = ROOT / "site"
PRISTINE = ROOT / "pristine"
if SITE.is_dir():  # this worker's own attnspec, before any installed one
    sys.path.insert(0, str(SITE))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, [os.environ.get("PYTHONPATH")])])

from filters import CONVENTION_MODULES  # type: ignore[import-not-found]  # noqa: E402  (this folder)

#: subject (adapters.SUBJECTS) -> its convention's class; a mutated line of a class reaches every
#: subject of that class and its subclasses (the order checked is the baseline's, cheapest first)
CONVENTION_CLASSES = {
    "tutorial": "Tutorial",
    "torch_sdpa": "TorchSDPA",
    "flash": "Flash",
    "flash_kvcache": "FlashKVCache",
    "flash_varlen": "FlashVarlen",
    "flash_kvcache_paged": "FlashKVCachePaged",
    "vllm_paged": "VllmPaged",
    "jax": "Jax",
    "keras": "Jax",  # the atlas's Keras(Jax): no lengths or window arguments
    "tutorial+canonical": "Tutorial",
    "torch_sdpa+canonical": "TorchSDPA",
    "jax+canonical": "Jax",
    "torch_sdpa_keywords": "TorchSDPA",
}
PROFILE = "dev"
CASE_TIMEOUT = 60.0
#: the properties a function checked through a convention can run: it implements sdpa only, so the
#: others (sdpa_blocked, sdpa_fp8 without descales, the gradients, mha, lsh) would only record their
#: refusals. Leaving them out changes no verdict here: the coverage rule is applied in `check`,
#: whatever -k selects (sdpa's needs come from sdpa's properties), and no function is called by them.
SDPA_ONLY = "not test_blocked and not test_fp8 and not test_grads and not test_lsh and not test_mha"
#: seconds one mutant may take here: then the runner stops its children and the mutant counts as
#: timed out (cosmic-ray's own timeout, above this, kills only this process group, and the suite's
#: children run in sessions of their own)
DEADLINE = 840


def check(spec: str, fail_fast: bool = True) -> dict:
    """The verdict of ``attnspec check`` on ``spec`` (a function@convention/arrays target)."""
    from attnspec.backends import load
    from attnspec.backends.probe import probe_isolated
    from attnspec.conformance.coverage import gaps
    from attnspec.conformance.run import ChildSetupError, run_suite, summary

    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="attnspec-mutant-") as tmp:
        out = Path(tmp)
        try:
            caps = probe_isolated(spec, out / "probe.json")
        except RuntimeError as e:
            return {"verdict": "ERROR", "why": f"probe: {e}", "seconds": round(time.time() - t0, 1)}
        # a need the probe finds refused cannot run in the suite (the backend reads the findings),
        # so the verdict is INCOMPLETE already (coverage.gaps): no need to run it
        refused = [r for r in caps.results if r.need != "dtype" and r.status not in ("ok", "convention")]
        if refused:
            r = refused[0]
            why = f"probe: {r.need} {r.status}: {(r.reason or '')[:200]}"
            return {
                "verdict": "INCOMPLETE",
                "why": why,
                "not_expressible": [],
                "seconds": round(time.time() - t0, 1),
            }
        (out / "capabilities.json").write_text(json.dumps({spec: caps.as_json()}))
        env = {"ATTNSPEC_CAPABILITIES": str(out / "capabilities.json"), "ATTNSPEC_TOUR": "1"}
        if fail_fast:
            env["ATTNSPEC_FAIL_FAST"] = "1"
        else:
            os.environ.pop("ATTNSPEC_FAIL_FAST", None)
        os.environ.update(env)
        try:
            backend = load(spec)
            results = run_suite(
                spec,
                backend,
                backend.devices()[0],
                PROFILE,
                out / "results.json",
                CASE_TIMEOUT,
                (["-x"] if fail_fast else []) + ["-k", SDPA_ONLY],
                device_given=False,
                env=env,
                quiet=True,
                jobs=1,
            )
        except ChildSetupError as e:
            return {"verdict": "ERROR", "why": str(e)[:300], "seconds": time.time() - t0}
    s = summary(results)
    cov = results.get("coverage", {})
    missing = gaps(cov, (), function_only=True) if cov else ["no coverage"]
    verdict = "FAILS" if s["bad"] else "INCOMPLETE" if missing else "CONFORMS"
    why = ""
    if s["bad"]:
        bad = next(
            (r for r in results["rows"] if r.get("failed") or r.get("crashed") or r.get("timeout")), None
        )
        why = f"{bad['property']} {bad['feature']} {bad['dtype']}" if bad else s["text"]
    elif missing:
        why = "; ".join(missing)[:300]
    refused = sorted(n for n, e in cov.get("needs", {}).items() if e["status"] == "not expressible")
    # what the run reports it exercised: cases per need, and per status (the runs are derandomized,
    # so a correct function through an unmutated convention gives the same numbers every time)
    exercised = {n: [e["cases"], e["declined"]] for n, e in cov.get("needs", {}).items()}
    exercised["<totals>"] = [s["totals"][k] for k in ("run", "passed", "unsupported")]
    return {
        "verdict": verdict,
        "why": why,
        "not_expressible": refused,
        "exercised": exercised,
        "seconds": round(time.time() - t0, 1),
    }


def subject(fn: str, convention: str) -> str:
    from adapters import CONVENTION_TARGETS  # type: ignore[import-not-found]

    return f"{HERE / 'adapters.py'}:{fn}@{CONVENTION_TARGETS.get(convention, convention)}/numpy"


# -- which conventions a mutated line reaches ------------------------------------------------------


def mutated_line(pristine: Path, mutated: Path) -> int | None:
    """The first line (1-based) where the mutated module differs from the pristine one."""
    a, b = pristine.read_text().splitlines(), mutated.read_text().splitlines()
    for tag, i1, _i2, _j1, _j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            return i1 + 1
    return None


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    """Top-level names (functions, classes, assignments) of a module -> their nodes."""
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    found[t.id] = node
    return found


def reached(module: str, line: int) -> tuple[str, list[str]]:
    """(the definition holding ``line`` of ``module``, the conventions whose code runs it)."""
    from filters import definition_at  # type: ignore[import-not-found]

    trees = {m: ast.parse((PRISTINE / m).read_text()) for m in CONVENTION_MODULES}
    defs = {name: node for tree in trees.values() for name, node in _definitions(tree).items()}
    label = definition_at(trees[module], line)
    where = label.split(".")[0]
    if where not in defs:  # an import or the module's docstring: everything
        return label, list(CONVENTION_CLASSES)
    # who uses each top-level name (by name, transitively), and which class inherits from which
    users: dict[str, set[str]] = {name: set() for name in defs}
    bases: dict[str, list[str]] = {}
    for name, n in defs.items():
        for sub in ast.walk(n):
            if isinstance(sub, ast.Name) and sub.id in users and sub.id != name:
                users[sub.id].add(name)
        if isinstance(n, ast.ClassDef):
            bases[name] = [b.id for b in n.bases if isinstance(b, ast.Name)]

    def subclasses(cls: str) -> set[str]:
        found = {cls}
        for c, bs in bases.items():
            if cls in bs:
                found |= subclasses(c)
        return found

    seen, todo, classes = {where}, [where], set()
    while todo:
        name = todo.pop()
        if isinstance(defs[name], ast.ClassDef):
            classes |= subclasses(name)
        for u in users[name] - seen:
            seen.add(u)
            todo.append(u)
    chosen = [c for c, cls in CONVENTION_CLASSES.items() if cls in classes]
    return label, chosen or list(CONVENTION_CLASSES)


# -- the two targets ---------------------------------------------------------------------------


def reference_verdict() -> tuple[bool, str, list[dict]]:
    spec = f"{HERE / 'reference_sdpa.py'}:sdpa@{HERE / 'reference_convention.py'}:SPEC_KEYWORDS/numpy"
    r = check(spec)
    r["subject"] = "reference"
    return r["verdict"] != "CONFORMS", f"reference {r['verdict']}: {r['why']}", [r]


def conventions_verdict(conventions: list[str], baseline: dict) -> tuple[bool, str, list[dict]]:
    from adapters import SUBJECTS  # type: ignore[import-not-found]

    runs = []
    # the correct functions first, cheapest first (most mutants die there), then the wrong ones
    for name in conventions:
        correct, _ = SUBJECTS[name]
        r = check(subject(correct, name))
        r["subject"] = f"{name}:{correct}"
        runs.append(r)
        if r["verdict"] != "CONFORMS":
            return True, f"{name} correct {r['verdict']}: {r['why']}", runs
        base = baseline.get(name, {})
        more = sorted(set(r["not_expressible"]) - set(base.get("not_expressible", [])))
        if more:
            return True, f"{name} correct: refuses {', '.join(more)}, which the convention expresses", runs
        changed = sorted(
            n
            for n in set(r["exercised"]) | set(base.get("exercised", {}))
            if r["exercised"].get(n) != base.get("exercised", {}).get(n)
        )
        if base.get("exercised") is not None and changed:
            n = changed[0]
            return (
                True,
                (
                    f"{name} correct: the coverage changed: {n} cases run, declined "
                    f"{r['exercised'].get(n)}, unmutated {base['exercised'].get(n)}"
                ),
                runs,
            )
    for name in conventions:
        for wrong in SUBJECTS[name][1]:
            w = check(subject(wrong, name))
            w["subject"] = f"{name}:{wrong}"
            runs.append(w)
            if w["verdict"] == "CONFORMS":
                return True, f"{name} hides {wrong}: it CONFORMS", runs
    return False, "survived", runs


def record_baseline(path: Path) -> int:
    """Check the unmutated conventions: every correct function conforms, every wrong one fails.
    Writes each convention's refusals and times; exit 1 if any check disagrees."""
    from adapters import SUBJECTS  # type: ignore[import-not-found]

    found, bad = {}, []
    for name, (correct, wrongs) in SUBJECTS.items():
        r = check(subject(correct, name))  # as a mutant's check runs it: the coverage must match
        entry = {
            "not_expressible": r.get("not_expressible", []),
            "exercised": r.get("exercised"),
            "seconds": r["seconds"],
            "wrong": {},
        }
        if r["verdict"] != "CONFORMS":
            bad.append(f"{name}: the correct {correct} {r['verdict']}: {r['why']}")
        for wrong in wrongs:
            w = check(subject(wrong, name))
            entry["wrong"][wrong] = {"verdict": w["verdict"], "why": w["why"], "seconds": w["seconds"]}
            if w["verdict"] == "CONFORMS":
                bad.append(f"{name}: the known-wrong {wrong} CONFORMS")
        found[name] = entry
        print(
            f"{name}: correct {r['verdict']} in {r['seconds']} s; "
            + ", ".join(f"{w} {e['verdict']} ({e['why']})" for w, e in entry["wrong"].items()),
            file=sys.stderr,
        )
    path.write_text(json.dumps(found, indent=1) + "\n")
    for line in bad:
        print(f"baseline: {line}", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("reference", "conventions"), required=True)
    ap.add_argument("--baseline", action="store_true", help="check the unmutated conventions and record them")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    baseline_path = ROOT / "baseline.json"
    if args.baseline:
        return record_baseline(baseline_path)
    t0 = time.time()
    entry: dict = {"target": args.target}
    signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    signal.alarm(DEADLINE)  # the runner takes SIGTERM: it stops its children and raises Interrupted
    try:
        if args.target == "reference":
            entry.update(
                file="tests/mutation/reference_sdpa.py",
                line=mutated_line(PRISTINE / "reference_sdpa.py", HERE / "reference_sdpa.py"),
            )
            killed, why, runs = reference_verdict()
        else:
            changed = [
                (m, mutated_line(PRISTINE / m, SITE / "attnspec" / "backends" / m))
                for m in CONVENTION_MODULES
            ]
            module, line = next(((m, n) for m, n in changed if n is not None), (CONVENTION_MODULES[0], None))
            label, conventions = reached(module, line) if line else ("<none>", list(CONVENTION_CLASSES))
            baseline = json.loads(baseline_path.read_text()) if baseline_path.exists() else {}
            order = sorted(conventions, key=lambda c: baseline.get(c, {}).get("seconds", 0.0))
            entry.update(file=f"backends/{module}", line=line, definition=label, conventions=order)
            killed, why, runs = conventions_verdict(order, baseline)
    except Exception as e:  # a mutant that breaks the driver's own import of the module: killed
        timed_out = type(e).__name__ == "Interrupted"
        killed, why, runs = True, ("timed out" if timed_out else f"error: {type(e).__name__}: {e}"[:300]), []
    entry.update(
        outcome="killed" if killed else "survived", why=why, runs=runs, seconds=round(time.time() - t0, 1)
    )
    with open(ROOT / "mutation-log.jsonl", "a") as log:
        log.write(json.dumps(entry) + "\n")
    print(f"{entry['outcome']}: {why} ({entry['seconds']} s)")
    return 1 if killed else 0


if __name__ == "__main__":
    sys.exit(main())
