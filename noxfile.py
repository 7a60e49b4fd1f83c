"""attnspec's sessions. ``nox -l`` lists them; every session passes ``session.posargs`` on."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import nox
from nox.command import CommandFailed

ROOT = Path(__file__).parent
# torch is pinned here (an unpinned torch pulls several GB of CUDA packages); override the file
# with ATTNSPEC_CONSTRAINTS=/path/to/constraints.txt, e.g. to test a CUDA build.
CONSTRAINTS = os.environ.get("ATTNSPEC_CONSTRAINTS", str(ROOT / "constraints.txt"))
PLUGIN = ROOT / "examples" / "attnspec-example-plugin"


def _literal(path: str, name: str):
    """The literal value assigned to ``name`` in one of the package's files. nox runs before attnspec
    is installed, so the file is parsed, not imported."""
    import ast

    for node in ast.parse((ROOT / path).read_text()).body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if getattr(target, "id", None) == name:
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{path} defines no {name}")


#: backend -> the extras its environment needs, from the registry's one table
#: (`attnspec.backends.BUILTINS`), plus the example third-party plugin, installed from examples/ like
#: any plugin. One environment per backend, so a framework's install can never mask another
#: backend's missing dependency.
BACKENDS = {
    **{
        name: list(extras)
        for name, (_target, _needs, extras) in _literal("backends/__init__.py", "BUILTINS").items()
    },
    "example": [],
}


def _atlas_backends() -> dict[str, str]:
    """atlas backend -> its extra, read from `attnspec.backends.atlas.natives.ATLAS` (the one list)."""
    return {
        name: extra
        for name, (_target, _needs, extra) in _literal("backends/atlas/natives.py", "ATLAS").items()
    }


#: the atlas' outside implementations (nox -s atlas), plus the two built-in native primitives,
#: whose suite runs in `conformance` and whose answers join the atlas here
ATLAS = {**_atlas_backends(), "torch-native": "torch", "jax-native": "jax"}

#: the suite's profiles, from their one table (conformance/profiles.py)
PROFILES = tuple(_literal("conformance/profiles.py", "PROFILE_EXAMPLES"))

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
# uv where it is installed (the README's commands install it): an environment with torch takes it
# seconds where pip took minutes, and `nox -s conformance` makes one per backend. Without uv, nox
# falls back to virtualenv and pip; both resolve the same versions (compared, pip freeze against
# uv pip freeze, for the tests' environment).
nox.options.default_venv_backend = "uv|virtualenv"


def _pip_find_links() -> str | None:
    """The find-links folder pip is configured with (``PIP_FIND_LINKS`` or a pip.conf), if any."""
    if os.environ.get("PIP_FIND_LINKS"):
        return os.environ["PIP_FIND_LINKS"]
    import configparser

    home = Path.home()
    for conf in (
        os.environ.get("PIP_CONFIG_FILE"),
        "/etc/pip.conf",
        "/etc/xdg/pip/pip.conf",
        home / ".config" / "pip" / "pip.conf",
        home / ".pip" / "pip.conf",
    ):
        parser = configparser.ConfigParser()
        try:
            parser.read(conf or "")
        except configparser.Error:
            continue
        if parser.has_option("global", "find-links"):
            return parser.get("global", "find-links")
    return None


# uv reads no pip configuration: a machine whose pip finds wheels in a local folder (a CPU build of
# torch, where the package index has the CUDA one) gives uv the same folder
if "UV_FIND_LINKS" not in os.environ and (_links := _pip_find_links()):
    os.environ["UV_FIND_LINKS"] = _links


def install(session: nox.Session, *args: str) -> None:
    session.install("-c", CONSTRAINTS, *args)


def package(extras: list[str]) -> str:
    return f".[{','.join(extras)}]" if extras else "."


def _kit_tests(session: nox.Session, tier: str) -> None:
    install(session, ".[all,atlas,reformer]")
    install(session, str(PLUGIN))
    # --durations: where the time goes, printed by every run (CI's included). Serial: the proofs run
    # suites in subprocesses two at a time already, and two xdist workers on CI's two cores made the
    # whole run slower (50 min against 39 serially; test_check's setup 791 s against 319 s).
    # pytest-xdist is in the `test` extra for a larger machine: `nox -s proofs -- -n 4 --dist loadfile`.
    # A -m of the caller's, after this one, takes its place.
    session.run("pytest", "--durations=25", "-m", tier, *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the kit's own tests (spec, backends, runner, plugin, reports, docs), all frameworks, but
    not the proofs: 7 to 13 minutes on 2 cores (tests/tiers.py)."""
    _kit_tests(session, "not proof")


