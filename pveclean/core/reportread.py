"""The one reader of the report format: a loaded report file (its YAML's plain values) back to
a typed Report, or to the typed row `pveclean reports` lists. Lenient on input, as reports of
older versions differ (a command line as one string, keys missing); what it cannot read it
names in an UnreadableReport."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pveclean.core.amendments import Leak, NotListed, PreStopBrief, UnitStop, UnitStops
from pveclean.core.lazyre import lazy
from pveclean.core.records import (
    MORE,
    DeviceHow,
    DeviceUse,
    Holder,
    OtherUser,
    Sent,
    Sig,
    Source,
    SourceState,
)
from pveclean.core.release import GpuRelease, Release
from pveclean.core.report import ContainerState, Report, Summary
from pveclean.core.reportparts import GpuRow, Settings
from pveclean.core.verdicts import Outcome, Verdict


class UnreadableReport(ValueError):
    """A file that is no report of a container's run: `str()` says what is missing."""


Doc = Mapping[str, object]


def _doc(v: object) -> Doc:
    return v if isinstance(v, Mapping) else {}


def _list(v: object) -> list[object]:
    return list(v) if isinstance(v, list | tuple) else []


def _int(v: object, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _opt_int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: object, default: float = 0.0) -> float:
    ok = isinstance(v, int | float) and not isinstance(v, bool)
    return float(v) if ok and math.isfinite(float(v)) else default  # type: ignore[arg-type]


def _text(v: object) -> str | None:
    return None if v is None else str(v)


def _texts(v: object) -> list[str]:
    return [str(x) for x in _list(v)]


def _mib(v: object) -> dict[int, int | None]:
    return {int(k): _opt_int(m) for k, m in _doc(v).items() if str(k).lstrip("-").isdigit()}


_SENT = lazy(r"(SIGTERM|SIGKILL) \+(\d+(?:\.\d+)?)s(?: failed: (.*))?", re.S)


_STATES = {"ok": SourceState.OK, "pending": SourceState.PENDING,
           "disabled": SourceState.DISABLED, "disabled in config": SourceState.DISABLED,
           "did not finish": SourceState.DID_NOT_FINISH}
_LEADS = (("failed", SourceState.FAILED), ("unavailable", SourceState.UNAVAILABLE),
          ("late", SourceState.LATE), ("not ", SourceState.NOT_RUN),
          ("container not running", SourceState.NOT_RUN), ("frozen ", SourceState.OK))


def source_of(line: str) -> Source:
    """A source's line as a report shows it (str(Source)), read back: its state, and the
    line itself where it says more than the state. A line it does not know is PARTIAL,
    shown as it is."""
    state = _STATES.get(line)
    if state is None:
        state = next((s for lead, s in _LEADS if line.startswith(lead)), SourceState.PARTIAL)
    return Source(state, None if line == str(state) else line)


def sent_of(line: object) -> Sent:
    """One entry of a holder's signal record, as Sent.__str__ wrote it."""
    text = str(line)
    m = _SENT.fullmatch(text)
    if m is None:
        return Sent(note=text)
    return Sent(Sig(m.group(1)), float(m.group(2)), m.group(3))


def _outcome(v: object) -> Outcome | None:
    return Outcome(v) if isinstance(v, str) and v in set(Outcome) else None


_DEVICE = lazy(r"(.*) \((mmap |io_uring fixed file, )?(\d+):(\d+)\)", re.DOTALL)
_DEVICES_MORE = lazy(MORE + r"\+(\d+) more")
_HOW = {None: DeviceHow.FD, "mmap ": DeviceHow.MMAP, "io_uring fixed file, ": DeviceHow.URING}


def device_of(label: str) -> DeviceUse:
    """A holder's device label read back ("/dev/nvidia0 (195:0)", "... (mmap 195:0)", ...);
    str() of the record gives the label again, whatever it is."""
    m = _DEVICE.fullmatch(label)
    if m is None:
        return DeviceUse.named(label)
    return DeviceUse(m.group(1), int(m.group(3)), int(m.group(4)), _HOW[m.group(2)])


def devices_of(v: object) -> tuple[list[DeviceUse], int]:
    """A holder's `devices`, and the count its last "…+N more" label gives (0: none)."""
    labels = _texts(v)
    more = _DEVICES_MORE.fullmatch(labels[-1]) if labels else None
    if more is not None:
        labels = labels[:-1]
    return [device_of(x) for x in labels], int(more.group(1)) if more else 0


