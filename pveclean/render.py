"""Plain-text rendering of reports for terminals and task logs."""

from __future__ import annotations

from typing import Any

from .text import safe


def _mib(h: dict[str, Any]) -> str:
    vals = [v for v in (h.get("gpu_memory_mib") or {}).values() if v is not None]
    return str(sum(vals)) if vals else "-"


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def holders_table(rep: dict[str, Any]) -> list[str]:
    rows = [("HOST PID", "CT PID", "NAME", "UNIT", "GPU MiB", "DEVICES", "OUTCOME", "SIGNALS")]
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
            safe(h.get("unit") or "-", 32),
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
    if s.get("units_stopped"):
        text += f"; units stopped first: {safe(', '.join(s['units_stopped']), 120)}"
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


def unit_lines(rep: dict[str, Any]) -> list[str]:
    """What --stop-units did per unit, and the commands that stop units still at work."""
    out = []
    stops = rep.get("unit_stops") or {}
    for u in stops.get("units", []):
        left = u.get("processes_left")
        out.append(f"  unit {safe(u.get('unit'), 64)}: {u.get('action')}"
                   + (f" ({safe(u.get('detail'), 200)})" if u.get("detail") else "")
                   + (f", {left} process(es) left" if left else ""))
    if stops.get("note"):
        out.append(f"units: {safe(stops['note'], 300)}")
    out += [f"hint: {safe(h, 300)}" for h in rep.get("hints", [])]
    return out


def render_run(rep: dict[str, Any]) -> str:
    lines = [summary_line(rep)]
    if rep.get("holders"):
        lines += holders_table(rep)
    lines += memory_lines(rep)
    lines += unit_lines(rep)
    for w in rep.get("warnings", []):
        lines.append(f"warning: {w}")
    for e in rep.get("errors", []):
        lines.append(f"error: {e}")
    return "\n".join(lines)


def reports_table(reps: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per past run: time, vmid, phase, verdict, stopped, MiB freed, duration."""
    rows = [("TIME (UTC)", "VMID", "PHASE", "VERDICT", "STOPPED", "MIB FREED", "SECONDS",
             "REPORT")]
    for name, r in reps:
        s = r.get("summary") or {}
        rows.append((
            str(r.get("start", "?"))[:19].replace("T", " "),
            str(r.get("vmid", "?")),
            str(r.get("phase", "?")),
            str(r.get("verdict", "?")),
            f"{s.get('stopped', 0)}/{s.get('holders', 0)}",
            str(s.get("freed_mib", 0)),
            f"{float(r.get('duration_s', 0)):.2f}",
            name,
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def render_report(r: dict[str, Any]) -> str:
    """A whole report, readably: the run's summary, holders, memory, sources, problems."""
    lines = [render_run(r), ""]
    lines.append(f"started {r.get('start')} on {r.get('host')}, pveclean {r.get('pveclean')}")
    srcs = r.get("sources") or {}
    if srcs:
        lines.append("sources: " + "; ".join(f"{k} {v}" for k, v in srcs.items()))
    for h in r.get("holders", []):
        lines.append(f"  PID {h['host_pid']} ({h.get('name')}): {h.get('cmdline')}")
        lines.append(f"      cgroup {h.get('cgroup')}, unit {safe(h.get('unit') or '-', 64)}, "
                     f"user {h.get('user')}, seen by "
                     f"{', '.join(h.get('sources', []))}, signals: "
                     f"{', '.join(h.get('signals', [])) or 'none'}")
    for o in r.get("other_gpu_users", []):
        lines.append(f"  other GPU user (not signalled): PID {o['host_pid']} {o.get('name')} "
                     f"in {o.get('cgroup')}")
    for leak in r.get("leaks", []):
        lines.append(f"  leak: GPU {leak['index']} {leak['unaccounted_mib']} MiB: "
                     f"{leak['hint']}")
    return "\n".join(lines)
