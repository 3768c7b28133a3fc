"""The report of one run as a typed record: built from what the run saw and did, amended by
the phases (post-stop's leak check, pre-start's removed cgroups, the units), redacted, and
turned into the report's dict only at the edge (files, terminal, JSON, syslog, metrics)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum

from pveclean.core import bounds
from pveclean.core.records import Discovery, GpuMemory, Holder, NvmlProcesses
from pveclean.core.verdicts import REMAINING, STOPPED, Verdict, with_leaks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from pveclean.core.config import Config
    from pveclean.proxmox.pveconf import CtConfig


LEAK_SLACK_MIB = 64  # allocations NVML shows without a process: allocator slack, contexts


def find_leaks(gpus: list[GpuMemory], procs: NvmlProcesses,
               minors: set[int], used_by_ct: set[int]) -> list[dict[str, Any]]:
    """Memory allocated on the container's GPUs that no live process accounts for. A PID's
    figure on a GPU is already the sum of its rows there (one per MIG instance, see
    host/nvml.py), so no MIG user shows as a leak. A GPU NVML could not read, or whose
    process list it could not give (`procs.faults`), is not judged: no figure, no leak."""
    leaks = []
    unread = procs.faults
    for g in gpus:
        if g.reserved_mib is None or not g.ok or g.index in unread:
            continue  # NVML v1 mixes reserved into used, or NVML did not answer: unknowable
        if minors and g.minor is not None:
            if g.minor not in minors:
                continue  # not one of this container's GPUs
        elif used_by_ct and g.index not in used_by_ct:
            continue
        accounted = sum(m or 0 for per in procs.by_pid.values() for i, m in per.items()
                        if i == g.index)
        unaccounted = g.used_mib - accounted
        if unaccounted > LEAK_SLACK_MIB:
            leaks.append({"index": g.index, "uuid": g.uuid, "unaccounted_mib": unaccounted,
                          "hint": f"no process holds this memory; once nothing uses GPU "
                                  f"{g.index}, reset it: nvidia-smi -r -i {g.index}"})
    return leaks


MAX_VALUE = 64 << 10  # characters of one string value in a report


class Redactor:
    """Applies the configured patterns: a match's first group is kept, the rest becomes ***.
    Each value is cut to MAX_VALUE first, so the time stays bounded for any pattern. Verdicts
    and outcomes are pveclean's own words and stay as they are."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = [re.compile(p) for p in patterns]

    def text(self, s: str) -> str:
        if len(s) > MAX_VALUE:
            s = s[: MAX_VALUE - 1] + "…"
        for p in self.patterns:
            s = p.sub(self._replace, s)
        return s

    @staticmethod
    def _replace(m: re.Match[str]) -> str:
        head = (m.group(1) or "") if m.re.groups else ""
        tail = (m.group("tail") or "") if "tail" in m.re.groupindex else ""
        return f"{head}***{tail}"

    def argv(self, args: tuple[str, ...]) -> tuple[str, ...]:
        """A command line: the patterns run over its arguments joined by spaces, as it was
        typed (`--token s3cret` is two arguments), and each argument keeps its bounds: what
        a match hides becomes *** in each argument it covers. MAX_VALUE characters in all."""
        kept: list[str] = []
        total = 0
        for a in args:
            if total + len(a) >= MAX_VALUE:
                kept.append(a[: max(MAX_VALUE - 1 - total, 0)] + "…")
                break
            kept.append(a)
            total += len(a) + 1
        line = " ".join(kept)
        hidden = bytearray(len(line))
        for p in self.patterns:
            for m in p.finditer(line):
                hidden[m.start() : m.end()] = b"\1" * (m.end() - m.start())
                for g in (1 if p.groups else None, p.groupindex.get("tail")):
                    if g is not None and m.start(g) >= 0:
                        hidden[m.start(g) : m.end(g)] = bytes(m.end(g) - m.start(g))
        out, at = [], 0
        for a in kept:
            parts = [ch if not hidden[at + i] else "" if i and hidden[at + i - 1] else "***"
                     for i, ch in enumerate(a)]
            out.append("".join(parts))
            at += len(a) + 1
        return tuple(out)

    def value(self, v: Any) -> Any:
        if isinstance(v, Enum):
            return v
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, tuple) and all(isinstance(x, str) for x in v):
            return self.argv(v)  # a command line (Holder.argv)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.replace(v, **{f.name: self.value(getattr(v, f.name))
                                             for f in dataclasses.fields(v) if f.init})
        return v


