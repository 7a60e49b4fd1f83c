"""The ``attnspec`` command (also ``python -m attnspec``).

    attnspec check MODULE:FUNCTION --convention NAME [--canonical] [--arrays LIB] [--profile P] [--dtype D ...]
    attnspec check NAME | MODULE:Class                [--profile P] [--dtype D ...] [--out DIR]
    attnspec backends                                  every known backend, installed or not and why
    attnspec conventions                               the calling conventions and their signatures
    attnspec vectors export|verify|run ...             conformance vectors for any language (VECTORS.md)

``check`` probes what the implementation accepts, runs the conformance suite on it through the
crash-isolating runner, prints a feature x dtype table and one line per failing feature (with
the cause and where its reproducer is), and writes the results JSON, the reproducers and the
rendered Markdown report under ``--out``. Exit status: 0 conforms (declared deviations aside),
1 something failed, crashed or hung, or the check is incomplete (the function never ran to a
verdict, or a dtype asked for or a need its convention can express never ran), 2 usage error
(or the suite's child processes cannot start), 130/143 interrupted.
MODULE may be a path to a ``.py`` file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from attnspec.conformance.profiles import PROFILES
from attnspec.spec.dtypes import FLOAT_DTYPES
from attnspec.spec.fp8 import FP8_DTYPES

#: --dtype takes the float dtypes and sdpa_fp8's storage dtypes
DTYPES = FLOAT_DTYPES


class UsageError(Exception):
    """Bad input on the command line: one line to the user, exit 2."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except UsageError as e:
        print(f"attnspec {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnspec {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`attnspec backends | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="attnspec",
        description="Check attention implementations against attnspec's executable specification.",
    )
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    check = sub.add_parser(
        "check",
        help="probe and run the conformance suite on one implementation",
        description=__doc__.split("\n\n")[2],
    )
    check.add_argument("target", help="MODULE:FUNCTION (with --convention), a backend NAME, or MODULE:Class")
    check.add_argument(
        "--convention",
        default=None,
        help="how to call a plain function: torch_sdpa, flash, jax, tutorial, ..., or "
        "MODULE:ATTRIBUTE naming a Convention of your own",
    )
    check.add_argument(
        "--canonical",
        action="store_true",
        help="give the function canonical inputs: q, k, v always (B, H, L, D), masks full-size "
        "(B, H, n, m); for libraries that take only 4-D arrays",
    )
    check.add_argument(
        "--arrays",
        default=None,
        help="the array library the function takes "
        "(default: the convention's; numpy, torch, jax, mlx, tinygrad)",
    )
    check.add_argument(
        "--profile",
        default="dev",
        choices=PROFILES,
        help="dev (default: about a minute), ci (100 examples a property), thorough",
    )
    check.add_argument(
        "--dtype",
        action="append",
        choices=DTYPES + FP8_DTYPES,
        default=None,
        help="check only these dtypes (repeatable; default all four floats and both FP8 "
        "storage dtypes of sdpa_fp8)",
    )
    check.add_argument(
        "--fp8-p-precision",
        default="float32",
        choices=("float32", "float8_e4m3fn"),
        help="the P precision the function claims on FP8 inputs (a convention that passes "
        "descales): float8_e4m3fn for a kernel that rounds P as FlashAttention-3 does",
    )
    check.add_argument("--device", default=None, help="device (default: the array library's first)")
    check.add_argument(
        "--out", default="attnspec-report", help="output directory (default ./attnspec-report)"
    )
    check.add_argument(
        "--case-timeout",
        type=float,
        default=120.0,
        help="seconds without progress before a case counts as hung (default 120)",
    )
    check.add_argument(
        "-k", dest="keyword", default=None, help="only the properties matching this pytest -k expression"
    )
    check.set_defaults(run=_check)
    backends = sub.add_parser("backends", help="list every known backend, installed or not and why")
    backends.set_defaults(run=_backends)
    conventions = sub.add_parser("conventions", help="list the calling conventions and their signatures")
    conventions.set_defaults(run=_conventions)
    from attnspec.conformance.vectors_cli import add_parser as add_vectors

    add_vectors(sub, UsageError)
    return ap