@nox.session
def proofs(session: nox.Session) -> None:
    """Run the proofs that the suite and its verdicts work: the conformance suite, in a subprocess,
    on every mutant (each caught), every control (each passing) and every real function whose
    verdict a test reads. 30 to 48 minutes on 2 cores; CI runs it after `nox -s tests`."""
    _kit_tests(session, "proof")


def _conformance_args(posargs: list[str]) -> argparse.Namespace:
    # allow_abbrev=False: an option this parser does not know goes on whole (argparse would take
    # pytest's --dev... for --device otherwise)
    ap = argparse.ArgumentParser(prog="nox -s conformance --", allow_abbrev=False)
    ap.add_argument(
        "--backend",
        action="append",
        default=None,
        help="run only these backends (repeatable); a name not built in is run in an "
        "environment with --install packages added",
    )
    ap.add_argument("--install", action="append", default=[], help="extra pip requirement for the env")
    ap.add_argument(
        "--profile",
        default=os.environ.get("ATTNSPEC_PROFILE", "default"),
        choices=PROFILES,
        help="dev (12 examples a property), default (25), ci (100), thorough (1000)",
    )
    ap.add_argument("--device", default=None)
    ap.add_argument("--case-timeout", default="300")
    args, rest = ap.parse_known_args(posargs)
    args.pytest_args = [a for a in rest if a != "--"]  # -k EXPR, -x, --maxfail N...: to the runner's pytest
    return args


@nox.session
@nox.parametrize("backend", [*BACKENDS, "other"])
def conformance(session: nox.Session, backend: str) -> None:
    """Run the conformance suite for each backend in its own env, then render the reports.

    ``nox -s conformance -- --profile dev --backend numpy -k mha -x``: --backend, --install,
    --profile, --device and --case-timeout are read here; every other option (-k, -x, --maxfail N,
    -m ...) goes on to the runner, which hands it to pytest. A backend that cannot run here (CuPy
    or a GPU missing) is skipped with the registry's reason.
    """
    args = _conformance_args(session.posargs)
    if backend == "other":
        names = [b for b in args.backend or [] if b not in BACKENDS]
        if not names:
            session.skip("no --backend outside the built-in list")
        extras = ["all"]
    else:
        if args.backend and backend not in args.backend:
            session.skip(f"--backend selects {args.backend}")
        names, extras = [backend], BACKENDS[backend]
    install(session, package(["test", *extras]), *args.install)
    if backend == "example":
        install(session, str(PLUGIN))
    if backend != "other" and (why := _unavailable(session, backend)):
        session.skip(f"{backend} cannot run here: {why}")
    failed = []
    for name in names:
        run = ["--backend", name, "--profile", args.profile, "--case-timeout", args.case_timeout]
        if args.device:
            run += ["--device", args.device]
        # a backend that does not conform still gets its report rendered; the session fails after
        try:
            attnspec_module(session, "conformance.run", *run, *args.pytest_args)
        except CommandFailed as e:
            if getattr(e, "return_code", None) in (130, 143):  # SIGINT / SIGTERM: stopped, not failed
                session.notify("report", posargs=[])
                session.error(
                    f"{name} was interrupted; its finished cases are in reports/results (incomplete)"
                )
            failed.append(name)
    session.notify("report", posargs=[])
    if failed:
        session.error(f"{', '.join(failed)} failed conformance: see reports/accuracy.md")