def holder_of(d: Doc) -> Holder:
    cmdline = d.get("cmdline")
    argv = (tuple(str(a) for a in cmdline) if isinstance(cmdline, list | tuple)
            else (str(cmdline),) if cmdline else ())
    devices, devices_more = devices_of(d.get("devices"))
    return Holder(
        host_pid=_int(d.get("host_pid")), starttime=0, ct_pid=_opt_int(d.get("ct_pid")),
        name=str(d.get("name", "")), exe=_text(d.get("exe")), argv=argv, uid=-1,
        user=str(d.get("user", "")), state=str(d.get("state", "")), ppid=_int(d.get("ppid")),
        cgroup=str(d.get("cgroup", "")), devices=devices, devices_more=devices_more,
        gpu_memory_mib=_mib(d.get("gpu_memory_mib")), sources=_texts(d.get("sources")),
        protected=_text(d.get("protected")), outcome=_outcome(d.get("outcome")),
        signals=[sent_of(s) for s in _list(d.get("signals"))], wchan=_text(d.get("wchan")),
        respawned_by=_text(d.get("respawned_by")), round=_int(d.get("round")),
        unit=_text(d.get("unit")))


def _gpu(d: Doc) -> GpuRow:
    from pveclean.core.records import GpuStatus

    status = d.get("status")
    return GpuRow(
        _int(d.get("index")), _opt_int(d.get("minor")), str(d.get("uuid", "")),
        str(d.get("name", "")), _opt_int(d.get("total_mib")), _opt_int(d.get("reserved_mib")),
        _opt_int(d.get("used_before_mib")), _opt_int(d.get("used_after_mib")),
        _opt_int(d.get("freed_mib")),
        GpuStatus(status) if isinstance(status, str) and status in set(GpuStatus) else None,
        _text(d.get("reason")))


def _unit_stops(v: object) -> UnitStops | None:
    if not isinstance(v, Mapping):
        return None
    units = [UnitStop(str(u.get("unit", "")), [_int(p) for p in _list(u.get("holders"))],
                      _text(u.get("action")), _text(u.get("detail")),
                      _opt_int(u.get("processes_left")), "processes_left" in u)
             for u in _list(v.get("units")) if isinstance(u, Mapping)]
    return UnitStops(units, _text(v.get("command")), _text(v.get("note")), "exit" in v,
                     _opt_int(v.get("exit")))


def _not_listed(v: object) -> NotListed | None:
    if not isinstance(v, Mapping):
        return None
    return NotListed(_int(v.get("count")), {str(k): _int(n) for k, n in
                                            _doc(v.get("outcomes")).items()},
                     str(v.get("host_pids", "")),
                     {str(k): _int(n) for k, n in _doc(v.get("names")).items()},
                     {k: m or 0 for k, m in _mib(v.get("gpu_memory_mib")).items()},
                     str(v.get("why", "")))


def _started(start: str) -> float:
    try:
        return datetime.fromisoformat(start).timestamp()
    except ValueError:
        return 0.0


def _summary(s: Doc) -> Summary:
    stopped = s.get("units_stopped")
    return Summary(
        holders=_int(s.get("holders")), stopped=_int(s.get("stopped")),
        outcomes={str(k): _int(n) for k, n in _doc(s.get("outcomes")).items()},
        freed_mib=_int(s.get("freed_mib")), rounds=_int(s.get("rounds")),
        verified_after_last_exit_s=None if s.get("verified_after_last_exit_s") is None
        else _num(s.get("verified_after_last_exit_s")),
        readers_killed=_int(s.get("readers_killed")),
        units_stopped=None if stopped is None else _texts(stopped))


def _required(d: Doc) -> tuple[int, str, Verdict, str]:
    vmid, phase, verdict, start = (d.get(k) for k in ("vmid", "phase", "verdict", "start"))
    missing = [k for k, v in (("vmid", vmid), ("phase", phase), ("verdict", verdict),
                              ("start", start)) if v is None]
    if missing or d.get("kind") not in (None, "ct"):
        raise UnreadableReport("not the report of a container's run (no "
                               f"{', '.join(missing) or 'container'})")
    if not isinstance(vmid, int) or str(verdict) not in set(Verdict):
        raise UnreadableReport(f"unreadable vmid {vmid!r} or verdict {verdict!r}")
    return vmid, str(phase), Verdict(str(verdict)), str(start)