# -- check ----------------------------------------------------------------------------------


def _target(args: argparse.Namespace) -> tuple[str, bool, Any]:
    """(the target string the suite's child process loads, whether it is a plain function, and the
    backend already built for a named one: a function's is built after the probe)."""
    import attnspec.backends as ab
    from attnspec import SpecError

    target = args.target
    if args.convention is None:
        if args.arrays or args.canonical or args.fp8_p_precision != "float32":
            flag = "--arrays" if args.arrays else "--canonical" if args.canonical else "--fp8-p-precision"
            raise UsageError(
                f"{flag} applies to a function checked with --convention (a backend class states "
                "its own fp8_p_precision)"
            )
        if "@" in target:
            return _absolute(target), True, None
        try:
            backend = ab.load(_absolute(target))
        except SpecError as e:
            hint = "" if ":" not in target else " (for a plain function, give --convention NAME)"
            raise UsageError(f"{e}{hint}") from None
        except Exception as e:  # a backend constructor that fails: the user's first question
            hint = "; for a plain function, give --convention NAME" if ":" in target else ""
            raise UsageError(f"{target!r} could not be built: {type(e).__name__}: {e}{hint}") from None
        return _absolute(target), False, backend
    if ":" not in target or "@" in target:
        raise UsageError(f"with --convention, the target must be MODULE:FUNCTION, got {target!r}")
    convention = _absolute(args.convention) + (ab.CANONICAL if args.canonical else "")
    if args.fp8_p_precision == "float8_e4m3fn":
        from attnspec.backends.conventions import P_E4M3

        convention += P_E4M3
    try:
        ab.get_convention(convention)
        obj = ab.load_object(_absolute(target))
    except SpecError as e:
        raise UsageError(str(e)) from None
    if not callable(obj):
        raise UsageError(f"{target!r} is a {type(obj).__name__}, not a callable")
    if args.arrays:
        from attnspec.backends.arrays import array_libraries

        if args.arrays not in array_libraries():
            raise UsageError(f"--arrays={args.arrays!r} is not one of {', '.join(array_libraries())}")
    spec = f"{_absolute(target)}@{convention}" + (f"/{args.arrays}" if args.arrays else "")
    return spec, True, None


def _absolute(target: str) -> str:
    """A ``path/to/file.py:attr`` target with its path made absolute (the child runs elsewhere)."""
    module, sep, rest = target.partition(":")
    if sep and (module.endswith(".py") or "/" in module):
        return f"{os.path.abspath(module)}:{rest}"
    return target


