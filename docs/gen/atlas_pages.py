"""The atlas as pages: the interactive grid, one entry page per implementation, and the table of
implementations a spec clause's page shows.

The grid is a plain Markdown table (so mkdocs checks and rewrites every link in it) marked by the
``atlas-grid`` element before it; ``docs/assets/atlas.js`` adds the filters, the sorting and the
dialog that shows a cell's reproducer, fetched from the implementation's entry page, where each
reproducer is a ``<pre id="repro-QUESTION">`` (readable and linkable without JavaScript).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from attnspec.reports.accuracy import verdict

from .data import DASH, Cell, Implementation, atlas, clauses, esc, md_cell, questions, slug

INDEX = "atlas/index.md"

STATUS_WORDS = {
    "spec": "as the spec",
    "deviates": "declared deviation",
    "undeclared": "undeclared difference",
    "n/a": "cannot be asked",
    "documented": "one of the spec's options",
}


def rel(from_page: str, to_page: str) -> str:
    """The relative Markdown link from one docs page to another (both relative to docs/)."""
    return posixpath.relpath(to_page, posixpath.dirname(from_page) or ".")


def deviation_anchor(dev_id: str) -> str:
    return f"dev-{slug(dev_id)}"


def _cell_md(cell: Cell, impl: Implementation, page: str) -> str:
    """A grid cell: the answer (marked with its status for atlas.js), its deviation and its reproducer."""
    answer = cell.answer
    if cell.status == "n/a":
        answer = DASH
    title = f"{cell.title}: {cell.answer}" + (f" (spec: {cell.spec})" if cell.spec else "")
    parts = [
        f'<span class="atlas-answer atlas-{slug(cell.status)}" data-status="{cell.status}" '
        f'title="{esc(title)}">{esc(answer)}</span>'
    ]
    links = []
    if cell.deviation is not None:
        links.append(
            f'[<span title="{esc(cell.deviation["id"])}">declared</span>]'
            f"({rel(page, INDEX)}#{deviation_anchor(cell.deviation['id'])})"
        )
    elif cell.status == "undeclared":
        links.append("*undeclared*")
    if cell.reproducer:
        link = f"{rel(page, impl.page)}#repro-{slug(cell.question)}"
        links.append(f'[<span class="atlas-repro-link">repro</span>]({link})')
    if links:
        parts.append('<span class="atlas-links">' + " · ".join(links) + "</span>")
    return " ".join(parts)


def _verdict(impl: Implementation) -> str:
    if not impl.conformance:
        return "suite not run"
    return "; ".join(f"{c['device']}: {verdict(c)}" for c in impl.conformance)


def atlas_index(impls: Iterable[Implementation]) -> str:
    impls = list(impls)
    qs = questions()
    page = INDEX
    headers = ["implementation", *(q.title for q in qs), "suite verdict"]
    spec_row = [
        '<span class="atlas-spec-row">the spec</span>',
        *(esc(q.spec) if q.spec else "(names both)" for q in qs),
        DASH,
    ]
    rows = [spec_row]
    for impl in impls:
        first = (
            f'<span id="{impl.anchor}" class="atlas-impl" data-backend="{esc(impl.backend)}"></span>'
            f"[`{impl.backend}`]({rel(page, impl.page)})"
        )
        cells = [_cell_md(impl.cells[q.id], impl, page) if q.id in impl.cells else DASH for q in qs]
        rows.append([first, *cells, md_cell(_verdict(impl))])
    n_dev = sum(1 for i in impls for c in i.cells.values() if c.differs)
    lines = [
        "---",
        "hide: [navigation, toc]",
        "---",
        "",  # the grid needs the page's whole width
        "# The attention atlas",
        "",
        f"{len(impls)} implementations nobody here wrote, each called as its own users call it (its native",
        "primitive through a calling convention, no fix-up), asked the questions where implementations",
        f"disagree and the spec decides. {n_dev} answers differ from the spec; each links the deviation",
        "declared for it and the standalone reproducer of the exact call that was measured (no attnspec",
        "in it). A dash is a question the implementation cannot be asked. The spec's own answers are the",
        "first row; where it names two options (the causal alignment) either is conforming.",
        "",
        "Filter by implementation or question, show only deviations, sort by a column's header. In a",
        "cell, *repro* opens the snippet of the call measured and *declared* the deviation declared for",
        "it. Rendered from `reports/results/atlas-*.json`.",
        "",
        '<div class="atlas-grid" id="atlas-grid"></div>',
        "",
        _table(headers, rows),
        "",
        "## Declared deviations",
        "",
        "From `backends/atlas/deviations.toml` (and, for the built-in natives, the catalogue in",
        "`attnspec.backends.deviations`), checked both ways when the atlas ran: *observed* means the",
        "question still gives the declared answer; *stale* that it no longer does (the entry must go).",
        "",
    ]
    dev_rows = []
    shown: set[str] = set()
    for impl in impls:
        for e in impl.entries:
            if e["id"] in shown:
                continue
            shown.add(e["id"])
            cell = impl.cells.get(e["question"])
            repro = (
                f"[reproducer]({rel(page, impl.page)}#repro-{slug(e['question'])})"
                if cell is not None and cell.reproducer
                else DASH
            )
            upstream = f"[upstream]({e['upstream']})" if e.get("upstream") else DASH
            status = e["status"] if len(e["status"]) < 20 else "declared (built-in catalogue)"
            dev_rows.append(
                [
                    f'<span id="{deviation_anchor(e["id"])}"></span>`{e["id"]}`',
                    f"[`{impl.backend}`]({rel(page, impl.page)})",
                    md_cell(cell.title if cell else e["question"]),
                    md_cell(e["measured"]),
                    status,
                    md_cell(e["summary"]),
                    f"{repro} · {upstream}",
                ]
            )
    lines.append(
        _table(
            ["deviation", "implementation", "question", "measured", "status", "what it does", "links"],
            dev_rows,
        )
        if dev_rows
        else "None declared."
    )
    undeclared = [(i, c) for i in impls for c in i.cells.values() if c.status == "undeclared"]
    if undeclared:
        lines += [
            "",
            "## Undeclared differences",
            "",
            _table(
                ["implementation", "question", "answer", "spec"],
                [
                    [f"`{i.backend}`", md_cell(c.title), md_cell(c.answer), md_cell(c.spec)]
                    for i, c in undeclared
                ],
            ),
        ]
    return "\n".join(lines) + "\n"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _pre(text: str, ident: str) -> str:
    # raw HTML, not a fenced block: a reproducer's literal arrays would be multiplied by the
    # highlighter's spans, and atlas.js reads the snippet back from this element's text.
    # Blank lines inside would end the HTML block for Markdown, so they become an entity.
    body = esc(text.rstrip()).replace("\n\n", "\n&#10;")
    return f'<pre class="atlas-repro" id="{ident}" data-search-exclude><code>{body}</code></pre>'


def entry_page(impl: Implementation) -> str:
    page = impl.page
    doc = impl.doc
    info = doc.get("implementation") or {}
    versions = (doc.get("environment") or {}).get("frameworks") or {}
    lines = [
        f"# `{impl.backend}`",
        "",
        f"[Back to the atlas]({rel(page, INDEX)}#{impl.anchor}) · "
        f"[conformance results]({rel(page, 'results/backends/' + slug(impl.backend) + '.md')})",
        "",
    ]
    facts = [
        ("calls", info.get("function")),
        ("calling convention", info.get("convention")),
        ("signature", info.get("signature")),
        ("versions", ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) or None),
        ("conformance suite", _verdict(impl)),
        ("results file", f"`reports/results/{doc['_file']}`"),
    ]
    lines += [f"- **{k}**: {md_cell(v)}" for k, v in facts if v]
    lines += ["", "## Answers", ""]
    rows = []
    for cell in impl.cells.values():
        dev = (
            f"`{cell.deviation['id']}`"
            if cell.deviation
            else ("undeclared" if cell.status == "undeclared" else "")
        )
        repro = f"[reproducer](#repro-{slug(cell.question)})" if cell.reproducer else DASH
        rows.append(
            [
                md_cell(cell.title),
                md_cell(cell.answer),
                md_cell(cell.spec or "(names both)"),
                " ".join(x for x in (STATUS_WORDS[cell.status], dev) if x),
                repro,
            ]
        )
    lines.append(_table(["question", "answer", "spec", "status", ""], rows))
    with_repro = [c for c in impl.cells.values() if c.reproducer]
    if with_repro:
        lines += [
            "",
            "## Reproducers",
            "",
            "Each is the exact call the atlas made, as standalone Python that imports only the framework",
            "and NumPy; it prints the output to compare with the answer above.",
            "",
        ]
        for cell in with_repro:
            lines += [
                f"### {cell.title}",
                "",
                f"Answer: **{md_cell(cell.answer)}**"
                + (f"; the spec: **{md_cell(cell.spec)}**." if cell.spec else "."),
                "",
                _pre(cell.reproducer, f"repro-{slug(cell.question)}"),
                "",
            ]
    else:
        lines += [
            "",
            "No reproducer recorded: this backend is one of the kit's own native adapters, whose",
            "calls the atlas does not record; its deviations' reproducers are in the built-in catalogue.",
        ]
    return "\n".join(lines) + "\n"


def implementations_for(clause_id: str, page: str = "spec/clause.md") -> str:
    """A Markdown table: which atlas implementations follow clause ``clause_id`` and which deviate,
    each linked to its row of the atlas and, where it deviates, to its reproducer. ``page`` is the
    docs path of the page the table goes on (its links are relative to it). A clause the atlas asks
    no question about gets one line saying so."""
    from .data import QUESTION_CLAUSES

    if clause_id not in clauses():
        raise KeyError(f"implementations_for: unknown clause {clause_id!r}")
    qs = [q for q in questions() if clause_id in QUESTION_CLAUSES.get(q.id, ())]
    impls = atlas()
    if not qs or not impls:
        return (
            f"The [atlas]({rel(page, INDEX)}) asks no question about `{clause_id}`; "
            "how outside implementations treat it has not been measured.\n"
        )
    headers = ["implementation", *(q.title for q in qs)]
    rows = [["the spec", *(md_cell(q.spec or "either alignment") for q in qs)]]
    follow = deviate = 0
    for impl in impls:
        cells = []
        for q in qs:
            cell = impl.cells.get(q.id)
            if cell is None or cell.status == "n/a":
                cells.append(DASH)
                continue
            text = md_cell(cell.answer)
            if cell.differs:
                dev = cell.deviation
                how = (
                    f"[{md_cell(dev['id'])}]({rel(page, INDEX)}#{deviation_anchor(dev['id'])})"
                    if dev
                    else "undeclared"
                )
                repro = (
                    f" · [reproducer]({rel(page, impl.page)}#repro-{slug(q.id)})" if cell.reproducer else ""
                )
                cells.append(f"**deviates**: {text} ({how}{repro})")
            elif cell.status == "spec":
                cells.append(f"follows: {text}")
            else:
                cells.append(text)
        judged = [impl.cells[q.id] for q in qs if q.id in impl.cells and impl.cells[q.id].status != "n/a"]
        if not judged:
            continue
        deviate += any(c.differs for c in judged)
        follow += all(c.status == "spec" for c in judged)
        rows.append([f"[`{impl.backend}`]({rel(page, INDEX)}#{impl.anchor})", *cells])
    measured = f"Measured by the [atlas]({rel(page, INDEX)}) on {len(rows) - 1} outside implementations"
    if all(q.spec for q in qs):
        summary = (
            f"{measured}: {follow} follow the clause on every question, {deviate} deviate on at least one."
        )
    else:  # the causal flag: the spec names both alignments, so an answer is a fact, not a verdict
        summary = (
            f"{measured}. The spec names both alignments and leaves the choice to the caller, so each row "
            "says which one the implementation's own causal flag means; neither is wrong, "
            "but a caller who assumes the other gets another result."
        )
    return summary + "\n\n" + _table(headers, rows) + "\n"