def iso(t: float) -> str:
    """2026-12-03T06:53:12.253+00:00: a report's start."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Summary:
    holders: int
    stopped: int
    outcomes: dict[str, int]
    freed_mib: int
    rounds: int
    verified_after_last_exit_s: float | None = None  # in every report but a busy one
    readers_killed: int = 0  # shown when any
    units_stopped: list[str] | None = None  # shown after --stop-units


@dataclass(frozen=True)
class ContainerState:
    running: bool | None
    gpu_config: list[str]
    init_pid: int | None = None  # these two: in every report but a busy one
    processes_in_cgroup_tree: int = 0


@dataclass(frozen=True)
class Report:
    """One run's report. A busy report (the lock was held) says less: no sources, settings,
    other GPU users, container details or verification time."""

    version: str
    vmid: int
    phase: str
    host: str
    start: str
    duration_s: float
    dry_run: bool
    verdict: Verdict
    summary: Summary
    container: ContainerState
    started: float  # time.time() at the start: the report file's name
    holders: list[Holder] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    other_gpu_users: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    via: str | None = None  # what ran it, when not the hookscript
    unit_stops: dict[str, Any] | None = None
    hints: list[str] = field(default_factory=list)
    leaks: list[dict[str, Any]] | None = None  # a post-stop's
    pre_stop_report: dict[str, Any] | None = None
    removed_cgroups: list[str] | None = None  # a pre-start's
    holders_not_listed: dict[str, Any] | None = None  # past the caps (core/bounds.py)
    capped: bool = False  # bounded() was applied: `holders` lists only those within the caps

    @property
    def busy(self) -> bool:
        return self.verdict == Verdict.BUSY

    def remaining(self) -> list[Holder]:
        """The listed holders the run left behind (survived or protected): a bounded report
        lists them first (core/bounds.py); remaining_count() counts them all."""
        return [h for h in self.holders if h.outcome in REMAINING]

    def remaining_count(self) -> int:
        return sum(self.summary.outcomes.get(str(o), 0) for o in REMAINING)

    def bounded(self) -> Report:
        """The report within the caps of core/bounds.py: at most bounds.HOLDERS holders
        listed (the others summarized), each with its device paths and strings cut, and the
        other lists cut to their share; its YAML stays under bounds.MAX_REPORT_BYTES, so
        redacting and dumping it take a bounded time. Counts and outcomes stay whole."""
        cut = {k: bounds.clip(getattr(self, k), b) for k, b in bounds.SECTION_BYTES.items()
               if getattr(self, k) is not None}
        if self.capped:  # bounded before (a post-stop's, amended): its holders are
            return dataclasses.replace(self, **cut)
        listed, rest = bounds.select(self.holders)
        return dataclasses.replace(self, holders=listed, holders_not_listed=bounds.not_listed(
            rest), capped=True, **cut)

    def ran_by(self, via: str | None) -> Report:
        """The report, saying after its phase what ran it when that is not the hookscript."""
        return self if via is None else dataclasses.replace(self, via=via)

    def with_removed_cgroups(self, removed: list[str]) -> Report:
        """A pre-start's: the empty cgroups of an earlier run it removed (shown when any)."""
        return dataclasses.replace(self, removed_cgroups=list(removed))

    def deferred(self, why: str) -> Report:
        """A pre-stop of a clean shutdown: the holders recorded, none signalled, `why` said."""
        return dataclasses.replace(self, verdict=Verdict.DEFERRED).with_warning(why)

    def with_warning(self, text: str) -> Report:
        return dataclasses.replace(self, warnings=[*self.warnings, text])

    def with_error(self, text: str) -> Report:
        return dataclasses.replace(self, errors=[*self.errors, text])

    def with_units(self, unit_stops: dict[str, Any] | None, hints: list[str]) -> Report:
        """What --stop-units did (None: not asked) and the hints naming units still at work."""
        summary = self.summary
        if unit_stops is not None:
            summary = dataclasses.replace(summary,
                                          units_stopped=sorted(stopped_units(unit_stops)))
        return dataclasses.replace(self, summary=summary, unit_stops=unit_stops,
                                   hints=list(hints))

    def with_leaks(self, leaks: list[dict[str, Any]], pre: dict[str, Any] | None) -> Report:
        """A post-stop's leak check, and what the last pre-stop report (if any) said."""
        brief = None if pre is None else {
            "start": pre.get("start"), "verdict": pre.get("verdict"),
            "freed_mib": (pre.get("summary") or {}).get("freed_mib")}
        return dataclasses.replace(self, leaks=leaks, pre_stop_report=brief,
                                   verdict=with_leaks(self.verdict, leaks))

    def as_dict(self) -> dict[str, Any]:
        """The report as it is written and shown: plain values, keys in their fixed order."""
        s = self.summary
        summary: dict[str, Any] = {"holders": s.holders, "stopped": s.stopped,
                                   "outcomes": dict(s.outcomes), "freed_mib": s.freed_mib,
                                   "rounds": s.rounds}
        c = self.container
        container: dict[str, Any] = {"running": c.running}
        if not self.busy:
            summary["verified_after_last_exit_s"] = s.verified_after_last_exit_s
            container.update(init_pid=c.init_pid,
                             processes_in_cgroup_tree=c.processes_in_cgroup_tree)
        if s.readers_killed:
            summary["readers_killed"] = s.readers_killed
        if s.units_stopped is not None:
            summary["units_stopped"] = s.units_stopped
        container["gpu_config"] = c.gpu_config
        d: dict[str, Any] = {"pveclean": self.version, "vmid": self.vmid, "phase": self.phase}
        if self.via is not None:
            d["via"] = self.via
        d.update({"host": self.host, "start": self.start, "duration_s": self.duration_s,
                  "dry_run": self.dry_run, "verdict": str(self.verdict), "summary": summary,
                  "container": container, "holders": [h.as_dict() for h in self.holders]})
        if self.holders_not_listed is not None:
            d["holders_not_listed"] = self.holders_not_listed
        d["gpus"] = self.gpus
        if not self.busy:
            d.update(other_gpu_users=self.other_gpu_users, sources=self.sources,
                     settings=self.settings)
        d.update(warnings=self.warnings, errors=self.errors, _started=self.started)
        if self.unit_stops is not None:
            d["unit_stops"] = self.unit_stops
        if self.hints:
            d["hints"] = self.hints
        if self.leaks is not None:
            d["leaks"] = self.leaks
        if self.pre_stop_report is not None:
            d["pre_stop_report"] = self.pre_stop_report
        if self.removed_cgroups:
            d["removed_cgroups"] = self.removed_cgroups
        return d


