"""Result tables: one target table (every row names its target and whether it was met) and
detail tables, rendered as text for the terminal, as Markdown, and as JSON."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Row:
    """One line of the target table."""

    section: str
    measure: str
    result: str
    target: str = "-"
    met: bool | None = None  # None: informational, no target

    @property
    def verdict(self) -> str:
        return {True: "met", False: "NOT met", None: "-"}[self.met]


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Results:
    machine: dict[str, object]
    targets: list[Row] = field(default_factory=list)
    details: list[Table] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    total_seconds: float | None = None

    def target_table(self) -> Table:
        return Table("Targets", ["Section", "Measure", "Result", "Target", "Met"],
                     [[r.section, r.measure, r.result, r.target, r.verdict]
                      for r in self.targets])

    def header_lines(self) -> list[str]:
        m = self.machine
        lines = [f"date: {m.get('date')}", f"machine: {m.get('uname')}",
                 f"nproc: {m.get('nproc')}, CPU: {m.get('cpu')}, memory: "
                 f"{m.get('memory_gib')} GiB, Python {m.get('python')}, load average at "
                 f"start: {m.get('load_avg_at_start')}"]
        if self.total_seconds is not None:
            lines.append(f"bench run time: {self.total_seconds:.0f} s")
        return lines


def _widths(table: Table) -> list[int]:
    cells = [table.columns, *table.rows]
    return [max(len(str(r[i])) for r in cells) for i in range(len(table.columns))]


def render_text_table(table: Table) -> str:
    w = _widths(table)
    out = [table.title, "  ".join(c.ljust(w[i]) for i, c in enumerate(table.columns)).rstrip(),
           "  ".join("-" * x for x in w)]
    out += ["  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in table.rows]
    out += [f"  note: {n}" for n in table.notes]
    return "\n".join(out)


def _md_cell(value: str) -> str:
    return str(value).replace("|", "\\|")


def render_markdown_table(table: Table, level: int = 3) -> str:
    out = [f"{'#' * level} {table.title}", "",
           "| " + " | ".join(_md_cell(c) for c in table.columns) + " |",
           "|" + "|".join("---" for _ in table.columns) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in table.rows]
    if table.notes:
        out.append("")
        out += [f"- {n}" for n in table.notes]
    return "\n".join(out)


def render_text(res: Results) -> str:
    parts = ["pveclean bench", *res.header_lines(), "", render_text_table(res.target_table())]
    parts += ["\n" + render_text_table(t) for t in res.details]
    if res.notes:
        parts += ["", *[f"note: {n}" for n in res.notes]]
    return "\n".join(parts)


def render_markdown(res: Results) -> str:
    parts = ["## pveclean bench", "", *[f"- {ln}" for ln in res.header_lines()], "",
             render_markdown_table(res.target_table())]
    parts += ["\n" + render_markdown_table(t) for t in res.details]
    if res.notes:
        parts += ["", "### Notes", "", *[f"- {n}" for n in res.notes]]
    return "\n".join(parts) + "\n"


def to_json(res: Results) -> dict[str, Any]:
    return {
        "machine": res.machine,
        "total_seconds": res.total_seconds,
        "targets": [{**asdict(r), "verdict": r.verdict} for r in res.targets],
        "details": [asdict(t) for t in res.details],
        "notes": res.notes,
        "raw": res.raw,
    }


def write_results(res: Results, out_dir: Path) -> tuple[Path, Path]:
    """Write bench-<UTC time>.md and .json (and latest.md/latest.json copies)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    md, js = out_dir / f"bench-{stamp}.md", out_dir / f"bench-{stamp}.json"
    md_text = render_markdown(res)
    js_text = json.dumps(to_json(res), indent=2, default=str) + "\n"
    md.write_text(md_text)
    js.write_text(js_text)
    (out_dir / "latest.md").write_text(md_text)
    (out_dir / "latest.json").write_text(js_text)
    return md, js


def ms(seconds: float) -> str:
    """Milliseconds, with a decimal under 10 ms."""
    v = seconds * 1000
    return f"{v:.1f} ms" if abs(v) < 10 else f"{v:.0f} ms"