@nox.session
@nox.parametrize("backend", list(ATLAS))
def atlas(session: nox.Session, backend: str) -> None:
    """Measure one outside implementation for the atlas (questions, then the suite), render reports/atlas.md."""
    ap = argparse.ArgumentParser(prog="nox -s atlas --")
    ap.add_argument("--profile", default="dev", choices=PROFILES)
    args, runner_args = ap.parse_known_args(session.posargs)
    install(session, package(["test", "report", ATLAS[backend]]))
    attnspec_module(
        session, "backends.atlas.questions", backend, "--out", f"reports/results/atlas-{backend}.json"
    )
    failed = False
    if backend not in BACKENDS:  # the built-in natives' suite runs in `nox -s conformance`
        try:
            attnspec_module(
                session, "conformance.run", "--backend", backend, "--profile", args.profile, *runner_args
            )
        except CommandFailed:
            failed = True
    session.notify("report", posargs=[])
    if failed:
        session.error(f"{backend} failed beyond its declared deviations: see reports/atlas.md")


#: the backends `attnspec.bench.targets.TARGETS` measures: a plain `nox -s bench` also
#: runs their targets (--targets-only, its own results file)
TARGET_BACKENDS = ("numpy", "array_api-numpy", "torch", "jax")
#: backend -> implementations a plain `nox -s bench` times on the "lsh" grid (L = 1024 ... 65536,
#: B=1 H=1 d=64): LSH against torch's fused and adapted full attention, and against the blocked
#: float64 golden; cases predicted over the grid's per-call limit are skipped with the reason
SCALING = {"torch": ("adapter,native,lsh", "float32"), "numpy": ("blocked,lsh", "float64")}


@nox.session
@nox.parametrize("backend", list(BACKENDS))
def bench(session: nox.Session, backend: str) -> None:
    """Benchmark each backend in its own env (grid, targets, LSH, Reformer, suite throughput), then render.

    ``nox -s bench -- --grid full``: options go to the harness (--grid, --targets-only, --device,
    --no-memory, ...), except pytest's selection options (-k EXPR, -m EXPR, -x, --maxfail N),
    which go to the suite-throughput run (the runner hands them to pytest). With harness options
    only the harness runs; with none, every step.
    """
    pytest_args, harness_args = _split_pytest_args(session.posargs)
    install(session, package(BACKENDS[backend]))
    if backend == "example":
        install(session, str(PLUGIN))
    if why := _unavailable(session, backend):
        session.skip(f"{backend} cannot run here: {why}")
    attnspec_module(session, "bench.run", "--backend", backend, *harness_args)
    if not harness_args and backend in TARGET_BACKENDS:  # the quick grid holds no target shape
        # numpy's targets include the conformance vectors, drawn by the suite's strategies (hypothesis)
        install(session, package(["test", *BACKENDS[backend]]))
        out = f"reports/results/bench-{backend}-cpu-targets.json"
        attnspec_module(session, "bench.run", "--backend", backend, "--targets-only", "--out", out)
    if not harness_args and backend in SCALING:
        impls, dtypes = SCALING[backend]
        grid = ["--grid", "lsh", "--impls", impls, "--dtypes", dtypes]
        out = f"reports/results/bench-{backend}-cpu-lsh.json"
        attnspec_module(session, "bench.run", "--backend", backend, *grid, "--out", out)
    if not harness_args:  # suite throughput: the dev profile's cases per second and first result
        install(session, package(["test", *BACKENDS[backend]]))
        out = f"{session.create_tmp()}/conformance-{backend}.json"
        run = [
            "--backend",
            backend,
            "--profile",
            "dev",
            "--out",
            out,
            "--timings",
            "reports/results/suite-timings",
        ]
        attnspec_module(session, "conformance.run", *run, *pytest_args, success_codes=[0, 1])
    if not harness_args and backend == "torch":  # #17: torch LSH vs the two Reformer libraries
        install(session, package(["reformer"]))
        attnspec_module(session, "bench.reformer")
    if backend == "numpy":  # the LSH approximation study is NumPy-only and takes seconds
        attnspec_module(session, "bench.lsh_quality")
    session.notify("report", posargs=[])


