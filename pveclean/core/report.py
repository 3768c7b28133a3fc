"""The report of one run as a typed record: built from what the run saw and did, amended by
the phases (post-stop's leak check, pre-start's removed cgroups, the units), redacted, and
turned into the report's dict only at the edge (files, terminal, JSON, syslog, metrics)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pveclean.core import bounds
from pveclean.core.records import (
    LEAK_SLACK_MIB,
    Discovery,
    GpuMemory,
    GpuStatus,
    Holder,
    NvmlProcesses,
    OtherUser,
    SourceState,
    iso,
)
from pveclean.core.redact import MAX_VALUE, Redactor
from pveclean.core.reportparts import GpuRow, Settings, Sources, more_line, sources_dict
from pveclean.core.verdicts import (
    REMAINING,
    STOPPED,
    Outcome,
    Verdict,
    with_leaks,
    with_unjudged,
)

__all__ = ["LEAK_SLACK_MIB", "MAX_VALUE", "Redactor", "Report", "build_report", "busy_report",
           "find_leaks", "iso", "memory_table"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from pveclean.core.amendments import Leak, NotListed, PreStopBrief, UnitStops
    from pveclean.core.config import Config
    from pveclean.core.release import GpuRelease
    from pveclean.proxmox.pveconf import CtConfig




def find_leaks(gpus: list[GpuMemory], procs: NvmlProcesses,
               minors: set[int], used_by_ct: set[int]) -> list[Leak]:
    """Memory allocated on the container's GPUs that no live process accounts for. A PID's
    figure on a GPU is already the sum of its rows there (one per MIG instance, see
    host/nvml.py), so no MIG user shows as a leak. A GPU NVML could not read, or whose
    process list it could not give (`procs.faults`), or where it reports a process's memory
    as not available (N/A: under MIG, on some boards), is not judged: no figure, no leak."""
    from pveclean.core.amendments import Leak  # a post-stop's only

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
        listed = [m for per in procs.by_pid.values() for i, m in per.items() if i == g.index]
        if None in listed:
            continue  # a process's memory NVML reports as not available: not judged
        accounted = sum(m or 0 for m in listed)
        unaccounted = g.used_mib - accounted
        if unaccounted > LEAK_SLACK_MIB:
            leaks.append(Leak(g.index, g.uuid, unaccounted,
                              f"no process holds this memory; reset GPU {g.index} where "
                              f"safe: pveclean reset {g.index} (--dry-run first)"))
    return leaks


@dataclass(frozen=True)
class Summary:
    """A report's counts: holders, outcomes, memory freed, rounds."""

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
    """The container as the run found it."""

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
    gpus: list[GpuRow] = field(default_factory=list)
    other_gpu_users: list[OtherUser] = field(default_factory=list)
    sources: Sources = field(default_factory=dict)
    settings: Settings | None = None  # in every report but a busy one
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    via: str | None = None  # what ran it, when not the hookscript
    unit_stops: UnitStops | None = None
    hints: list[str] = field(default_factory=list)
    leaks: list[Leak] | None = None  # a post-stop's
    pre_stop_report: PreStopBrief | None = None
    removed_cgroups: list[str] | None = None  # a pre-start's
    holders_not_listed: NotListed | None = None  # past the caps (core/bounds.py)
    capped: bool = False  # bounded() was applied: `holders` lists only those within the caps
    more_other_gpu_users: int = 0  # past their share of the report (bounds.SECTION_BYTES)
    more_leaks: int = 0
    notify_errors: list[str] | None = None  # what its journal line or metrics could not say
    release: list[GpuRelease] | None = None  # the memory its stop set out to free (release.py)

    @property
    def busy(self) -> bool:
        return self.verdict == Verdict.BUSY

    def remaining(self) -> list[Holder]:
        """The listed holders the run left behind (survived or protected): a bounded report
        lists them first (core/bounds.py); remaining_count() counts them all."""
        return [h for h in self.holders if h.outcome in REMAINING]

    def survived(self) -> int:
        """Holders that survived: counted in the summary (a report lists only some, see
        core/bounds.py), else in the holders listed."""
        counted = self.summary.outcomes.get(str(Outcome.SURVIVED))
        if counted is not None:
            return counted
        return sum(1 for h in self.holders if h.outcome == Outcome.SURVIVED)

    def remaining_count(self) -> int:
        return sum(self.summary.outcomes.get(str(o), 0) for o in REMAINING)

    def bounded(self) -> Report:
        """The report within the caps of core/bounds.py: at most bounds.HOLDERS holders
        listed (the others summarized), each with its device paths and strings cut, and the
        other lists cut to their share; its YAML stays under bounds.MAX_REPORT_BYTES, so
        redacting and dumping it take a bounded time. Counts and outcomes stay whole."""
        clipped = self._clipped()
        if self.capped:  # bounded before (a post-stop's, amended): its holders are
            return clipped
        listed, rest = bounds.select(self.holders)
        return dataclasses.replace(clipped, holders=listed,
                                   holders_not_listed=bounds.not_listed(rest), capped=True)

    def _clipped(self) -> Report:
        """The lists past their share of MAX_REPORT_BYTES cut (bounds.SECTION_BYTES)."""
        share = bounds.SECTION_BYTES
        others, more_others = bounds.clip_list(self.other_gpu_users, share["other_gpu_users"])
        leaks, more_leaks = (None, 0) if self.leaks is None else bounds.clip_list(
            self.leaks, share["leaks"])
        return dataclasses.replace(
            self, warnings=bounds.clip(self.warnings, share["warnings"]),
            errors=bounds.clip(self.errors, share["errors"]),
            hints=bounds.clip(self.hints, share["hints"]),
            removed_cgroups=None if self.removed_cgroups is None else bounds.clip(
                self.removed_cgroups, share["removed_cgroups"]),
            other_gpu_users=others, more_other_gpu_users=self.more_other_gpu_users + more_others,
            leaks=leaks, more_leaks=self.more_leaks + more_leaks,
            unit_stops=None if self.unit_stops is None else bounds.clip_unit_stops(
                self.unit_stops, share["unit_stops"]))

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

    def timed(self, seconds: float) -> Report:
        """The same report, its duration the run's whole one (units' walks and hints come
        after build_report)."""
        return dataclasses.replace(self, duration_s=round(seconds, 3))

    def with_error(self, text: str) -> Report:
        return dataclasses.replace(self, errors=[*self.errors, text])

    def with_notify_errors(self, failed: list[str]) -> Report:
        """What the run's journal line or metrics could not say (shown when any)."""
        return dataclasses.replace(self, notify_errors=list(failed)) if failed else self

    def with_units(self, unit_stops: UnitStops | None, hints: list[str]) -> Report:
        """What --stop-units did (None: not asked) and the hints naming units still at work."""
        summary = self.summary
        if unit_stops is not None:
            summary = dataclasses.replace(summary, units_stopped=sorted(unit_stops.stopped()))
        return dataclasses.replace(self, summary=summary, unit_stops=unit_stops,
                                   hints=list(hints))

    def with_leaks(self, leaks: list[Leak], pre: PreStopBrief | None) -> Report:
        """A post-stop's leak check, and what the last pre-stop report (if any) said."""
        return dataclasses.replace(self, leaks=leaks, pre_stop_report=pre,
                                   verdict=with_leaks(self.verdict, leaks))

    def with_unjudged(self, reasons: list[str]) -> Report:
        """Memory NVML did not answer for (a post-stop's leak check): each reason a warning,
        the verdict `not-judged` unless already worse (core/verdicts.py)."""
        return dataclasses.replace(self, warnings=[*self.warnings, *reasons],
                                   verdict=with_unjudged(self.verdict, reasons))

    def leaked_mib(self) -> int:
        """MiB leaked: a post-stop's leaks, and what a stop's release left (issue 38)."""
        from pveclean.core.release import leaked
        return (sum(x.unaccounted_mib for x in self.leaks or [])
                + sum(r.left_mib or 0 for r in leaked(self.release)))

    def with_release(self, rows: list[GpuRelease] | None) -> Report:
        """Where the memory the stop set out to free stands (None: not watched): what is not
        back is a warning; what is leaked makes the verdict `leaked`, what NVML did not answer
        for `not-judged` (each unless already worse)."""
        if rows is None:
            return self
        from pveclean.core.release import leaked, not_judged, unsettled
        verdict = with_unjudged(self.verdict, [r.line() for r in not_judged(rows)])
        return dataclasses.replace(
            self, release=list(rows), verdict=with_leaks(verdict, leaked(rows)),
            warnings=[*self.warnings, *(r.line() for r in unsettled(rows))])

    def as_dict(self) -> dict[str, object]:
        """The report as it is written and shown: plain values, keys in their fixed order."""
        s = self.summary
        summary: dict[str, object] = {"holders": s.holders, "stopped": s.stopped,
                                      "outcomes": dict(s.outcomes), "freed_mib": s.freed_mib,
                                      "rounds": s.rounds}
        c = self.container
        container: dict[str, object] = {"running": c.running}
        if not self.busy:
            summary["verified_after_last_exit_s"] = s.verified_after_last_exit_s
            container.update(init_pid=c.init_pid,
                             processes_in_cgroup_tree=c.processes_in_cgroup_tree)
        if s.readers_killed:
            summary["readers_killed"] = s.readers_killed
        if s.units_stopped is not None:
            summary["units_stopped"] = s.units_stopped
        container["gpu_config"] = c.gpu_config
        d: dict[str, object] = {"pveclean": self.version, "vmid": self.vmid,
                                "phase": self.phase}
        if self.via is not None:
            d["via"] = self.via
        d.update({"host": self.host, "start": self.start, "duration_s": self.duration_s,
                  "dry_run": self.dry_run, "verdict": str(self.verdict), "summary": summary,
                  "container": container, "holders": [h.as_dict() for h in self.holders]})
        if self.holders_not_listed is not None:
            d["holders_not_listed"] = self.holders_not_listed.as_dict()
        d["gpus"] = [g.as_dict() for g in self.gpus]
        if not self.busy:
            d.update(other_gpu_users=_listed(self.other_gpu_users, self.more_other_gpu_users),
                     sources=sources_dict(self.sources),
                     settings=self.settings.as_dict() if self.settings is not None else {})
        d.update(warnings=self.warnings, errors=self.errors)
        if self.unit_stops is not None:
            d["unit_stops"] = self.unit_stops.as_dict()
        if self.hints:
            d["hints"] = self.hints
        if self.leaks is not None:
            d["leaks"] = _listed(self.leaks, self.more_leaks)
        if self.release is not None:
            d["release"] = [r.as_dict() for r in self.release]
        if self.pre_stop_report is not None:
            d["pre_stop_report"] = self.pre_stop_report.as_dict()
        if self.removed_cgroups:
            d["removed_cgroups"] = self.removed_cgroups
        if self.notify_errors:
            d["notify_errors"] = self.notify_errors
        return d


