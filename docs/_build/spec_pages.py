"""The specification pages (docs/spec/), generated at build time.

The prose and the LaTeX are hand-written in ``docs/spec/_rules.toml``; everything else is computed
here from the code when the site is built: each clause's title (`attnspec.spec.clauses.CLAUSES`),
the version that introduced or changed it (``spec/CHANGELOG.md``), its worked example (`examples`,
which call the spec's functions) and its picture (the example's visibility grid, or one `pictures`
computes from the spec), the properties that check it (`PROPERTY_CLAUSES`),
the vector families whose cases carry it (drawn now, as ``attnspec vectors export`` draws them) and
the implementations that follow or deviate from it (the atlas' ``docs.gen.implementations_for``).
"""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import re
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from attnspec.spec.clauses import CLAUSES, PROPERTY_CLAUSES, SPEC_VERSION

from . import examples, pictures, svg
from .repo_links import github_slug

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "spec" / "_rules.toml"
CHANGELOG = ROOT / "spec" / "CHANGELOG.md"
SEMANTICS_SOURCE = ROOT / "spec" / "README.md"
#: where the semantics page (spec/README.md) lands in the site, relative to docs/spec/
SEMANTICS = "../repo/spec/README.md"
#: the vectors' profile whose bundles the pages count
VECTOR_PROFILE = "dev"


@dataclass
class Group:
    slug: str
    title: str
    intro: str
    clauses: list[dict] = field(default_factory=list)

    @property
    def page(self) -> str:
        return f"spec/{self.slug}.md"


def load_groups(path: Path = RULES) -> list[Group]:
    data = tomllib.loads(path.read_text())
    return [
        Group(g["slug"], g["title"], g["intro"].strip(), list(g.get("clauses", []))) for g in data["group"]
    ]


def clause_pages(groups: list[Group]) -> dict[str, str]:
    """clause id -> the page (docs-relative) whose section defines it."""
    return {c["id"]: g.page for g in groups for c in g.clauses}


# -- computed facts -------------------------------------------------------------------------------


def clause_versions(text: str | None = None) -> dict[str, list[str]]:
    """clause id -> the spec versions whose CHANGELOG entry names it, oldest first (the first
    introduced it, the others changed it)."""
    text = CHANGELOG.read_text() if text is None else text
    found: dict[str, list[str]] = defaultdict(list)
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for section in reversed(sections):  # the changelog lists the newest first
        head, _, body = section.partition("\n")
        version = re.match(r"(\d+\.\d+\.\d+)", head)
        if not version:
            continue
        for cid in dict.fromkeys(re.findall(r"`([a-z0-9_.]+)`", body)):
            if cid in CLAUSES and version.group(1) not in found[cid]:
                found[cid].append(version.group(1))
    return dict(found)


def semantics_anchor(where: str) -> str:
    """The heading of the semantics page (spec/README.md) that states a clause (`Clause.where`:
    "decision 4", "Bad input", "sdpa_fp8", "sdpa, visibility table"...): its id, or ``clauses``."""
    first = where.split(",")[0].strip()
    if first.startswith("decision"):
        return "decisions"
    for line in SEMANTICS_SOURCE.read_text().splitlines():
        if not line.startswith("#"):
            continue
        text = line.lstrip("#").strip()
        plain = text.strip("`")
        if plain.lower() == first.lower() or plain.startswith(f"{first}("):
            return github_slug(text.replace("`", ""))
    return "clauses"


def properties_of(cid: str) -> list[str]:
    return [f"{fn}.{prop}" for (fn, prop), ids in PROPERTY_CLAUSES.items() if cid in ids]


@cache
def vector_counts() -> dict[str, dict[str, tuple[int, int, str]]]:
    """clause id -> family -> (cases carrying it, cases, dtype) in the family's first bundle of the
    `VECTOR_PROFILE` profile, drawn as ``attnspec vectors export`` draws it."""
    import attnspec.conformance.vectors_families
    import attnspec.conformance.vectors_kernels  # noqa: F401
    from attnspec.conformance.vectors import PROFILE_CASES, families, family_dtypes

    counts: dict[str, dict[str, tuple[int, int, str]]] = defaultdict(dict)
    for name, fam in families().items():
        dtype = family_dtypes(fam)[0]
        cases = fam.cases(dtype, PROFILE_CASES[VECTOR_PROFILE])
        per: dict[str, int] = defaultdict(int)
        for case in cases:
            for cid in case.clauses:
                per[cid] += 1
        for cid, hits in per.items():
            counts[cid][name] = (hits, len(cases), dtype)
    return dict(counts)


def implementations_table() -> Callable[..., str]:
    """The atlas' per-clause table (``docs/gen``, written beside this), or a placeholder while it
    does not exist yet."""
    try:
        from gen import implementations_for
    except ImportError:
        return lambda cid, page: "*(implementations table pending: `docs/gen` does not provide it yet)*"
    return implementations_for


# -- rendering ------------------------------------------------------------------------------------


def _version_line(cid: str, versions: dict[str, list[str]]) -> str:
    found = versions.get(cid)
    if not found:
        return (
            "**Version.** Not named in `spec/CHANGELOG.md`; it holds since 1.0.0, the first "
            "labelled version, whose rules were all given clauses."
        )
    line = f"**Version.** Introduced in {found[0]}"
    if len(found) > 1:
        line += "; changed in " + ", ".join(found[1:])
    return line + " ([changelog](../repo/spec/CHANGELOG.md))."