def from_dict(d: Doc) -> Report:
    """A loaded report as a typed Report (UnreadableReport when it is none)."""
    vmid, phase, verdict, start = _required(d)
    c = _doc(d.get("container"))
    settings = _doc(d.get("settings"))
    leaks = d.get("leaks")
    pre = d.get("pre_stop_report")
    running = c.get("running")
    return Report(
        str(d.get("pveclean", "")), vmid, phase, str(d.get("host", "")), start,
        _num(d.get("duration_s")), bool(d.get("dry_run")), verdict,
        _summary(_doc(d.get("summary"))),
        ContainerState(running if isinstance(running, bool) else None,
                       _texts(c.get("gpu_config")), _opt_int(c.get("init_pid")),
                       _int(c.get("processes_in_cgroup_tree"))),
        _started(start),
        holders=[holder_of(h) for h in _list(d.get("holders")) if isinstance(h, Mapping)],
        gpus=[_gpu(g) for g in _list(d.get("gpus")) if isinstance(g, Mapping)],
        other_gpu_users=[OtherUser(_int(o.get("host_pid")), _text(o.get("name")),
                                   _text(o.get("cgroup")), _mib(o.get("gpu_memory_mib")))
                         for o in _list(d.get("other_gpu_users")) if isinstance(o, Mapping)],
        sources={str(k): source_of(str(v)) for k, v in _doc(d.get("sources")).items()},
        settings=Settings(_num(settings.get("grace_seconds")),
                          _num(settings.get("deadline_seconds")),
                          _text(settings.get("config"))) if settings else None,
        warnings=_texts(d.get("warnings")), errors=_texts(d.get("errors")),
        via=_text(d.get("via")), unit_stops=_unit_stops(d.get("unit_stops")),
        hints=_texts(d.get("hints")),
        leaks=None if leaks is None else [
            Leak(_int(x.get("index")), str(x.get("uuid", "")), _int(x.get("unaccounted_mib")),
                 str(x.get("hint", ""))) for x in _list(leaks) if isinstance(x, Mapping)],
        pre_stop_report=None if not isinstance(pre, Mapping) else PreStopBrief(
            _text(pre.get("start")), _text(pre.get("verdict")), _opt_int(pre.get("freed_mib"))),
        removed_cgroups=None if d.get("removed_cgroups") is None
        else _texts(d.get("removed_cgroups")),
        holders_not_listed=_not_listed(d.get("holders_not_listed")),
        capped=True, notify_errors=_texts(d.get("notify_errors")) or None,
        release=_release(d.get("release")))


def _release(v: object) -> list[GpuRelease] | None:
    """A report's `release` section (issue 38); a state this version does not know is
    `not-judged`."""
    if v is None:
        return None
    states = {str(r): r for r in Release}
    return [GpuRelease(_int(x.get("gpu")), str(x.get("uuid", "")),
                       states.get(str(x.get("state")), Release.NOT_JUDGED),
                       _int(x.get("set_out_to_free_mib")), _opt_int(x.get("left_mib")),
                       None if x.get("after_s") is None else _num(x.get("after_s")),
                       _text(x.get("reason")))
            for x in _list(v) if isinstance(x, Mapping)]


@dataclass(frozen=True)
class ReportRow:
    """One past run as `pveclean reports` and `status` show it: any report file, a VM's
    too; a value the file does not have is None (shown as `?`, a count as 0)."""

    name: str
    start: object
    vmid: object
    phase: object
    verdict: object
    stopped: object
    holders: object
    freed_mib: object
    duration_s: float


def row_of(name: str, d: Doc) -> ReportRow:
    """A container's run, a VM's hook phase (its `time`) or a GPU reset (its `outcome`, no
    VMID: shown as -)."""
    s = _doc(d.get("summary"))
    start = d.get("start", d.get("time"))
    if d.get("kind") == "reset":
        return ReportRow(name, start, "-", "reset", d.get("outcome"), 0, 0, 0,
                         float(_num(d.get("duration_s"))))
    return ReportRow(name, start, d.get("vmid"), d.get("phase"), d.get("verdict"),
                     s.get("stopped", 0), s.get("holders", 0), s.get("freed_mib", 0),
                     float(_num(d.get("duration_s"))))


def gpus_used(rep: Report) -> set[int]:
    """The GPU indexes a (pre-stop) report's holders had memory on (listed or not)."""
    more = rep.holders_not_listed.gpu_memory_mib if rep.holders_not_listed else {}
    return {g for h in rep.holders for g in h.gpu_memory_mib} | set(more)