def _check(args: argparse.Namespace) -> int:
    from attnspec.backends import TARGET_PATH_ENV, load
    from attnspec.backends.probe import NO_DTYPE, probe_isolated
    from attnspec.conformance.run import ChildSetupError, Interrupted, run_suite, slug, summary

    # MODULE:FUNCTION resolves from here, as `python -m` does, but after the installed packages:
    # a folder here named like one (a clone called attnspec) cannot shadow it, here or in a child
    os.environ[TARGET_PATH_ENV] = os.pathsep.join(
        [os.getcwd(), *filter(None, [os.environ.get(TARGET_PATH_ENV)])]
    )
    spec, is_function, backend = _target(args)
    out = Path(args.out)
    if _inside_package(out):
        raise UsageError(
            f"--out={str(out)!r} is inside the installed attnspec package or the repo's reports/: "
            "choose another directory"
        )
    (out / "results").mkdir(parents=True, exist_ok=True)
    env: dict[str, str] = {}
    t0 = time.time()
    if is_function:
        print(f"attnspec check: probing {spec} ...", file=sys.stderr)
        try:
            floats = tuple(d for d in args.dtype or () if d in DTYPES)  # FP8 has probes of its own
            caps = probe_isolated(spec, out / "probe.json", floats or None, args.device)
        except RuntimeError as e:
            raise UsageError(f"cannot probe {spec}: {e}") from None
        (out / "capabilities.json").write_text(json.dumps({spec: caps.as_json()}, indent=1))
        (out / "probe.json").unlink(missing_ok=True)
        env["ATTNSPEC_CAPABILITIES"] = str((out / "capabilities.json").resolve())
        env["ATTNSPEC_TOUR"] = "1"  # every feature of every property once, besides the drawn cases
        not_ok = [r for r in caps.results if r.status != "ok"]
        by_convention = [r.need for r in not_ok if r.status == "convention"]
        print(
            f"attnspec check: probe done in {time.time() - t0:.0f} s: "
            f"{sum(r.status == 'ok' for r in caps.results)} of {len(caps.results)} probes returned"
            + (f"; not expressible by the convention: {', '.join(by_convention)}" if by_convention else ""),
            file=sys.stderr,
        )
        for r in not_ok:  # what the function said when it refused: often a bug of the wrapper
            if r.status != "convention" and r.reason != NO_DTYPE:
                what = f"dtype {r.dtype}" if r.need == "dtype" else r.need
                print(f"attnspec check: probe: {what} {r.status}: {r.reason or r.status}", file=sys.stderr)
        os.environ.update(env)
    if backend is None:
        backend = load(spec)  # a function: after the probe, so it reads the probe's findings
    device = args.device or backend.devices()[0]
    results_path = out / "results" / f"conformance-{slug(subject(spec), 100)}-{slug(device)}.json"
    pytest_args = [a for d in (args.dtype or []) for a in ("--attn-dtype", d)]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    try:
        results = run_suite(
            spec,
            backend,
            device,
            args.profile,
            results_path,
            args.case_timeout,
            pytest_args,
            device_given=args.device is not None,
            env=env,
            log_tail=False,
        )
    except Interrupted as e:
        return 128 + e.signum
    except ChildSetupError as e:
        print(f"attnspec check: {e}", file=sys.stderr)
        return 2
    render_reports(out)
    table = feature_table(results)
    print("\n" + table, file=sys.stderr)
    repro_dir = out / "repro"
    lines = failure_lines(results, repro_dir)
    for line in lines:
        print(line, file=sys.stderr)
    s = summary(results)
    from attnspec.conformance.coverage import gaps

    cov = results.get("coverage", {})
    print("\n" + coverage_text(cov), file=sys.stderr)
    # the dtypes asked for must each run; a need the convention can express must run unless the
    # user narrowed the properties (-k): then the verdict is the selection's, and says so
    missing = gaps(cov, tuple(args.dtype or ()), function_only=is_function and not args.keyword)
    for line in missing:
        print(f"NOT RUN {line}", file=sys.stderr)
    if missing and not s["bad"]:
        print(
            "attnspec check: a verdict of conformance needs every dtype asked for and every need the "
            "convention can express to run; narrow --dtype, fix the refusals above, or declare what the "
            "function lacks with Convention.extend(refuse=...) (docs/guide/check.md, 'Extending a convention')",
            file=sys.stderr,
        )
    verdict = "FAILS" if s["bad"] else "INCOMPLETE" if missing else "CONFORMS"
    if verdict == "CONFORMS" and args.keyword:
        verdict += f" (on the properties selected by -k {args.keyword!r} only)"
    refused_dtypes = {d: e.get("reason", "") for d, e in cov.get("dtypes", {}).items() if not e.get("ran")}
    if refused_dtypes and not args.dtype:
        print(
            f"dtypes not run: {', '.join(refused_dtypes)} (the probe found the function refusing them; "
            "--dtype asks for them explicitly)",
            file=sys.stderr,
        )
    # the version of the semantics the verdict is about (spec/CHANGELOG.md), once
    from attnspec.spec.clauses import SPEC_VERSION

    print(
        f"\n{verdict}: {s['text']}\nspec: {SPEC_VERSION}\nreport: {out / 'index.md'}\nresults: {results_path}",
        file=sys.stderr,
    )
    return 1 if s["bad"] or missing else 0