def _worked(cid: str) -> list[str]:
    worked = examples.run(cid)
    if worked is None:
        return []
    out = ["**Worked example** (run when this page was built):", "", "```python", worked.source, "```", ""]
    printed = "\n".join(examples.show(name, value) for name, value in worked.values.items())
    out += ["```text", printed, "```", ""]
    pic = None
    if worked.picture is not None:
        n, m = worked.picture.shape
        pic = svg.mask(
            worked.picture,
            f"The example's <code>picture</code>: {n} query rows by {m} keys, filled where the key is "
            "visible, as the spec's mask code computes it.",
        )
    elif cid in pictures.PICTURES:
        with warnings.catch_warnings():  # NaN compared on purpose (tolerance.nonfinite)
            warnings.simplefilter("ignore", RuntimeWarning)
            pic = pictures.PICTURES[cid]()
    if pic is not None:
        out += [
            '<figure class="attnspec-figure" markdown="span">',
            svg.draw(pic, f"{cid}: {pic.rows} by {pic.cols}"),
            f"<figcaption>{pic.caption}</figcaption>",
            "</figure>",
            "",
        ]
    return out


def _checked_by(cid: str) -> list[str]:
    props = properties_of(cid)
    if props:
        line = "**Properties.** Checked on every case by " + ", ".join(f"`{p}`" for p in props) + "."
    else:
        line = (
            "**Properties.** No property checks it on every case; it is checked by every case "
            "that exercises it (`attnspec.spec.clauses.case_clauses`)."
        )
    fams = vector_counts().get(cid, {})
    if fams:
        parts = [f"`{name}` ({hits} of {total} {dtype} cases)" for name, (hits, total, dtype) in fams.items()]
        vec = (
            "**Vectors.** Carried by the cases of "
            + ", ".join(parts)
            + f" in the `{VECTOR_PROFILE}` bundles ([conformance vectors](../repo/conformance/VECTORS.md))."
        )
    else:
        vec = (
            f"**Vectors.** No case of the `{VECTOR_PROFILE}` bundles names it among its clauses "
            "(`attnspec vectors export`); the suite checks it."
        )
    return [line, "", vec, ""]


def render_group(group: Group, versions: dict[str, list[str]], implementations: Callable[..., str]) -> str:
    lines = [f"# {group.title}", "", group.intro, ""]
    for entry in group.clauses:
        cid = entry["id"]
        rule = CLAUSES[cid]
        lines += [
            f"## `{cid}` {{#{cid}}}",
            "",
            f"**Rule.** {_escape_md(rule.title)}. Stated on the [semantics page]"
            f"({SEMANTICS}#{semantics_anchor(rule.where)}): {rule.where}.",
            "",
            _version_line(cid, versions),
            "",
            "$$",
            entry["math"].strip(),
            "$$",
            "",
            entry.get("text", "").strip(),
            "",
            *_worked(cid),
            *_checked_by(cid),
            "**Implementations.**",
            "",
            implementations(cid, page=group.page).strip(),
            "",
        ]
    return "\n".join(lines)


def _escape_md(text: str) -> str:
    return text.replace("*", r"\*").replace("|", r"\|").replace("_", r"\_")


def render_index(groups: list[Group], versions: dict[str, list[str]]) -> str:
    lines = [
        "# The specification",
        "",
        f"attnspec's semantics, version **{SPEC_VERSION}** (`attnspec.spec.SPEC_VERSION`), one page "
        "per group of rules. Every rule has a clause id, stable and never reused; conformance "
        "failures, results files and vector bundles name clauses by these ids. The "
        f"[semantics page]({SEMANTICS}) is the decision table with the reasons and who differs; "
        "these pages give each clause its definition, a worked example computed by the spec "
        "when the site was built, and what checks it.",
        "",
        "| clause | rule | page | since |",
        "|---|---|---|---|",
    ]
    for g in groups:
        for entry in g.clauses:
            cid = entry["id"]
            since = versions.get(cid, ["1.0.0"])[0]
            title = _escape_md(CLAUSES[cid].title)
            lines.append(f"| [`{cid}`]({g.slug}.md#{cid}) | {title} | [{g.title}]({g.slug}.md) | {since} |")
    lines += [
        "",
        "## Reading the examples",
        "",
        "Each example is Python run against the installed `attnspec` when the site is built, after "
        "`import numpy as np` and `from attnspec import spec`; the values under it are what it "
        "returned. These helpers make their inputs:",
        "",
        "```python",
        examples.helpers_source(),
        "```",
        "",
        "Every clause has a picture, computed when the site was built. Where the example returns a "
        "`picture`, it is a visibility array made by the spec's mask code (`spec.causal_mask`, "
        "`spec.window_mask`, `spec.segment_mask`, `attnspec.spec.masks.visibility`...): row i is query i, "
        "column j key j, a filled cell a visible key. Otherwise the picture is drawn from what the spec "
        "returns for a small call (`docs/_build/pictures.py`): weights as shades, with the number in "
        "each cell (from `return_weights`, or from one-hot values, whose output rows are the weights), "
        "the query-head to kv-head map, the share of the tolerance budget used. Each picture says what "
        "its rows and columns are and has a legend.",
        "",
    ]
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """docs-relative path -> Markdown of every specification page."""
    groups = load_groups()
    versions = clause_versions()
    implementations = implementations_table()
    found = {"spec/index.md": render_index(groups, versions)}
    for g in groups:
        found[g.page] = render_group(g, versions, implementations)
    return found


def nav() -> list[dict[str, str] | str]:
    return ["spec/index.md", *({g.title: g.page} for g in load_groups())]