def stopped_units(unit_stops: dict[str, Any]) -> set[str]:
    return {u["unit"] for u in unit_stops["units"]
            if isinstance(u, dict) and u.get("action") == "stopped"}  # a cut list ends in text


def gpus_used(pre: dict[str, Any] | None) -> set[int]:
    """The GPU indexes a (pre-stop) report's holders had memory on (listed or not)."""
    pre = pre or {}
    more = (pre.get("holders_not_listed") or {}).get("gpu_memory_mib") or {}
    return {int(g) for h in pre.get("holders", []) for g in (h.get("gpu_memory_mib") or {})
            } | {int(g) for g in more}


@dataclass
class RunResult:
    report: Report  # redacted: what is written and shown
    path: Path | None
    exit_code: int
    report_error: str | None = None
    ctconf: CtConfig | None = None  # the container's config as the run read it
    spare: Path | None = None  # where an unsaved report was kept (reportfiles.SPARE_DIR)

    @property
    def verdict(self) -> Verdict:
        return self.report.verdict


@dataclass(frozen=True)
class Stamp:
    """Where and when a run ran, and which pveclean: given by the host, never read here."""

    version: str
    host: str
    started: float  # time.time() at the start
    duration_s: float


def busy_report(stamp: Stamp, vmid: int, phase: str, dry_run: bool, gpu_config: list[str],
                why: str) -> Report:
    """The report of a run that found the container's lock held (by another cleanup)."""
    return Report(stamp.version, vmid, phase, stamp.host, iso(stamp.started),
                  stamp.duration_s, dry_run, Verdict.BUSY,
                  Summary(holders=0, stopped=0, outcomes={}, freed_mib=0, rounds=0),
                  ContainerState(None, gpu_config), stamp.started, errors=[why])


