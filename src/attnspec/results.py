"""Writing results JSON: the atomic write and the environment stamp every results file carries.

Every producer of results (the conformance runner and recorder, the benchmark harness, the copy
task, the LSH quality study, the atlas' questions) writes through here and stamps its environment
with `framework_versions` (the spec's version among them); `attnspec.reports` reads and
validates what they wrote (`attnspec.reports._io`, schemas in `reports/SCHEMA.md`).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["framework_versions", "git_state", "write_json_atomic"]


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # JSON has no inf or NaN; the reader accepts "inf", "-inf" and "nan"
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not possible on every platform; the rename itself is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so that readers see the old file or the new one, never half.

    The data goes to a temporary file in the same directory, is fsynced, and replaces ``path``
    with `os.replace`. Non-finite floats are written as the strings "inf", "-inf", "nan".
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_json_safe(obj), f, indent=1, sort_keys=True, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


# -- environment shared by every results JSON ---------------------------------------------------
FRAMEWORKS = (
    "numpy",
    "ml_dtypes",
    "torch",
    "jax",
    "jaxlib",
    "array-api-compat",
    "array-api-strict",
    "cupy-cuda12x",
    "cupy-cuda13x",
    "hypothesis",
    "mlx",
    "tinygrad",
    "keras",
    "flax",
    "transformers",
    "reformer-pytorch",
)
#: the entry of `framework_versions` that holds the spec's version
SPEC_KEY = "attnspec.spec"


def framework_versions() -> dict[str, str]:
    """Installed versions of the frameworks a results file depends on, and of the semantics it was
    judged against (``attnspec.spec``: `attnspec.spec.clauses.SPEC_VERSION`, versioned apart from
    the package): every producer stamps its environment with these, so every results file says
    which version of the spec its numbers and verdicts are about."""
    from importlib import metadata

    from attnspec.spec.clauses import SPEC_VERSION

    out = {SPEC_KEY: SPEC_VERSION}
    for name in FRAMEWORKS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def environment(numerics_policy: dict[str, Any]) -> dict[str, Any]:
    """What every results file says of where it was made: attnspec's version, the git state, Python,
    the platform, the frameworks' versions (`framework_versions`) and the backend's numerics policy.
    Each producer adds its own keys after these."""
    import platform

    import attnspec

    return {
        "attnspec": attnspec.__version__,
        **git_state(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "frameworks": framework_versions(),
        "numerics_policy": numerics_policy,
    }


def git_state() -> dict[str, Any]:
    """{"git_commit", "git_dirty"}: from ATTNSPEC_GIT_COMMIT (set by nox, "abc1234[-dirty]"), else git."""
    import subprocess

    commit, dirty_env = os.environ.get("ATTNSPEC_GIT_COMMIT"), os.environ.get("ATTNSPEC_GIT_DIRTY")
    dirty: bool | None
    if commit is None:
        try:
            git = ["git", "-C", str(Path(__file__).resolve().parent)]
            commit = subprocess.run(
                [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            dirty = bool(
                subprocess.run(
                    [*git, "status", "--porcelain", "--untracked-files=no"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout.strip()
            )
        except (OSError, subprocess.SubprocessError):
            commit, dirty = "unknown", None
    else:
        dirty = commit.endswith("-dirty") if dirty_env is None else dirty_env == "1"
        commit = commit.removesuffix("-dirty")
    return {"git_commit": commit, "git_dirty": dirty}
