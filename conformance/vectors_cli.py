"""``attnspec vectors export | verify | run``: the command line of `attnspec.conformance.vectors`.

    attnspec vectors export --out DIR [--profile P] [--function F ...] [--dtype D ...]
    attnspec vectors verify BUNDLE OUTPUTS --name NAME [--out DIR] [--case REGEX]
    attnspec vectors run TARGET BUNDLE --out OUTPUTS [--convention C] [--arrays LIB] [--device D] [--case REGEX]

``verify`` prints what ``attnspec check`` prints (a FAIL line per distinct cause, naming its
clause, and a verdict), writes the same results JSON under ``--out``/results and renders the
report there. Exit status: 0 conforms, 1 fails or incomplete (no case ran to a verdict, or a
case has no output and no declaration that it is unsupported), 2 a bundle or outputs folder that
cannot be used (missing, altered, not matching the schema) or bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

_USAGE_ERROR: type[Exception] = ValueError


def add_parser(sub: Any, usage_error: type[Exception]) -> None:
    global _USAGE_ERROR
    _USAGE_ERROR = usage_error
    from attnspec.conformance.profiles import PROFILES
    from attnspec.spec.dtypes import FLOAT_DTYPES
    from attnspec.spec.fp8 import FP8_DTYPES

    vectors = sub.add_parser(
        "vectors",
        help="conformance vectors for any language: export, verify, run",
        description=__doc__.split("\n\n")[0],
    )
    vsub = vectors.add_subparsers(dest="vectors_command", metavar="SUBCOMMAND")
    vectors.set_defaults(run=lambda args: (vectors.print_help(), 2)[1])

    ex = vsub.add_parser("export", help="write bundles of cases: inputs, goldens, allowed errors, clauses")
    ex.add_argument("--out", required=True, help="folder to write the bundles and index.json into")
    ex.add_argument("--profile", default="dev", choices=PROFILES, help="how many cases (default dev)")
    ex.add_argument(
        "--function",
        action="append",
        default=None,
        metavar="F",
        help="a family of cases (repeatable; default all): sdpa, sdpa_vjp, mha, lsh_attention, "
        "sdpa_serving, sdpa_paged, sdpa_fp8",
    )
    ex.add_argument(
        "--dtype",
        action="append",
        default=None,
        choices=(*FLOAT_DTYPES, *FP8_DTYPES),
        help="a dtype (repeatable; default every dtype of each family: the four float dtypes, "
        "sdpa_fp8's two FP8 ones)",
    )
    ex.set_defaults(run=_with_suite(_export))

    ve = vsub.add_parser("verify", help="judge outputs an implementation wrote for a bundle")
    ve.add_argument("bundle", help="a bundle folder (manifest.json) or an export folder (index.json)")
    ve.add_argument("outputs", help="the folder of ID.safetensors / ID.unsupported / ID.error files")
    ve.add_argument("--name", required=True, help="the implementation's name in the results and reports")
    ve.add_argument("--out", default="attnspec-vectors-report", help="where results JSON and report go")
    ve.add_argument("--device", default="external", help="the device the outputs came from (for the report)")
    ve.add_argument("--case", default=None, metavar="REGEX", help="only the cases whose id matches")
    ve.add_argument(
        "--atlas",
        action="store_true",
        help="also answer the atlas' questions from the atlas cases' outputs (atlas-NAME.json)",
    )
    ve.set_defaults(run=_with_suite(_verify))

    ru = vsub.add_parser("run", help="write a backend's or a function's outputs for a bundle")
    ru.add_argument("target", help="a backend NAME, MODULE:Class, or MODULE:FUNCTION with --convention")
    ru.add_argument("bundle", help="a bundle folder or an export folder")
    ru.add_argument("--out", required=True, help="the outputs folder to write")
    ru.add_argument(
        "--convention", default=None, help="how to call a plain function (see attnspec conventions)"
    )
    ru.add_argument("--arrays", default=None, help="the array library the function takes")
    ru.add_argument("--device", default=None, help="device (default: the backend's first)")
    ru.add_argument("--case", default=None, metavar="REGEX", help="only the cases whose id matches")
    ru.set_defaults(run=_with_suite(_run))


def _with_suite(command: Any) -> Any:
    """``command``, with a missing dependency of the suite's cases said in one line: the vectors
    are drawn and judged by the conformance suite's code, which needs the ``test`` extra."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(command(args))
        except ModuleNotFoundError as e:
            if e.name not in ("hypothesis", "pytest"):
                raise
            raise _USAGE_ERROR(
                f"needs {e.name}, which the conformance suite's cases are built with: "
                "pip install 'attnspec[test]'"
            ) from None

    return run


def _bundles(path: str) -> list:
    from attnspec.conformance.vectors import BundleError, load

    try:
        return load(path)
    except BundleError as e:
        raise _USAGE_ERROR(str(e)) from None
    except OSError as e:
        raise _USAGE_ERROR(f"{path}: {e.strerror or e}") from None