def subject(target: str) -> str:
    """What a check's result file is named by: ``module.function@convention[-arrays]`` for a
    function (a file's folder dropped), the backend's name or ``module.Class`` otherwise."""
    where, at, how = target.rpartition("@")
    if not at:
        where, how = target, ""
    module, _, attr = where.partition(":")
    if module.endswith(".py") or "/" in module:
        module = os.path.splitext(os.path.basename(module))[0]
    name = f"{module}.{attr}" if attr else module
    if how:
        from attnspec.backends import split_convention

        convention, arrays = split_convention(how)
        convention = convention.rpartition(":")[2] if ":" in convention else convention
        name += f"@{convention}" + (f"-{arrays}" if arrays else "")
    return name


def coverage_text(cov: dict[str, Any]) -> str:
    """The coverage lines of a verdict: per function the cases called; per need (the function's
    features) the cases that ran, and what was refused or cannot be expressed, and why."""
    fns = cov.get("functions", {})
    lines = []
    called = {f: c for f, c in fns.items() if c["called"]}
    never = sorted(f for f, c in fns.items() if not c["called"])
    lines.append(
        "coverage: "
        + (
            ", ".join(f"{f} called in {c['called']} cases" for f, c in sorted(called.items()))
            or "the function was never called to a verdict"
        )
    )
    if never:
        lines.append(f"  never called: {', '.join(never)}")
    needs = cov.get("needs")
    if needs:
        ran = [f"{n} {e['cases']}" for n, e in needs.items() if e["status"] == "ran"]
        lines.append(f"  needs run ({len(ran)} of {len(needs)}), cases each: {', '.join(ran) or 'none'}")
        for status in ("refused", "not expressible", "not reached", "not run"):
            these = [n for n, e in needs.items() if e["status"] == status]
            if these:
                lines.append(f"  {status} ({len(these)}): {', '.join(these)}")
    return "\n".join(lines)


def _inside_package(out: Path) -> bool:
    import attnspec

    resolved = out.resolve()
    roots = [Path(attnspec.__file__).resolve().parent]
    import attnspec.reports

    roots.append(Path(attnspec.reports.__file__).resolve().parent)
    return any(resolved == r or r in resolved.parents for r in roots)


def render_reports(out: Path) -> None:
    import contextlib
    import io

    try:
        from attnspec.reports.render import main as render

        with contextlib.redirect_stdout(io.StringIO()):
            render(["--results", str(out / "results"), "--out", str(out), "--no-plots"])
    except ImportError as e:  # the report extra is optional: the JSON and the reproducers remain
        print(
            f"attnspec check: the Markdown report was not rendered ({e}; pip install 'attnspec[report]')",
            file=sys.stderr,
        )