@nox.session
def vectors_c(session: nox.Session) -> None:
    """Check the C99 sdpa of examples/c-sdpa on exported conformance vectors (#26), and its -1e9 twin.

    Builds both binaries with the system C compiler ($CC, else cc) into build/c-sdpa, exports the
    dev profile's sdpa vectors in all four dtypes, runs both on every bundle, and verifies: the
    correct build must CONFORM (exit 0), the -1e9 fill twin must FAIL (exit 1) naming
    sdpa.empty_row. ``nox -s vectors_c -- --dtype float32`` narrows the dtypes (options go to
    examples/c-sdpa/check.py, the one copy of the check, which tests/test_vectors_c.py runs too).
    """
    if not shutil.which(os.environ.get("CC", "cc")):
        session.error("no C compiler: set CC or install cc")
    install(session, ".[test]")  # export draws its cases with the suite's generators (hypothesis)
    session.run("python", "examples/c-sdpa/check.py", "--work", "build/c-sdpa", *session.posargs)


@nox.session
def mutation(session: nox.Session) -> None:
    """Mutation testing (#28): cosmic-ray over tests/mutation/reference_sdpa.py and the conventions.

    Every mutant is judged by the `attnspec check` machinery (dev profile, first failure), two at a
    time, each worker in its own copy of the tree under build/mutation; an interrupted run resumes
    (``-- --fresh`` starts over). Writes reports/results/mutation.json and renders
    reports/mutation.md. ``-- --target reference`` or ``conventions`` runs one target;
    ``-- --sample ci`` runs the 20 mutants of tests/mutation/ci_sample.toml and fails unless all die.
    """
    install(
        session, "pip", "setuptools>=69", ".[mutation]"
    )  # workers: pip install --target, no build isolation
    session.run("python", "tests/mutation/run_mutation.py", *session.posargs)  # renders reports/mutation.md


@nox.session
def demo(session: nox.Session) -> None:
    """Train the copy-task example through torch's and JAX's mha (seconds), then render."""
    install(session, ".[torch,jax,report]")
    # posargs go to the example: --steps N, --framework torch, ...
    attnspec_module(session, "bench.copy_task", *session.posargs)
    session.notify("report", posargs=[])


@nox.session
def report(session: nox.Session) -> None:
    """Render reports/*.md and plots from every results JSON under reports/results/."""
    install(session, ".[report]")
    session.run("python", "-m", "attnspec.reports.render", *session.posargs)


#: pytest's selection options that `bench` passes to its suite run (value: takes an argument)
_PYTEST_SELECTION = {"-k": True, "-m": True, "--maxfail": True, "-x": False, "--exitfirst": False}


def _split_pytest_args(posargs: list[str]) -> tuple[list[str], list[str]]:
    """(pytest's selection options, the rest) of ``posargs``, each in its order."""
    pytest_args, rest = [], []
    args = iter(a for a in posargs if a != "--")
    for a in args:
        name = a.split("=", 1)[0]
        if name in _PYTEST_SELECTION:
            pytest_args.append(a)
            if _PYTEST_SELECTION[name] and "=" not in a:
                pytest_args.append(next(args, ""))
        else:
            rest.append(a)
    return pytest_args, rest


