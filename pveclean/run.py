"""One cleanup run: discover -> plan -> stop (with chasing) -> verify -> report."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import __version__, notify, procfs, pveconf, report, units
from . import stop as stopper
from .config import Config
from .discover import Deadline, HostView, Scope, discover, scan_host
from .lock import Busy, container_lock
from .model import (
    EXIT_OK,
    EXIT_REPORT,
    VERDICT_EXIT,
    Discovery,
    GpuMemory,
    Holder,
    ProcIdentity,
)
from .nvml import Nvml, NvmlUnavailable

Progress = Callable[[str], None]
POLL_INTERVAL = 0.02  # rescans while verifying; each is a cgroup walk, not a /proc walk
SETTLE = 0.05  # a clean result must hold this long, so a respawn racing us is seen


@dataclass
class RunResult:
    report: dict[str, Any]
    path: Path | None
    exit_code: int
    report_error: str | None = None

    @property
    def verdict(self) -> str:
        return str(self.report["verdict"])


def cgroup_root(cfg: Config) -> str:
    return cfg.cgroup_root or procfs.cgroup2_root()


def make_scope(vmid: int, cfg: Config, ctconf: pveconf.CtConfig) -> Scope:
    root = cgroup_root(cfg)
    devices = procfs.gpu_devices(cfg.devices)
    patterns = sorted({*ctconf.gpu_paths(), "/dev/nvidia*", "/dev/nvidia-caps/*"})
    return Scope(vmid, procfs.container_cgroup(root, vmid), devices, frozenset(cfg.protect),
                 patterns, running=procfs.monitor_running(root, vmid))


def _memory(nvml: Nvml | None, deadline: Deadline, errors: list[str]) -> list[GpuMemory] | None:
    if nvml is None or nvml.error:
        return None
    try:
        return nvml.memory(timeout=deadline.cap(nvml.timeout))
    except NvmlUnavailable as exc:
        errors.append(str(exc))
        return None


def _remaining_holders(
    scope: Scope, nvml: Nvml | None, known_pids: set[int], deadline: Deadline
) -> tuple[HostView, set[int]]:
    """Rescan: the container's holders now, and NVML processes that are ours."""
    view = scan_host(scope)
    nvml_pids: set[int] = set()
    if nvml is not None and not nvml.error:
        try:
            procs = nvml.processes(timeout=deadline.cap(nvml.timeout))
            # A PID of ours that NVML still lists has not released its memory yet.
            nvml_pids = {p for p in procs if p in view.statuses or p in known_pids}
        except NvmlUnavailable:
            pass
    return view, nvml_pids


def _respawner(h: Holder) -> str | None:
    st = procfs.read_status(h.ppid)
    return f"{st.name} (host PID {h.ppid})" if st else None


def stop_and_verify(
    disc: Discovery,
    scope: Scope,
    cfg: Config,
    grace: float,
    nvml: Nvml | None,
    deadline: Deadline,
    progress: Progress | None,
) -> tuple[list[Holder], bool, int, float | None]:
    """Returns (all holders handled, verified-free, rounds used, last exit, monotonic)."""
    all_holders = list(disc.holders)
    handled: set[ProcIdentity] = {h.identity for h in all_holders}
    targets = [h for h in all_holders if not h.protected]
    round_no = 0
    reserve = min(0.5, cfg.deadline_seconds * 0.1)
    last_exit: float | None = None
    while True:
        proven: list[stopper.Target] = []
        for h in targets:
            fd, why = stopper.prove(h, scope.vmid, scope.devices, scope.running)
            if fd is None:
                h.outcome = "exited" if why.startswith("exited") else "skipped"
                h.signals.append(why)
            else:
                proven.append(stopper.Target(h, fd))
        if proven:
            exited = stopper.stop(proven, grace, deadline.end - reserve, progress)
            if exited is not None:
                last_exit = max(last_exit or exited, exited)
        known = {h.host_pid for h in all_holders}
        clean_since: float | None = None
        chase: list[Holder] = []
        while True:
            view, nvml_pids = _remaining_holders(scope, nvml, known, deadline)
            live = [h for h in view.holders.values() if not h.protected]
            new = [h for h in live if h.identity not in handled]
            if new and round_no < cfg.chase_rounds and not deadline.expired():
                chase = new
                break
            if new:  # they keep coming back: report them, the rounds are spent
                for h in new:
                    h.outcome, h.respawned_by = "survived", _respawner(h)
                    h.signals.append(f"appeared after the last of {cfg.chase_rounds} rounds; "
                                     "not signalled")
                    handled.add(h.identity)
                    all_holders.append(h)
                return all_holders, False, round_no, last_exit
            protected = [h for h in view.holders.values() if h.protected]
            if not live and not nvml_pids:
                now = time.monotonic()
                clean_since = clean_since or now
                if now - clean_since >= SETTLE or deadline.remaining() < SETTLE:
                    return all_holders, not protected, round_no, last_exit
            else:
                clean_since = None
                if live:  # survivors: stop() already waited for them up to the deadline
                    return all_holders, False, round_no, last_exit
                # only NVML still lists our exited processes: the driver releases memory a
                # little after the exit, so keep polling until it lets go or time runs out
            if deadline.remaining() <= 0:
                return all_holders, False, round_no, last_exit
            time.sleep(min(POLL_INTERVAL, deadline.remaining()))
        round_no += 1
        if progress:
            progress(f"round {round_no}: {len(chase)} new holder(s) appeared; stopping them")
        for h in chase:
            h.round = round_no
            h.respawned_by = _respawner(h)
            handled.add(h.identity)
            all_holders.append(h)
        targets = chase