def memory_table(
    before: list[GpuMemory] | None, after: list[GpuMemory] | None
) -> list[dict[str, Any]]:
    """Each GPU's memory before and after; one NVML could not read (before or after) has
    no figure for that read, and its `status` (lost, unavailable) and `reason`."""
    out = []
    after_by = {g.index: g for g in after or []}
    for g in before or []:
        a = after_by.get(g.index)
        a_ok = a is not None and a.ok
        row: dict[str, Any] = {
            "index": g.index,
            "minor": g.minor if g.minor is not None else (a.minor if a else None),
            "uuid": g.uuid or (a.uuid if a else ""),
            "name": g.name or (a.name if a else ""),
            "total_mib": g.total_mib if g.ok else (a.total_mib if a and a_ok else None),
            "reserved_mib": g.reserved_mib,
            "used_before_mib": g.used_mib if g.ok else None,
            "used_after_mib": a.used_mib if a is not None and a_ok else None,
            "freed_mib": (g.used_mib - a.used_mib) if a is not None and a_ok and g.ok
            else None,
        }
        bad = [(when, x) for when, x in (("before", g), ("after", a)) if x and not x.ok]
        if bad:
            row["status"] = "lost" if any(x.status == "lost" for _, x in bad) else \
                "unavailable"
            row["reason"] = "; ".join(f"{when}: {x.reason}" for when, x in bad)
        out.append(row)
    return out


@dataclass(frozen=True)
class Findings:
    """What a (non-busy) run saw and did, for its report."""

    verdict: Verdict
    holders: list[Holder]
    disc: Discovery
    before: list[GpuMemory] | None
    after: list[GpuMemory] | None
    rounds: int
    errors: list[str]
    verify_s: float | None = None  # verification after the last holder's exit
    readers_killed: int = 0


def build_report(stamp: Stamp, vmid: int, phase: str, dry_run: bool, found: Findings,
                 gpu_config: list[str], cfg: Config) -> Report:
    gpus = memory_table(found.before, found.after)
    freed = sum(max(g["freed_mib"] or 0, 0) for g in gpus)
    counts: dict[str, int] = {}
    for h in found.holders:
        key = str(h.outcome) if h.outcome else "unknown"
        counts[key] = counts.get(key, 0) + 1
    disc = found.disc
    warnings = list(disc.warnings)
    if disc.sources.get("nvml", "ok") != "ok" and not disc.sources["nvml"].startswith("not "):
        warnings.append(f"NVML not used ({disc.sources['nvml']}); verified by rescanning only")
    respawners = sorted({h.respawned_by for h in found.holders if h.respawned_by})
    if respawners:
        warnings.append(f"holders were respawned by: {', '.join(respawners)}")
    summary = Summary(holders=len(found.holders),
                      stopped=sum(counts.get(str(o), 0) for o in sorted(STOPPED)),
                      outcomes=counts, freed_mib=freed, rounds=found.rounds,
                      verified_after_last_exit_s=found.verify_s,
                      readers_killed=found.readers_killed)
    return Report(
        stamp.version, vmid, phase, stamp.host, iso(stamp.started), stamp.duration_s, dry_run,
        found.verdict, summary,
        ContainerState(disc.running, gpu_config, disc.init_pid, disc.tree_pids),
        stamp.started, holders=list(found.holders), gpus=gpus,
        other_gpu_users=disc.other_holders, sources=disc.sources,
        settings={"grace_seconds": cfg.grace_seconds, "deadline_seconds": cfg.deadline_seconds,
                  "config": cfg.source},
        warnings=warnings, errors=found.errors)