def _export(args: argparse.Namespace) -> int:
    from attnspec.conformance.vectors import export

    t0 = time.time()
    try:
        paths = export(args.out, args.profile, args.function, args.dtype)
    except ValueError as e:
        raise _USAGE_ERROR(str(e)) from None
    from attnspec.conformance.vectors import load

    total = sum(len(b.cases) for p in paths for b in load(p, check_files=False))
    size = sum(f.stat().st_size for p in paths for f in p.iterdir())
    print(
        f"attnspec vectors export: {len(paths)} bundles, {total} cases, {size / 2**20:.1f} MiB in "
        f"{time.time() - t0:.1f} s: {Path(args.out) / 'index.json'}"
    )
    for p in paths:
        print(f"  {p}")
    return 0


def _run(args: argparse.Namespace) -> int:
    import attnspec.backends as ab
    from attnspec import SpecError
    from attnspec.conformance.vectors import BundleError, run

    target = args.target
    if args.convention:
        if ":" not in target:
            raise _USAGE_ERROR(f"with --convention, the target must be MODULE:FUNCTION, got {target!r}")
        target = f"{target}@{args.convention}" + (f"/{args.arrays}" if args.arrays else "")
    bundles = _bundles(args.bundle)
    try:
        backend = ab.load(target)
    except SpecError as e:
        raise _USAGE_ERROR(str(e)) from None
    except Exception as e:
        raise _USAGE_ERROR(f"{target!r} could not be built: {type(e).__name__}: {e}") from None
    device = args.device or backend.devices()[0]
    t0 = time.time()
    try:
        counts = run(backend, bundles, args.out, device, args.case)
    except BundleError as e:
        raise _USAGE_ERROR(str(e)) from None
    print(
        f"attnspec vectors run: {counts['written']} outputs, {counts['unsupported']} unsupported, "
        f"{counts['error']} errors in {time.time() - t0:.1f} s: {args.out}"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from attnspec.cli import coverage_text, failure_lines, feature_table, render_reports
    from attnspec.conformance.run import slug, summary
    from attnspec.conformance.vectors import BundleError, not_run_ids, verify
    from attnspec.results import write_json_atomic

    bundles = _bundles(args.bundle)
    outputs = Path(args.outputs)
    out = Path(args.out)
    try:
        results = verify(bundles, outputs, args.name, args.device, args.case)
    except BundleError as e:
        raise _USAGE_ERROR(str(e)) from None
    path = out / "results" / f"conformance-{slug(args.name, 100)}-vectors.json"
    write_json_atomic(path, results)
    if args.atlas:
        from attnspec.conformance.vectors import atlas_answers

        doc = atlas_answers(bundles, outputs, args.name)
        if not doc["answers"]:
            print(
                "attnspec vectors verify: --atlas: these bundles hold no atlas cases (the sdpa float32 and float64 "
                "bundles do); no atlas row written",
                file=sys.stderr,
            )
        doc["environment"] = {"frameworks": {}, "spec_version": results["spec_version"]}
        if doc["answers"]:
            write_json_atomic(out / "results" / f"atlas-{slug(args.name, 100)}.json", doc)
        for a in doc["answers"]:
            differs = a["spec"] and a["answer"] != a["spec"] and not a["answer"].startswith("n/a")
            differs = "   <- differs from the spec" if differs else ""
            print(f"atlas: {a['title']:40} {a['answer']}{differs}", file=sys.stderr)
    render_reports(out)
    print(feature_table(results), file=sys.stderr)
    for line in failure_lines(results, out / "repro"):
        print(line, file=sys.stderr)
    print("\n" + coverage_text(results.get("coverage", {})), file=sys.stderr)
    rows = results["vectors"]["bundles"]
    for b in rows:
        print(
            f"bundle {b['bundle']} (spec {results['vectors']['spec_versions'][0]}): {b['cases']} cases, "
            f"{b['passed']} passed, {b['failed']} failed, {b['unsupported']} unsupported, {b['not_run']} not run",
            file=sys.stderr,
        )
    missing = [] if args.case else list(not_run_ids(bundles, outputs))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        cases = "case has" if len(missing) == 1 else "cases have"
        print(
            f"NOT RUN {len(missing)} {cases} no output and no .unsupported declaration: {shown}",
            file=sys.stderr,
        )
    unsupported: dict[str, int] = {}
    for r in results["rows"]:
        for reason in r.get("unsupported_reasons") or ():
            unsupported.setdefault(reason, 0)
            unsupported[reason] += 1
    for reason in list(unsupported)[:5]:
        print(f"unsupported (declared): {reason}", file=sys.stderr)
    s = summary(results)
    ran = sum(b["passed"] + b["failed"] for b in rows)
    verdict = "FAILS" if s["bad"] else "INCOMPLETE" if (missing or ran == 0) else "CONFORMS"
    declared = sum(b["unsupported"] for b in rows)
    if verdict == "CONFORMS" and declared:
        verdict += f" (on the {ran} of {ran + declared} cases it ran; {declared} declared unsupported)"
    if verdict == "INCOMPLETE" and ran == 0:
        print("attnspec vectors verify: no case ran to a verdict", file=sys.stderr)
    text = s["text"] + (f"; {len(missing)} not run (no output, no declaration)" if missing else "")
    print(f"\n{verdict}: {text}\nreport: {out / 'index.md'}\nresults: {path}", file=sys.stderr)
    return 0 if verdict.startswith("CONFORMS") else 1
