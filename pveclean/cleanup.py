"""One cleanup run: discover -> plan -> stop (with chasing) -> verify -> report."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from pveclean.core import records, report
from pveclean.core.config import Config
from pveclean.core.discovery import doing, merge_probe, stall_for
from pveclean.core.records import Deadline, Discovery, Holder, ProcIdentity, Scope
from pveclean.core.report import RunResult, _busy_report, build_report
from pveclean.core.verdicts import VERDICT_EXIT
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import cgroupfs, devnodes, notify, reportfiles
from pveclean.host.nvml import Nvml
from pveclean.host.pidfds import fd_budget, raise_open_files_limit
from pveclean.host.procscan import w_make_holders, w_parents
from pveclean.host.reads import Reads
from pveclean.host.worker import RemoteError, Worker, WorkerError
from pveclean.proxmox import pveconf
from pveclean.proxmox.probe import finish_probe, start_probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pveclean.core.config import Config
    from pveclean.proxmox.pct import PctReader


def discover(
    scope: Scope,
    reads: Reads,
    pct_command: str | None,
    deadline: Deadline,
    end: float,
    no_probe: str = "disabled in config",
) -> Discovery:
    """Host view and NVML decide; the probe is started here and left running (the run
    merges it when it arrives, see run.py): it never holds up a stop or a verdict."""
    sources = {"host": "ok"}
    warnings: list[str] = []
    running = scope.running
    probing: PctReader | None = None
    if pct_command is None:
        sources["probe"] = no_probe
    elif not running:
        sources["probe"] = "container not running"
    else:
        from pveclean.proxmox.pct import PctReader

        try:
            probing = PctReader(start_probe(scope, pct_command))
            sources["probe"] = "pending"
        except RuntimeError as exc:
            sources["probe"] = f"failed: {exc}"
            warnings.append(f"in-namespace probe did not run: {exc}; using the host view")
    view, others, nvml_status = reads.host(scope, end)
    sources["nvml"] = nvml_status
    if view is None:
        sources["host"] = "did not finish"
        return Discovery([], running, None, len(cgroupfs.tree_pids(scope.cgroup_dir)), sources,
                         warnings, [], list(reads.problems), probing, scanned=False)
    holders = sorted(view.holders.values(), key=lambda h: h.host_pid)
    return Discovery(holders, running, view.init_pid, len(view.tree), sources, warnings, others,
                     list(reads.problems), probing, view=view)


Progress = Callable[[str], None]
POLL_INTERVAL = 0.02  # rescans while verifying; each is a cgroup walk, not a /proc walk
SETTLE = 0.05  # a clean result must hold this long, so a respawn racing us is seen
RESTART_WATCH = 0.3  # s after the last exit: systemd's default RestartSec (100 ms) and a start


def cgroup_root(cfg: Config) -> str:
    return cfg.cgroup_root or cgroupfs.cgroup2_root()


def make_scope(vmid: int, cfg: Config, ctconf: pveconf.CtConfig) -> Scope:
    root = cgroup_root(cfg)
    devices = devnodes.gpu_devices(cfg.devices)
    patterns = sorted({*ctconf.gpu_paths(), "/dev/nvidia*", "/dev/nvidia-caps/*"})
    return Scope(vmid, cgroupfs.container_cgroup(root, vmid), devices, frozenset(cfg.protect),
                 patterns, running=cgroupfs.monitor_running(root, vmid))


def reserve_for(cfg: Config) -> float:
    """Time kept back at the end of the run for the report (and its last NVML query)."""
    return min(0.5, cfg.deadline_seconds * 0.1)


def _identities(reads: Reads, hs: list[Holder], scope: Scope, end: float) -> list[str | None]:
    """Identity checks of `hs` in the worker; a PID whose reads hang is not signalled."""
    from pveclean.host import pidfds

    while True:
        try:
            out: list[str | None] = reads.worker.call(
                pidfds.check_identities, hs, scope.vmid, scope.devices, scope.running,
                reads.stall, frozenset(reads.skip), timeout=end - time.monotonic(),
                what="identity check")
            return out
        except WorkerError as exc:
            if reads.stalled_pid(exc):
                continue
            reads.problems.append(f"identity check did not finish before the deadline: "
                                  f"{doing(exc.note)}")
            return ["identity check did not finish before the deadline; not signalled"] * len(hs)
        except RemoteError as exc:
            reads.problems.append(f"identity check failed: {exc}")
            return [f"identity check failed ({exc}); not signalled"] * len(hs)


def _merge_probe(disc: Discovery, scope: Scope, reads: Reads, end: float,
                 wait: float = 0.0) -> list[Holder]:
    """Merge the probe if it has arrived (or arrives within `wait`); returns holders only it
    saw. A probe still running stays pending."""
    proc = disc.probe
    if proc is None or not proc.pump(wait):  # drained as it comes: it may write a lot
        return []
    disc.probe = None
    try:
        result = finish_probe(proc, max(wait, 0.01))
    except RuntimeError as exc:
        disc.sources["probe"] = f"failed: {exc}"
        disc.warnings.append(f"in-namespace probe did not run: {exc}; using the host view")
        return []
    disc.sources["probe"] = "ok"
    if disc.view is None:
        return []

    def make(found: list[tuple[records.ProcStatus, str]]) -> list[Holder]:
        got = reads.call(w_make_holders, found, scope, end=end, what="probe holders")
        return got if isinstance(got, list) else []

    warnings, new = merge_probe(disc.view, result, scope, make)
    disc.warnings += warnings
    return new


def _drop_probe(disc: Discovery, why: str) -> None:
    """Kill a probe still running, its whole process group, without reading what it wrote
    (a `pct exec` stuck in a frozen container may never close its pipes)."""
    if disc.probe is None:
        return
    import subprocess  # imported by the probe's start

    proc = disc.probe.proc
    disc.probe = None
    disc.sources["probe"] = why
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(0.05)


def stop_and_verify(
    disc: Discovery,
    scope: Scope,
    cfg: Config,
    grace: float,
    reads: Reads,
    deadline: Deadline,
    progress: Progress | None,
) -> tuple[list[Holder], bool, int, float | None]:
    """Returns (all holders handled, verified-free, rounds used, last exit, monotonic).
    Every read goes through the worker; the parent holds the pidfds and signals."""
    from pveclean.host import pidfds  # here: a dry run or a run with nothing to stop needs none

    all_holders = list(disc.holders)
    handled: set[ProcIdentity] = {h.identity for h in all_holders}
    targets = [h for h in all_holders if not h.protected]
    round_no = 0
    end = deadline.end - reserve_for(cfg)
    last_exit: float | None = None
    while True:
        batch = fd_budget()
        for i in range(0, len(targets), batch):  # one batch unless the hard limit is low
            proven, rejected = pidfds.prove_all(
                targets[i:i + batch], lambda hs: _identities(reads, hs, scope, end))
            for h, why in rejected:
                h.outcome = "exited" if why.startswith("exited") else "skipped"
                h.signals.append(why)
            if proven:
                exited = pidfds.stop(
                    proven, grace, end, progress,
                    lambda pids: reads.call(pidfds.describe, pids,  # type: ignore
                                            end=deadline.end, what="survivors' state"))
                if exited is not None:
                    last_exit = max(last_exit or exited, exited)
        known = {h.host_pid for h in all_holders}
        clean_since: float | None = None
        chase: list[Holder] = []
        while True:
            for h in _merge_probe(disc, scope, reads, end):
                if h.identity not in handled and not h.protected:
                    chase.append(h)
                elif h.identity not in handled:
                    h.outcome = "protected"
                    handled.add(h.identity)
                    all_holders.append(h)
            if chase and not deadline.expired():
                break
            rescan = reads.rescan(scope, known, end)
            if rescan is None:
                return all_holders, False, round_no, last_exit
            view, nvml_pids = rescan
            live = [h for h in view.holders.values() if not h.protected]
            new = [h for h in live if h.identity not in handled]
            if new and round_no < cfg.chase_rounds and not deadline.expired():
                chase = new
                break
            if new:  # they keep coming back: report them, the rounds are spent
                parents = _parents(reads, new, end)
                for h in new:
                    h.outcome, h.respawned_by = "survived", parents.get(h.ppid)
                    h.signals.append(f"appeared after the last of {cfg.chase_rounds} rounds; "
                                     "not signalled")
                    handled.add(h.identity)
                    all_holders.append(h)
                return all_holders, False, round_no, last_exit
            protected = [h for h in view.holders.values() if h.protected]
            if not live and not nvml_pids:
                now = time.monotonic()
                clean_since = clean_since or now
                if now - clean_since >= SETTLE or end - now < SETTLE:
                    return all_holders, not protected, round_no, last_exit
            else:
                clean_since = None
                if live:  # survivors: stop() already waited for them up to the deadline
                    return all_holders, False, round_no, last_exit
                # only NVML still lists our exited processes: the driver releases memory a
                # little after the exit, so keep polling until it lets go or time runs out
            if end - time.monotonic() <= 0:
                return all_holders, False, round_no, last_exit
            time.sleep(min(POLL_INTERVAL, max(end - time.monotonic(), 0)))
        round_no += 1
        if progress:
            progress(f"round {round_no}: {len(chase)} new holder(s) appeared; stopping them")
        parents = _parents(reads, chase, end)
        for h in chase:
            h.round = round_no
            h.respawned_by = parents.get(h.ppid)
            handled.add(h.identity)
            all_holders.append(h)
        targets = chase


def _parents(reads: Reads, hs: list[Holder], end: float) -> dict[int, str]:
    got = reads.call(w_parents, sorted({h.ppid for h in hs}), end=end, what="parents")
    return got if isinstance(got, dict) else {}


def clean(
    vmid: int,
    cfg: Config,
    worker: Worker,
    phase: str = "manual",
    dry_run: bool = False,
    grace: float | None = None,
    progress: Progress | None = None,
    write_report: bool = True,
    deadline: Deadline | None = None,
    stop_units: bool = False,
) -> RunResult:
    """One run. A cleanup holds the container's lock (a second one reports `busy`); a dry run
    only reads and takes no lock, so it can never hold up a cleanup. One deadline covers the
    whole run, the lock wait included; the report is written in the time kept back for it.
    With `stop_units`, the holders' systemd units are stopped before any signal. `worker`:
    NVML's, the entry point's to make and close (host/prelude.py)."""
    started = time.time()
    deadline = deadline or Deadline(cfg.deadline_seconds)
    raise_open_files_limit()
    scan = Worker()  # the run's reads of /proc and /etc/pve (discover.Reads)
    wk = worker
    try:
        ctconf = read_ct_config(cfg, vmid, scan, deadline)
        if dry_run:
            res = _clean(vmid, cfg, ctconf, phase, dry_run, grace, progress, write_report, wk,
                         deadline, started, stop_units, scan)
        else:
            from pveclean.host.lock import Busy, container_lock  # here: a dry run takes no lock

            wait = min(cfg.lock_wait_seconds, max(0.0, deadline.remaining() - reserve_for(cfg)))
            try:
                with container_lock(cfg.state_dir, vmid, wait, f"{phase} run"):
                    res = _clean(vmid, cfg, ctconf, phase, dry_run, grace, progress,
                                 write_report, wk, deadline, started, stop_units, scan)
            except Busy as exc:
                res = finish(_busy_report(vmid, phase, started, dry_run, ctconf, exc), cfg,
                             write_report, deadline, scan)
        res.ctconf = ctconf
        return res
    finally:
        scan.close()


def read_ct_config(cfg: Config, vmid: int, wk: Worker, deadline: Deadline) -> pveconf.CtConfig:
    """The container's config, read in the worker: /etc/pve is pmxcfs, a FUSE file system,
    and a pmxcfs that stopped answering must not hold a run past its deadline."""
    left = max(deadline.remaining() - reserve_for(cfg), 0.05)
    path = pveconf.config_path(cfg.pve_config_dir, vmid)
    try:
        got = wk.call(pveconf.w_read_config, cfg.pve_config_dir, vmid, timeout=left,
                      what="reading the container's config")
    except WorkerError:
        raise PvecleanError(f"reading {path} did not finish within {left:.1f} s (pmxcfs not "
                            "answering?); nothing done", ExitCode.ACCESS) from None
    except RemoteError as exc:
        raise PvecleanError(f"cannot read {path}: {exc}", ExitCode.ACCESS) from None
    if isinstance(got, tuple):
        raise PvecleanError(*got)
    ctconf: pveconf.CtConfig = got
    return ctconf


def _clean(
    vmid: int,
    cfg: Config,
    ctconf: pveconf.CtConfig,
    phase: str,
    dry_run: bool,
    grace: float | None,
    progress: Progress | None,
    write_report: bool,
    wk: Worker,
    deadline: Deadline,
    started: float,
    stop_units: bool,
    scan: Worker,
) -> RunResult:
    scope = make_scope(vmid, cfg, ctconf)
    end = deadline.end - reserve_for(cfg)
    idle = cgroupfs.nothing_left(scope.cgroup_dir, scope.running)  # then no NVML at all
    with Reads(wk, deadline, stall_for(cfg), not idle,
               Nvml.for_run(cfg.nvml_library, cfg.deadline_seconds).timeout, scan) as reads:
        errors: list[str] = []
        # A dry run starts no probe: it shows what a cleanup would act on now, and the probe's
        # findings would come in after it (a `pct exec` takes 0.5 s on Proxmox to start).
        no_probe = ("disabled in config" if not cfg.probe else
                    "container not running" if not scope.running else
                    "not run: a dry run shows what the host view and NVML find")
        disc = discover(scope, reads, cfg.pct_command if cfg.probe and not dry_run else None,
                        deadline, end, no_probe)
        before = reads.before  # asked with the host scan
        if idle:
            disc.sources["nvml"] = "not needed: container stopped, its cgroup tree is empty"
        if progress:
            progress(f"found {len(disc.holders)} GPU holder(s) in CT {vmid}")
        unit_stops = None
        if stop_units:
            from pveclean.proxmox import guestunits

            unit_stops = guestunits.before_stop(vmid, cfg, scope, disc, deadline, dry_run, progress)
        rounds = 0
        verify_s: float | None = None
        last_exit: float | None = None
        if dry_run:
            holders = disc.holders
            for h in holders:
                h.outcome = "protected" if h.protected else "would-stop"
            verdict = "dry-run"
        elif not disc.holders:
            holders = []
            verdict = "nothing-to-do"
        else:
            for h in disc.holders:
                if h.protected:
                    h.outcome = "protected"
            g = cfg.grace_seconds if grace is None else grace
            holders, verified, rounds, last_exit = stop_and_verify(disc, scope, cfg, g, reads,
                                                                   deadline, progress)
            if last_exit is not None:
                # how long verification took after the last holder was gone (pidfd readable)
                verify_s = round(time.monotonic() - last_exit, 3)
            survivors = [h for h in holders if h.outcome in ("survived", "protected")]
            verdict = "clean" if verified and not survivors else "residual"
        if disc.probe is not None:
            late = ("not waited for: the host view and NVML found nothing to clean"
                    if not holders else
                    f"late: not finished when the run ended ({deadline.elapsed():.2f} s); "
                    "its findings were not used")
            _drop_probe(disc, late)
        after = reads.memory(end) if not (dry_run or idle or not disc.scanned) else before
        problems = list(dict.fromkeys(reads.problems))
        errors += problems
        if problems and verdict in ("clean", "nothing-to-do"):
            verdict = "residual"  # part of the tree could not be read: nothing to vouch for
        if reads.nvml_error and not idle and disc.sources.get("nvml") == "ok":
            errors.append(reads.nvml_error)
        rep = build_report(vmid, phase, started, deadline, dry_run, verdict, holders, disc,
                           before, after, rounds, ctconf, errors, cfg)
        rep["summary"]["verified_after_last_exit_s"] = verify_s
        if reads.killed:
            rep["summary"]["readers_killed"] = len(reads.killed)
        if unit_stops is not None or holders:  # else there is nothing to say of units
            from pveclean.proxmox import guestunits

            if phase == "manual" and last_exit is not None:
                # a stopping container's units stop with it: hooks do not wait for restarts
                guestunits.await_restarts(holders, scope.cgroup_dir.parent.parent,
                                     min(last_exit + RESTART_WATCH, end))
            guestunits.annotate(rep, scope, unit_stops)
        return finish(rep, cfg, write_report, deadline, reads.worker)


REPORT_WAIT = 0.5  # s: writing the report may take at least this, even at the deadline


def _write_report(rep: dict[str, Any], cfg: Config) -> str:
    """In a worker: write, prune, publish (a report dir or metrics file on a hung NFS mount
    blocks here, not in the run)."""
    path = reportfiles.write(rep, cfg.report_dir)
    reportfiles.prune(cfg.report_dir, int(rep["vmid"]), cfg.keep_reports, cfg.max_report_age_days)
    notify.publish(rep, str(path), cfg.syslog, cfg.syslog_socket, cfg.metrics_path)
    return str(path)


def finish(rep: dict[str, Any], cfg: Config, write_report: bool = True,
           deadline: Deadline | None = None, writer: Worker | None = None) -> RunResult:
    """Redact, write and prune within what is left of the run (at least REPORT_WAIT), in
    `writer` (the run's scan worker, idle by now: no fork) or a worker of its own; a report
    that cannot be written is kept in the result and said in syslog."""
    rep = report.Redactor(cfg.redact).value(rep)
    code = VERDICT_EXIT.get(str(rep["verdict"]), ExitCode.OK)
    if not write_report:
        return RunResult(rep, None, code)
    wait = max(deadline.remaining() if deadline else 0.0, REPORT_WAIT)
    # a writer is the caller's to close; a worker of its own is closed here
    with contextlib.nullcontext(writer) if writer else Worker() as wk:
        try:
            return RunResult(rep, Path(wk.call(_write_report, rep, cfg, timeout=wait,
                                               what="report")), code)
        except RemoteError as exc:
            why = str(exc).removeprefix("ReportError: ")
        except WorkerError:
            why = (f"writing the report to {cfg.report_dir} did not finish within {wait:.1f} s "
                   "(a hung file system?)")
    rep.setdefault("errors", []).append(why)
    # syslog only: a metrics file on the same hung file system would block this process
    notify.publish(rep, None, cfg.syslog, cfg.syslog_socket, None)
    return RunResult(rep, None, max(code, ExitCode.REPORT), why)
