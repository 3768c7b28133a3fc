"""Plain-text rendering of reports for terminals and task logs.

Every value that a container can influence (names, command lines, paths, cgroups, warnings
quoting them) goes through `text.safe`: escaped, cut, and measured by displayed width.
"""

from __future__ import annotations

from pveclean.commands.table import table as _table
from pveclean.core.text import safe
from pveclean.core.verdicts import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


LONG = 300  # cut for free-text values (cmdline, warnings) on their own line


def command_line(value: object) -> str:
    """A report's `cmdline` for humans: its arguments joined by spaces (a report keeps the
    list; one written before it was a list is a string already)."""
    if isinstance(value, list | tuple):
        return " ".join(map(str, value))
    return "" if value is None else str(value)


def _mib(h: dict[str, Any]) -> str:
    vals = [v for v in (h.get("gpu_memory_mib") or {}).values() if v is not None]
    return str(sum(vals)) if vals else "-"


def short_node(path: str) -> str:
    """A held node as the table shows it: NVIDIA's by what follows /dev/nvidia (`0`, `ctl`,
    `uvm`, `caps/nvidia-cap1`), any other path whole (the report has every path)."""
    rest = path.removeprefix("/dev/nvidia")
    if rest == path or not rest:
        return path
    return rest.lstrip("-")


def holders_table(rep: dict[str, Any]) -> list[str]:
    rows = [("HOST PID", "CT PID", "NAME", "UNIT", "GPU MiB", "DEVICES", "OUTCOME", "SIGNALS")]
    for h in rep.get("holders", []):
        devs = ",".join(short_node(d.split(" ")[0]) for d in h.get("devices", [])) or "-"
        sigs = ",".join(s.split(" ")[0].removeprefix("SIG") for s in h.get("signals", [])
                        if s.startswith("SIG"))
        outcome = str(h.get("outcome"))
        if h.get("protected"):
            outcome += f" ({h['protected']})"
        rows.append((
            safe(h["host_pid"], 12),
            safe(h.get("ct_pid") or "-", 12),
            safe(h.get("name"), 16),
            safe(h.get("unit") or "-", 32),
            safe(_mib(h), 12),
            safe(devs, 40),
            safe(outcome, 80),
            safe(sigs or "-", 40),
        ))
    return _table(rows, "  ")


def summary_line(rep: dict[str, Any]) -> str:
    s = rep.get("summary", {})
    verdict = rep.get("verdict")
    n = s.get("holders", 0)
    stopped = s.get("stopped", 0)
    head = f"CT {safe(rep['vmid'], 20)} {safe(rep['phase'], 20)}"
    if verdict == Verdict.NOTHING_TO_DO:
        return f"{head}: no GPU holders ({rep['duration_s']:.2f} s)"
    if verdict == Verdict.BUSY:
        return f"{head}: busy: {safe('; '.join(rep.get('errors', [])), LONG)}"
    if verdict == Verdict.DRY_RUN:
        return f"{head}: dry run, {n} GPU holder(s) would be stopped, nothing signalled"
    freed = s.get("freed_mib", 0)
    text = f"{head}: stopped {stopped} of {n} GPU holder(s) ({freed} MiB freed) in " \
           f"{rep['duration_s']:.2f} s, verdict {safe(verdict, 20)}"
    if s.get("units_stopped"):
        text += f"; units stopped first: {safe(', '.join(s['units_stopped']), 120)}"
    return text


def memory_lines(rep: dict[str, Any]) -> list[str]:
    out = []
    for g in rep.get("gpus", []):
        after, before = g.get("used_after_mib"), g.get("used_before_mib")
        out.append(
            f"  GPU {g['index']} {safe(g['name'], 40)}: used "
            f"{before if before is not None else '?'} -> "
            f"{after if after is not None else '?'} MiB of {g['total_mib'] or '?'}"
            + (f" ({safe(g['status'], 20)}: {safe(g.get('reason'), LONG)})"
               if g.get("status") else ""))
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
        lines.append(f"warning: {safe(w, LONG)}")
    for e in rep.get("errors", []):
        lines.append(f"error: {safe(e, LONG)}")
    for n in rep.get("notify_errors") or []:  # the run's syslog/journal line or metrics
        lines.append(f"not said: {safe(n, LONG)}")
    return "\n".join(lines)


def reports_table(reps: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per past run: time, vmid, phase, verdict, stopped, MiB freed, duration."""
    rows = [("TIME (UTC)", "VMID", "PHASE", "VERDICT", "STOPPED", "MIB FREED", "SECONDS",
             "REPORT")]
    for name, r in reps:
        s = r.get("summary") or {}
        rows.append((
            safe(str(r.get("start", "?"))[:19].replace("T", " "), 19),
            safe(r.get("vmid", "?"), 12),
            safe(r.get("phase", "?"), 12),
            safe(r.get("verdict", "?"), 16),
            safe(f"{s.get('stopped', 0)}/{s.get('holders', 0)}", 16),
            safe(s.get("freed_mib", 0), 12),
            f"{float(r.get('duration_s', 0)):.2f}",
            safe(name, 80),
        ))
    return _table(rows)


def render_report(r: dict[str, Any]) -> str:
    """A whole report, readably: the run's summary, holders, memory, sources, problems."""
    lines = [render_run(r), ""]
    lines.append(f"started {safe(r.get('start'), 40)} on {safe(r.get('host'), 64)}, "
                 f"pveclean {safe(r.get('pveclean'), 20)}")
    srcs = r.get("sources") or {}
    if srcs:
        lines.append("sources: " + "; ".join(f"{safe(k, 20)} {safe(v, LONG)}"
                                             for k, v in srcs.items()))
    for h in r.get("holders", []):
        lines.append(f"  PID {safe(h['host_pid'], 12)} ({safe(h.get('name'), 16)}): "
                     f"{safe(command_line(h.get('cmdline')), LONG)}")
        lines.append(f"      cgroup {safe(h.get('cgroup'), 120)}, "
                     f"unit {safe(h.get('unit') or '-', 64)}, user {safe(h.get('user'), 32)}"
                     f", seen by {safe(', '.join(h.get('sources', [])), 40)}, signals: "
                     f"{safe(', '.join(h.get('signals', [])) or 'none', LONG)}")
    for o in r.get("other_gpu_users", []):
        lines.append(f"  other GPU user (not signalled): PID {safe(o['host_pid'], 12)} "
                     f"{safe(o.get('name'), 16)} in {safe(o.get('cgroup'), 120)}")
    for leak in r.get("leaks", []):
        lines.append(f"  leak: GPU {safe(leak['index'], 8)} {safe(leak['unaccounted_mib'], 12)}"
                     f" MiB: {safe(leak['hint'], LONG)}")
    return "\n".join(lines)
