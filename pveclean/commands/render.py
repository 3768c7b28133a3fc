"""Plain-text rendering of reports for terminals and task logs.

Every value that a container can influence (names, command lines, paths, cgroups, warnings
quoting them) goes through `text.safe`: escaped, cut, and measured by displayed width.
"""

from __future__ import annotations

from pveclean.commands.table import table
from pveclean.core.records import more_column
from pveclean.core.text import safe
from pveclean.core.verdicts import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.records import Holder
    from pveclean.core.report import Report
    from pveclean.core.reportread import ReportRow


LONG = 300  # cut for free-text values (cmdline, warnings) on their own line


def command_line(value: object) -> str:
    """A report's `cmdline` for humans: its arguments joined by spaces (a report keeps the
    list; one written before it was a list is a string already)."""
    if isinstance(value, list | tuple):
        return " ".join(map(str, value))
    return "" if value is None else str(value)


def _mib(h: Holder) -> str:
    vals = [v for v in h.gpu_memory_mib.values() if v is not None]
    return str(sum(vals)) if vals else "-"


def holders_table(rep: Report) -> list[str]:
    rows = [("HOST PID", "CT PID", "NAME", "UNIT", "GPU MiB", "DEVICES", "OUTCOME", "SIGNALS")]
    for h in rep.holders:
        devs = ",".join([*(d.short for d in h.devices), *more_column(h.devices_more)]) or "-"
        sigs = ",".join(s.signal.name for s in h.signals if s.signal is not None)
        outcome = str(h.outcome)
        if h.protected:
            outcome += f" ({h.protected})"
        rows.append((
            safe(h.host_pid, 12),
            safe(h.ct_pid or "-", 12),
            safe(h.name, 16),
            safe(h.unit or "-", 32),
            safe(_mib(h), 12),
            safe(devs, 40),
            safe(outcome, 80),
            safe(sigs or "-", 40),
        ))
    return table(rows, "  ")


def summary_line(rep: Report) -> str:
    s = rep.summary
    verdict = rep.verdict
    n = s.holders
    head = f"CT {safe(rep.vmid, 20)} {safe(rep.phase, 20)}"
    if verdict == Verdict.NOTHING_TO_DO:
        return f"{head}: no GPU holders ({rep.duration_s:.2f} s)"
    if verdict == Verdict.BUSY:
        return f"{head}: busy: {safe('; '.join(rep.errors), LONG)}"
    if verdict == Verdict.DRY_RUN:
        return f"{head}: dry run, {n} GPU holder(s) would be stopped, nothing signalled"
    text = f"{head}: stopped {s.stopped} of {n} GPU holder(s) ({s.freed_mib} MiB freed) in " \
           f"{rep.duration_s:.2f} s, verdict {safe(verdict, 20)}"
    if s.units_stopped:
        text += f"; units stopped first: {safe(', '.join(s.units_stopped), 120)}"
    return text


def memory_lines(rep: Report) -> list[str]:
    out = []
    for g in rep.gpus:
        after, before = g.used_after_mib, g.used_before_mib
        out.append(
            f"  GPU {g.index} {safe(g.name, 40)}: used "
            f"{before if before is not None else '?'} -> "
            f"{after if after is not None else '?'} MiB of {g.total_mib or '?'}"
            + (f" ({safe(g.status, 20)}: {safe(g.reason, LONG)})" if g.status else ""))
    return out


def unit_lines(rep: Report) -> list[str]:
    """What --stop-units did per unit, and the commands that stop units still at work."""
    out = []
    stops = rep.unit_stops
    for u in stops.units if stops else []:
        left = u.processes_left
        out.append(f"  unit {safe(u.unit, 64)}: {u.action}"
                   + (f" ({safe(u.detail, 200)})" if u.detail else "")
                   + (f", {left} process(es) left" if left else ""))
    if stops and stops.note:
        out.append(f"units: {safe(stops.note, 300)}")
    out += [f"hint: {safe(h, 300)}" for h in rep.hints]
    return out


def render_run(rep: Report) -> str:
    lines = [summary_line(rep)]
    if rep.holders:
        lines += holders_table(rep)
    lines += memory_lines(rep)
    lines += unit_lines(rep)
    for w in rep.warnings:
        lines.append(f"warning: {safe(w, LONG)}")
    for e in rep.errors:
        lines.append(f"error: {safe(e, LONG)}")
    for n in rep.notify_errors or []:  # the run's syslog/journal line or metrics
        lines.append(f"not said: {safe(n, LONG)}")
    return "\n".join(lines)


def reports_table(reps: list[ReportRow]) -> list[str]:
    """One line per past run: time, vmid, phase, verdict, stopped, MiB freed, duration."""
    rows = [("TIME (UTC)", "VMID", "PHASE", "VERDICT", "STOPPED", "MIB FREED", "SECONDS",
             "REPORT")]
    for r in reps:
        rows.append((
            safe(str(_known(r.start))[:19].replace("T", " "), 19),
            safe(_known(r.vmid), 12),
            safe(_known(r.phase), 12),
            safe(_known(r.verdict), 16),
            safe(f"{r.stopped}/{r.holders}", 16),
            safe(r.freed_mib, 12),
            f"{r.duration_s:.2f}",
            safe(r.name, 80),
        ))
    return table(rows)


def _known(value: object) -> object:
    return "?" if value is None else value


def render_report(r: Report) -> str:
    """A whole report, readably: the run's summary, holders, memory, sources, problems."""
    lines = [render_run(r), ""]
    lines.append(f"started {safe(r.start, 40)} on {safe(r.host, 64)}, "
                 f"pveclean {safe(r.version, 20)}")
    if r.sources:
        lines.append("sources: " + "; ".join(f"{safe(k, 20)} {safe(str(v), LONG)}"
                                             for k, v in r.sources.items()))
    for h in r.holders:
        lines.append(f"  PID {safe(h.host_pid, 12)} ({safe(h.name, 16)}): "
                     f"{safe(command_line(h.argv), LONG)}")
        signals = ", ".join(str(s) for s in h.signals)
        lines.append(f"      cgroup {safe(h.cgroup, 120)}, "
                     f"unit {safe(h.unit or '-', 64)}, user {safe(h.user, 32)}"
                     f", seen by {safe(', '.join(h.sources), 40)}, signals: "
                     f"{safe(signals or 'none', LONG)}")
    for o in r.other_gpu_users:
        lines.append(f"  other GPU user (not signalled): PID {safe(o.host_pid, 12)} "
                     f"{safe(o.name, 16)} in {safe(o.cgroup, 120)}")
    for leak in r.leaks or []:
        lines.append(f"  leak: GPU {safe(leak.index, 8)} {safe(leak.unaccounted_mib, 12)}"
                     f" MiB: {safe(leak.hint, LONG)}")
    return "\n".join(lines)