def clean(
    vmid: int,
    cfg: Config,
    phase: str = "manual",
    dry_run: bool = False,
    grace: float | None = None,
    progress: Progress | None = None,
    write_report: bool = True,
    nvml: Nvml | None = None,
    stop_units: bool = False,
) -> RunResult:
    """One run under the container's lock; a second concurrent run reports `busy`.
    With `stop_units`, the holders' systemd units are stopped before any signal."""
    started = time.time()
    ctconf = pveconf.read_config(cfg.pve_config_dir, vmid)
    try:
        with container_lock(cfg.state_dir, vmid, cfg.lock_wait_seconds, f"{phase} run"):
            return _clean(vmid, cfg, ctconf, phase, dry_run, grace, progress, write_report,
                          nvml, stop_units)
    except Busy as exc:
        rep = {
            "pveclean": __version__, "vmid": vmid, "phase": phase,
            "host": os.uname().nodename, "start": report.iso(started),
            "duration_s": round(time.time() - started, 3), "dry_run": dry_run,
            "verdict": "busy", "summary": {"holders": 0, "stopped": 0, "outcomes": {},
                                           "freed_mib": 0, "rounds": 0},
            "container": {"running": None, "gpu_config": ctconf.gpu_lines()},
            "holders": [], "gpus": [], "warnings": [], "errors": [str(exc)],
            "_started": started,
        }
        return finish(rep, cfg, write_report)


def _clean(
    vmid: int,
    cfg: Config,
    ctconf: pveconf.CtConfig,
    phase: str,
    dry_run: bool,
    grace: float | None,
    progress: Progress | None,
    write_report: bool,
    nvml: Nvml | None,
    stop_units: bool = False,
) -> RunResult:
    started = time.time()
    deadline = Deadline(cfg.deadline_seconds)
    scope = make_scope(vmid, cfg, ctconf)
    # A stopped container with an empty cgroup tree has nothing to find: skip NVML, whose
    # init can take seconds on a host without nvidia-persistenced (every start pays it).
    idle = not scope.running and not procfs.tree_pids(scope.cgroup_dir)
    if nvml is None and not idle:
        nvml = Nvml.for_run(cfg.nvml_library, cfg.deadline_seconds)
    errors: list[str] = []
    before = None if idle else _memory(nvml, deadline, errors)
    disc = discover(scope, None if idle else nvml, cfg.pct_command if cfg.probe else None,
                    deadline)
    if idle:
        disc.sources["nvml"] = "not needed: container stopped, its cgroup tree is empty"
    if progress:
        progress(f"found {len(disc.holders)} GPU holder(s) in CT {vmid}")
    holders = disc.holders
    unit_stops = units.before_stop(vmid, cfg, scope, disc, deadline, dry_run, progress) \
        if stop_units else None
    rounds = 0
    verify_s: float | None = None
    if dry_run:
        for h in holders:
            h.outcome = "protected" if h.protected else "would-stop"
        verdict = "dry-run"
    elif not holders:
        verdict = "nothing-to-do"
    else:
        for h in holders:
            if h.protected:
                h.outcome = "protected"
        g = cfg.grace_seconds if grace is None else grace
        holders, verified, rounds, last_exit = stop_and_verify(disc, scope, cfg, g, nvml,
                                                               deadline, progress)
        if last_exit is not None:
            # how long verification took after the last holder was gone (pidfd readable)
            verify_s = round(time.monotonic() - last_exit, 3)
        survivors = [h for h in holders if h.outcome in ("survived", "protected")]
        verdict = "clean" if verified and not survivors else "residual"
    after = _memory(nvml, deadline, errors) if not (dry_run or idle) else before
    rep = build_report(vmid, phase, started, deadline, dry_run, verdict, holders, disc,
                       before, after, rounds, ctconf, errors, cfg)
    rep["summary"]["verified_after_last_exit_s"] = verify_s
    units.annotate(rep, scope, unit_stops)
    return finish(rep, cfg, write_report)


