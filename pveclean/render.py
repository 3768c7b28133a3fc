"""Plain-text rendering of reports for terminals and task logs."""

from __future__ import annotations

from typing import Any


def _mib(h: dict[str, Any]) -> str:
    vals = [v for v in (h.get("gpu_memory_mib") or {}).values() if v is not None]
    return str(sum(vals)) if vals else "-"


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def holders_table(rep: dict[str, Any]) -> list[str]:
    rows = [("HOST PID", "CT PID", "NAME", "GPU MiB", "DEVICES", "OUTCOME", "SIGNALS")]
    for h in rep.get("holders", []):
        devs = ",".join(d.split(" ")[0] for d in h.get("devices", [])) or "-"
        sigs = ",".join(s.split(" ")[0] for s in h.get("signals", []) if s.startswith("SIG"))
        outcome = str(h.get("outcome"))
        if h.get("protected"):
            outcome += f" ({h['protected']})"
        rows.append((
            str(h["host_pid"]),
            str(h.get("ct_pid") or "-"),
            _short(str(h.get("name")), 16),
            _mib(h),
            _short(devs, 40),
            outcome,
            sigs or "-",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def summary_line(rep: dict[str, Any]) -> str:
    s = rep.get("summary", {})
    verdict = rep.get("verdict")
    n = s.get("holders", 0)
    stopped = s.get("stopped", 0)
    head = f"CT {rep['vmid']} {rep['phase']}"
    if verdict == "nothing-to-do":
        return f"{head}: no GPU holders ({rep['duration_s']:.2f} s)"
    if verdict == "busy":
        return f"{head}: busy: {'; '.join(rep.get('errors', []))}"
    if verdict == "dry-run":
        return f"{head}: dry run, {n} GPU holder(s) would be stopped, nothing signalled"
    freed = s.get("freed_mib", 0)
    text = f"{head}: stopped {stopped} of {n} GPU holder(s) ({freed} MiB freed) in " \
           f"{rep['duration_s']:.2f} s, verdict {verdict}"
    return text


def memory_lines(rep: dict[str, Any]) -> list[str]:
    out = []
    for g in rep.get("gpus", []):
        after = g.get("used_after_mib")
        out.append(
            f"  GPU {g['index']} {g['name']}: used {g['used_before_mib']} -> "
            f"{after if after is not None else '?'} MiB of {g['total_mib']}"
        )
    return out


def render_run(rep: dict[str, Any]) -> str:
    lines = [summary_line(rep)]
    if rep.get("holders"):
        lines += holders_table(rep)
    lines += memory_lines(rep)
    for w in rep.get("warnings", []):
        lines.append(f"warning: {w}")
    for e in rep.get("errors", []):
        lines.append(f"error: {e}")
    return "\n".join(lines)
