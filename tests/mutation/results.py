"""The mutation run's results JSON (``attnspec.mutation/1``, reports/SCHEMA.md) from cosmic-ray's
session databases, with every survivor classed as equivalent (listed in equivalent.toml, with
its reason) or a gap."""

from __future__ import annotations

import ast
import datetime
import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import tomllib
from filters import OUT_OF_SCOPE, definition_at, short_path

HERE = Path(__file__).resolve().parent
SCHEMA = "attnspec.mutation/1"
OUTCOMES = ("killed", "timed_out", "survived_equivalent", "survived_gap", "error", "skipped")


def equivalents() -> list[dict]:
    return tomllib.loads((HERE / "equivalent.toml").read_text()).get("mutant", [])


def open_gaps() -> list[dict]:
    """Gaps analysed and not closed yet (open_gaps.toml): still counted as gaps, with the reason."""
    path = HERE / "open_gaps.toml"
    return tomllib.loads(path.read_text()).get("mutant", []) if path.exists() else []


def _diff_lines(diff: str) -> tuple[str, str]:
    """The first removed and added source lines of a unified diff, stripped."""
    minus = next(
        (ln[1:].strip() for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")), ""
    )
    plus = next(
        (ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")), ""
    )
    return minus, plus


def _equivalent_reason(m: dict, table: list[dict]) -> str | None:
    for e in table:
        if (
            e["file"] == m["file"]
            and e["operator"] == m["operator"]
            and e["before"] == m["before"]
            and e["after"] == m["after"]
        ):
            return e["reason"]
    return None


def _same_mutant(m: dict) -> tuple:
    """What names a mutant across sessions of the same file: where, and the line before and after."""
    return (m["file"], m["line"], m.get("before", ""), m.get("after", ""))


def target_of(session_name: str) -> str:
    return session_name.split("-sample-")[0]


def collect(sessions: dict[str, Path], work: Path, sample: str | None) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db

    table = equivalents()
    still_open = open_gaps()
    mutants = []
    elapsed = 0.0
    for target, db in sessions.items():
        name = db.stem
        results: dict[str, object] = {}
        shards = sorted(work.glob(f"{name}-shard*.sqlite"))
        for shard in shards:
            with use_db(str(shard), WorkDB.Mode.open) as wdb:
                for job_id, r in wdb.results:
                    if r.output == "another shard":
                        continue
                    results[job_id] = r
        with use_db(str(db), WorkDB.Mode.open) as wdb:
            items = list(wdb.work_items)
            for job_id, r in wdb.results:  # the filters' marks live in the session itself
                results.setdefault(job_id, r)
        e = work / f"{name}-elapsed.json"
        elapsed += json.loads(e.read_text())["elapsed_s"] if e.exists() else 0.0
        trees: dict[str, ast.Module] = {}
        for item in items:
            spec = item.mutations[0]
            path = str(spec.module_path)
            if path not in trees:
                trees[path] = ast.parse(
                    (work / "pristine-site" / path).read_text()
                    if (work / "pristine-site" / path).exists()
                    else (work / "w0" / path).read_text()
                )
            r = results.get(item.job_id)
            m = {
                "id": item.job_id,
                "target": target,
                "file": short_path(path),
                "line": spec.start_pos[0],
                "col": spec.start_pos[1],
                "definition": definition_at(trees[path], spec.start_pos[0]),
                "operator": spec.operator_name.removeprefix("core/"),
                "occurrence": spec.occurrence,
            }
            if r is None:
                m["outcome"] = "pending"
            elif r.worker_outcome == "skipped":
                m["outcome"], m["why"] = "skipped", (r.output or "").removeprefix("filtered: ")
            elif r.worker_outcome != "normal" or r.test_outcome == "incompetent":
                m["outcome"], m["why"] = "error", (r.output or str(r.worker_outcome))[-300:]
            else:
                out = (r.output or "").strip()
                m["before"], m["after"] = _diff_lines(r.diff or "")
                m["why"] = out.splitlines()[-1][:300] if out else ""
                seconds = re.search(r"\((\d+(?:\.\d+)?) s\)$", m["why"])
                m["seconds"] = float(seconds.group(1)) if seconds else None
                if r.test_outcome == "killed":
                    m["outcome"] = "timed_out" if out == "timeout" or "timed out" in m["why"] else "killed"
                else:
                    reason = _equivalent_reason(m, table)
                    m["outcome"] = "survived_equivalent" if reason else "survived_gap"
                    if reason:
                        m["reason"] = reason
                    elif why_open := _equivalent_reason(m, still_open):
                        m["open"] = why_open
                m["diff"] = r.diff
            mutants.append(m)
    data = summarise(mutants, elapsed, sample)
    gaps = []
    before_totals = {}
    for name in sessions:
        before = work / f"{name}-before.json"
        if not before.exists():
            continue
        saved = json.loads(before.read_text())
        before_totals[name] = {**saved["totals"], "note": saved.get("note", "")}
        # a survivor is found again by what it changes, not by its job id, so a "before" kept from
        # an earlier session (or another machine's) still meets its mutant in a fresh one
        now = {_same_mutant(m): m for m in mutants if m["target"] == target_of(name)}
        for m in saved["survivors"].values():
            after = now.get(_same_mutant(m))
            if after and after["outcome"] in ("killed", "timed_out"):
                gaps.append(
                    {
                        "target": target_of(name),
                        "mutant": f"{m['file']}:{m['line']} {m.get('before', '')} -> {m.get('after', '')}",
                        "fixed_by": after.get("why", ""),
                    }
                )
    if before_totals:
        data["before_after"] = {"before": before_totals, "gaps": gaps}
    return data


def summarise(mutants: list[dict], elapsed: float, sample: str | None) -> dict:
    def totals(ms: list[dict]) -> dict:
        c = Counter(m["outcome"] for m in ms)
        run = sum(c[o] for o in ("killed", "timed_out", "survived_equivalent", "survived_gap", "error"))
        denominator = run - c["survived_equivalent"]
        return {
            "generated": len(ms),
            "skipped": c["skipped"],
            "pending": c["pending"],
            "run": run,
            "killed": c["killed"],
            "timed_out": c["timed_out"],
            "survived_equivalent": c["survived_equivalent"],
            "survived_gap": c["survived_gap"],
            "error": c["error"],
            "score": (c["killed"] + c["timed_out"] + c["error"]) / denominator if denominator else 0.0,
        }

    skipped = Counter(m["why"] for m in mutants if m["outcome"] == "skipped")
    by = {}
    for key in ("target", "file", "operator"):
        groups: dict[str, list[dict]] = {}
        for m in mutants:
            name = m[key] if key != "operator" else m[key].split("_")[0]
            groups.setdefault(name, []).append(m)
        by[key] = {k: totals(v) for k, v in sorted(groups.items())}
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip()
    except OSError:
        commit = ""
    from importlib import metadata

    try:  # the run's environment has it (nox -s mutation); the kit's tests summarise without it
        version = metadata.version("cosmic-ray")
    except metadata.PackageNotFoundError:
        version = "not installed"
    return {
        "schema": SCHEMA,
        "tool": {"name": "cosmic-ray", "version": version},
        "git_commit": commit,
        "date": datetime.date.today().isoformat(),
        "profile": "dev",
        "sample": sample,
        "elapsed_s": round(elapsed),
        "filters": {"skipped": dict(skipped), "out_of_scope": OUT_OF_SCOPE},
        "totals": totals(mutants),
        "by_target": by["target"],
        "by_file": by["file"],
        "by_operator": by["operator"],
        "mutants": mutants,
    }


def write_results(data: dict, repo: Path, sample: str | None) -> Path:
    path = (
        repo / "build" / "mutation" / f"sample-{sample}.json"
        if sample
        else repo / "reports" / "results" / "mutation.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