def finish(rep: dict[str, Any], cfg: Config, write_report: bool = True) -> RunResult:
    """Redact, write and prune; a report that cannot be written is kept in the result."""
    rep = report.Redactor(cfg.redact).value(rep)
    code = VERDICT_EXIT.get(str(rep["verdict"]), EXIT_OK)
    if not write_report:
        return RunResult(rep, None, code)
    try:
        path = report.write(rep, cfg.report_dir)
    except report.ReportError as exc:
        rep.setdefault("errors", []).append(str(exc))
        notify.publish(rep, None, cfg.syslog, cfg.syslog_socket, cfg.metrics_path)
        return RunResult(rep, None, max(code, EXIT_REPORT), str(exc))
    report.prune(cfg.report_dir, int(rep["vmid"]), cfg.keep_reports, cfg.max_report_age_days)
    notify.publish(rep, str(path), cfg.syslog, cfg.syslog_socket, cfg.metrics_path)
    return RunResult(rep, path, code)


def memory_table(
    before: list[GpuMemory] | None, after: list[GpuMemory] | None
) -> list[dict[str, Any]]:
    out = []
    after_by = {g.index: g for g in after or []}
    for g in before or []:
        a = after_by.get(g.index)
        out.append({
            "index": g.index,
            "minor": g.minor,
            "uuid": g.uuid,
            "name": g.name,
            "total_mib": g.total_mib,
            "reserved_mib": g.reserved_mib,
            "used_before_mib": g.used_mib,
            "used_after_mib": a.used_mib if a else None,
            "freed_mib": (g.used_mib - a.used_mib) if a else None,
        })
    return out


def build_report(
    vmid: int,
    phase: str,
    started: float,
    deadline: Deadline,
    dry_run: bool,
    verdict: str,
    holders: list[Holder],
    disc: Discovery,
    before: list[GpuMemory] | None,
    after: list[GpuMemory] | None,
    rounds: int,
    ctconf: pveconf.CtConfig,
    errors: list[str],
    cfg: Config,
) -> dict[str, Any]:
    gpus = memory_table(before, after)
    freed = sum(max(g["freed_mib"] or 0, 0) for g in gpus)
    counts: dict[str, int] = {}
    for h in holders:
        counts[h.outcome or "unknown"] = counts.get(h.outcome or "unknown", 0) + 1
    warnings = list(disc.warnings)
    if disc.sources.get("nvml", "ok") != "ok" and not disc.sources["nvml"].startswith("not "):
        warnings.append(f"NVML not used ({disc.sources['nvml']}); verified by rescanning only")
    respawners = sorted({h.respawned_by for h in holders if h.respawned_by})
    if respawners:
        warnings.append(f"holders were respawned by: {', '.join(respawners)}")
    return {
        "pveclean": __version__,
        "vmid": vmid,
        "phase": phase,
        "host": os.uname().nodename,
        "start": report.iso(started),
        "duration_s": round(deadline.elapsed(), 3),
        "dry_run": dry_run,
        "verdict": verdict,
        "summary": {
            "holders": len(holders),
            "stopped": counts.get("terminated", 0) + counts.get("killed", 0),
            "outcomes": counts,
            "freed_mib": freed,
            "rounds": rounds,
        },
        "container": {
            "running": disc.running,
            "init_pid": disc.init_pid,
            "processes_in_cgroup_tree": disc.tree_pids,
            "gpu_config": ctconf.gpu_lines(),
        },
        "holders": [h.as_dict() for h in holders],
        "gpus": gpus,
        "other_gpu_users": disc.other_holders,
        "sources": disc.sources,
        "settings": {
            "grace_seconds": cfg.grace_seconds,
            "deadline_seconds": cfg.deadline_seconds,
            "config": cfg.source,
        },
        "warnings": warnings,
        "errors": errors,
        "_started": started,
    }