def feature_table(results: dict[str, Any]) -> str:
    """The feature x dtype summary: each cell passed/run, FAIL n/run, unsupported or deviation,
    with the worst budget used."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results["rows"]:
        feature = r["feature"] if r["function"] == "sdpa" else f"{r['function']}:{r['feature']}"
        c = cells.setdefault(
            (feature, r["dtype"]),
            {"run": 0, "passed": 0, "bad": 0, "unsupported": 0, "deviation": 0, "budget": None},
        )
        c["run"] += r["run"]
        c["passed"] += r["passed"]
        c["bad"] += r["failed"] + r.get("crashed", 0) + r.get("timeout", 0)
        c["unsupported"] += r["unsupported"]
        c["deviation"] += r.get("deviation", 0)
        if r.get("max_budget_used") is not None:
            c["budget"] = max(c["budget"] or 0.0, r["max_budget_used"])
    # a function with no case run to a verdict is one line, not a row per feature
    unsupported_fns = sorted(
        {r["function"] for r in results["rows"]}
        - {r["function"] for r in results["rows"] if r["run"] > r["unsupported"]}
    )
    features = sorted({f for f, _ in cells if f.split(":")[0] not in unsupported_fns or ":" not in f})
    if "sdpa" in unsupported_fns:
        features = [f for f in features if ":" in f]
    dtypes = [d for d in DTYPES if any((f, d) in cells for f in features)]
    extra = sorted({d for _, d in cells} - set(DTYPES))

    def cell(c: dict[str, Any] | None) -> str:
        if c is None:
            return "-"
        if c["bad"]:
            return f"FAIL {c['bad']}/{c['run']}"
        if c["passed"] == 0 and c["deviation"] == 0:
            return "unsupported"
        text = f"{c['passed']}/{c['run']}"
        if c["deviation"]:
            text += f" +{c['deviation']}dev"
        if c["unsupported"]:  # the rest of the run: declined, not failed
            text += f" ({c['unsupported']} unsup.)"
        if c["budget"] is not None:
            text += f" b{c['budget']:.2g}"
        return text

    cols = dtypes + extra
    rows = [["feature", *cols]] + [[f, *(cell(cells.get((f, d))) for d in cols)] for f in features]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)
    legend = (
        "cells: passed/run (+n declared deviations, (n unsup.) declined) and bWORST, the worst budget used "
        "(error / allowed error, 1 = the edge); FAIL failed+crashed+hung/run"
    )
    if unsupported_fns:
        legend += "\nunsupported throughout (no row above): " + ", ".join(unsupported_fns)
    return text + "\n" + legend


def failure_lines(results: dict[str, Any], repro_dir: Path) -> list[str]:
    """One line per distinct cause among the failures: ``FAIL features (dtypes; properties; count):
    cause [clause ...]; repro: path``, the first failure's cause with the clauses of the spec it
    breaks, and its reproducer; every recorded failure (one per function, property, feature, dtype
    and cause) gets its own repro file. Causes that differ only in the clauses of their cases (a
    numerical difference in a masked case and in a causal one) share a line."""
    from attnspec.conformance.recorder import cause_kind, failure_cause
    from attnspec.spec.clauses import clause_label, split_label

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in results.get("failures", []):
        cause = f.get("cause") or failure_cause(f.get("message") or "")
        if f.get("clauses") and not split_label(cause)[1]:
            cause = f"{cause} {clause_label(f['clauses'])}"
        groups.setdefault((f.get("function") or "", cause_kind(cause)), []).append({**f, "cause": cause})
    lines = []
    written = 0
    for (function, _kind), group in groups.items():
        paths = []
        for f in group:
            head, _, snippet = (f.get("message") or "").partition("reproduce with:\n")
            if snippet.strip():
                written += 1
                name = f"{written:02d}-{function}-{f.get('feature')}-{f.get('property')}-{f.get('dtype')}.py"
                path = repro_dir / name
                repro_dir.mkdir(parents=True, exist_ok=True)
                body = "\n".join(
                    line[4:] if line.startswith("    ") else line for line in snippet.splitlines()
                )
                path.write_text(f"# {head.splitlines()[0] if head else f.get('cause')}\n{body}\n")
                paths.append(path)

        def listed(field: str, group: list[dict[str, Any]] = group) -> str:
            return ", ".join(dict.fromkeys(str(f.get(field)) for f in group))

        where = f"repro: {paths[0]}" if paths else "no reproducer (see the report)"
        fn = "" if function == "sdpa" else f"{function}:"
        count = f"{len(group)} failure{'s' * (len(group) > 1)}"
        count += f", {len(paths)} reproducers" if len(paths) > 1 else ""
        lines.append(
            f"FAIL {fn}{listed('feature')} ({listed('dtype')}; {listed('property')}; {count}): "
            f"{group[0]['cause']}; {where}"
        )
    return lines


# -- backends, conventions ------------------------------------------------------------------


def _backends(args: argparse.Namespace) -> int:
    import attnspec.backends as ab

    rows = [["backend", "installed", "why not"]]
    for name, a in ab.available().items():
        rows.append([name, "yes" if a.installed else "no", a.reason])
    print(_table(rows))
    return 0


def _conventions(args: argparse.Namespace) -> int:
    from attnspec.backends.conventions import CONVENTIONS

    for c in CONVENTIONS.values():
        print(f"{c.name}: {c.signature} (arrays: {c.arrays})")
    return 0


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


if __name__ == "__main__":
    sys.exit(main())