def _listed(items: list[OtherUser] | list[Leak], more: int) -> list[object]:
    """A section's records as plain values, ending in how many more it did not list."""
    out: list[object] = [x.as_dict() for x in items]
    return [*out, more_line(more)] if more else out


@dataclass
class RunResult:
    """What a run hands its command: the report, where it went, the exit code."""

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


def memory_table(before: list[GpuMemory] | None, after: list[GpuMemory] | None
                 ) -> list[GpuRow]:
    """Each GPU's memory before and after; one NVML could not read (before or after) has
    no figure for that read, and its `status` (lost, unavailable) and `reason`."""
    out = []
    after_by = {g.index: g for g in after or []}
    for g in before or []:
        a = after_by.get(g.index)
        g_ok = g.figures_read  # a getter that failed hides only its own field (nvitop's NA)
        a_ok = a is not None and a.figures_read
        bad = [(when, x) for when, x in (("before", g), ("after", a)) if x and not x.ok]
        status = None if not bad else GpuStatus.LOST if any(
            x.status == GpuStatus.LOST for _, x in bad) else GpuStatus.UNAVAILABLE
        out.append(GpuRow(
            index=g.index,
            minor=g.minor if g.minor is not None else (a.minor if a else None),
            uuid=g.uuid or (a.uuid if a else ""),
            name=g.name or (a.name if a else ""),
            total_mib=g.total_mib if g_ok else (a.total_mib if a and a_ok else None),
            reserved_mib=g.reserved_mib,
            used_before_mib=g.used_mib if g_ok else None,
            used_after_mib=a.used_mib if a is not None and a_ok else None,
            freed_mib=(g.used_mib - a.used_mib) if a is not None and a_ok and g_ok else None,
            status=status,
            reason="; ".join(f"{when}: {x.reason}" for when, x in bad) if bad else None))
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
    freed = sum(max(g.freed_mib or 0, 0) for g in gpus)
    counts: dict[str, int] = {}
    for h in found.holders:
        key = str(h.outcome) if h.outcome else "unknown"
        counts[key] = counts.get(key, 0) + 1
    disc = found.disc
    warnings = list(disc.warnings)
    sources = dict(disc.sources)
    nvml = sources.get("nvml")
    if nvml is not None and not nvml.ok and nvml.state is not SourceState.NOT_RUN:
        warnings.append(f"NVML not used ({nvml}); verified by rescanning only")
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
        other_gpu_users=list(disc.other_holders), sources=sources,
        settings=Settings(cfg.grace_seconds, cfg.deadline_seconds, cfg.source),
        warnings=warnings, errors=found.errors)