_AVAILABLE = """import sys
import attnspec.backends as b
name = sys.argv[1]
a = b.available()[name]
try:
    why = a.reason if not a.installed else ("" if b.get(name).devices() else "no device")
except Exception as e:  # e.g. CuPy without a GPU
    why = f"{type(e).__name__}: {e}"
print("UNAVAILABLE:" + why if why else "AVAILABLE")
"""


def _unavailable(session: nox.Session, backend: str) -> str:
    """Why ``backend`` cannot run in the session's environment ("" when it can)."""
    out = session.run("python", "-c", _AVAILABLE, backend, silent=True) or ""
    line = out.strip().splitlines()[-1] if out.strip() else "UNAVAILABLE:no answer"
    return line.removeprefix("UNAVAILABLE:") if line.startswith("UNAVAILABLE:") else ""


#: the linters, pinned so a new release's new rules never turn a green tree red by themselves
LINTERS = ("ruff==0.17.6", "mypy==2.4.1")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/ (mkdocs build --strict: a broken link fails it)."""
    # mkdocstrings reads the package as installed (a real copy, as lint's mypy does): the import
    # package is assembled from five folders, which its static finder cannot map from the tree
    install(session, ".[docs]")
    shutil.rmtree("build", ignore_errors=True)
    session.install("--no-deps", "--force-reinstall", ".")
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # material's banner about its successor, on every build
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Lint (ruff check), check formatting (ruff format --check) and type-check (mypy) the kit."""
    session.install(*LINTERS)
    # mypy reads the package as installed (a real copy, not the editable import hook): the import
    # package `attnspec` is assembled from five folders, which mypy cannot map from the tree
    install(session, ".[test]")
    # setuptools keeps build/lib between builds, so a module deleted from the tree would still be
    # installed (and type-checked) from there
    shutil.rmtree("build", ignore_errors=True)
    session.install("--no-deps", "--force-reinstall", ".")
    failed = []
    checks = {
        "ruff check": ["ruff", "check", "."],
        "ruff format": ["ruff", "format", "--check", "."],
        "mypy": ["mypy", "-p", "attnspec"],
    }
    for name, cmd in checks.items():
        try:
            session.run(*cmd)
        except CommandFailed:
            failed.append(name)
    if failed:
        session.error(f"{', '.join(failed)} failed")


def attnspec_module(session: nox.Session, module: str, *args: str, **kw: Any) -> None:
    """``python -m attnspec.MODULE ARGS`` in the session; what it writes is stamped with the commit."""
    session.run(
        "python", "-m", f"attnspec.{module}", *args, env={"ATTNSPEC_GIT_COMMIT": _git_commit(session)}, **kw
    )


def _git_commit(session: nox.Session) -> str:
    try:
        commit = session.run("git", "rev-parse", "--short", "HEAD", silent=True, external=True).strip()
        dirty = session.run(
            "git", "status", "--porcelain", "--untracked-files=no", silent=True, external=True
        )
        return commit + ("-dirty" if dirty.strip() else "")
    except Exception:  # not a git checkout (an sdist): the report says unknown
        return "unknown"


#: the browser test's Selenium (Chromium itself is Debian's, never downloaded)
SELENIUM = "selenium==4.51.0"


@nox.session
def docs_browser(session: nox.Session) -> None:
    """Build the site (as `docs`), then drive headless Chromium over every page (needs Debian's chromium)."""
    # apt-get install -y chromium chromium-driver: the check uses /usr/bin/chromium and chromedriver
    missing = [exe for exe in ("/usr/bin/chromium", "/usr/bin/chromedriver") if not Path(exe).exists()]
    if missing:
        session.error(f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver")
    session.install(SELENIUM)
    posargs = list(session.posargs)  # the browser check's; the build takes none
    session.posargs.clear()
    docs(session)
    session.run(
        "python",
        "docs/browser_check.py",
        "--site",
        "site",
        "--docs",
        "docs",
        "--screenshots",
        "docs/screenshots",
        *posargs,
    )
