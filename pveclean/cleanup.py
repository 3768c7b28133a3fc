"""One cleanup run: discover -> plan -> stop (with chasing) -> verify -> report."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from pveclean.core import policy, records, report, verdicts
from pveclean.core.config import Config
from pveclean.core.discovery import merge_probe, stall_for
from pveclean.core.policy import Step
from pveclean.core.records import Deadline, Discovery, Holder, ProcIdentity, Scope, Source
from pveclean.core.records import SourceState as State
from pveclean.core.report import Findings, Report, RunResult, build_report, busy_report
from pveclean.core.verdicts import Outcome, Verdict
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import cgroupfs, devnodes, notify, pidfds, reportfiles
from pveclean.host.clock import stamp, start_deadline
from pveclean.host.freezer import Freezer
from pveclean.host.lock import Busy, container_lock
from pveclean.host.nvml import Nvml
from pveclean.host.pidfds import fd_budget, raise_open_files_limit
from pveclean.host.procscan import w_make_holders, w_parents
from pveclean.host.runreads import Reads
from pveclean.host.worker import RemoteError, Worker, WorkerError
from pveclean.proxmox import guestunits, pveconf
from pveclean.proxmox.pct import PctReader
from pveclean.proxmox.probe import finish_probe, start_probe


def discover(
    scope: Scope,
    reads: Reads,
    pct_command: str | None,
    deadline: Deadline,
    end: float,
    no_probe: Source = Source(State.DISABLED, "disabled in config"),
    fz: Freezer | None = None,
    keep: float = 0.0,
) -> Discovery:
    """Host view and NVML decide; the probe is started here and left running (the run
    merges it when it arrives, see stop_and_verify): it never holds up a stop or a verdict.
    The tree is read frozen (`fz`); the host scan leaves `keep` s of the time to `end` (at
    most half of it) for stopping what NVML alone names, should the scan not finish."""
    sources = {"host": Source(State.OK)}
    warnings: list[str] = []
    running = scope.running
    probing: PctReader | None = None
    if pct_command is None:
        sources["probe"] = no_probe
    elif not running:
        sources["probe"] = Source(State.NOT_RUN, "container not running")
    else:
        try:
            probing = PctReader(start_probe(scope, pct_command))
            sources["probe"] = Source(State.PENDING)
        except RuntimeError as exc:
            sources["probe"] = Source(State.FAILED, f"failed: {exc}")
            warnings.append(f"in-namespace probe did not run: {exc}; using the host view")
    scan_end = end - min(keep, max(end - time.monotonic(), 0.0) / 2)
    view, others, nvml_status, late = reads.host(scope, end, scan_end,
                                                   None if fz is None else fz.hold)
    sources["nvml"] = nvml_status
    if view is None:
        sources["host"] = Source(State.DID_NOT_FINISH)
        if late:
            warnings.append(f"the host scan did not finish: {len(late)} process(es) that NVML "
                            "lists in the container's cgroup tree are stopped; others may hold "
                            "GPU nodes unseen")
        return Discovery(late, running, None, len(cgroupfs.tree_pids(scope.cgroup_dir)),
                         sources, warnings, others, list(reads.problems), probing, scanned=False)
    holders = sorted(view.holders.values(), key=lambda h: h.host_pid)
    return Discovery(holders, running, view.init_pid, len(view.tree), sources, warnings, others,
                     list(reads.problems), probing, view=view)


Progress = Callable[[str], None]
OnlyGpus = tuple[frozenset[int], frozenset[int]]  # (NVML indices, /dev/nvidiaN minors)
RESTART_WATCH = 0.3  # s after the last exit: systemd's default RestartSec (100 ms) and a start


def cgroup_root(cfg: Config) -> str:
    return cfg.cgroup_root or cgroupfs.cgroup2_root()


def make_scope(vmid: int, cfg: Config, ctconf: pveconf.CtConfig,
               only: OnlyGpus | None = None) -> Scope:
    """`only`: (NVML indices, minors) of the GPUs whose holders alone count (a VM's hand-off)."""
    root = cgroup_root(cfg)
    devices = devnodes.gpu_devices(cfg.devices)
    patterns = sorted({*ctconf.gpu_paths(), "/dev/nvidia*", "/dev/nvidia-caps/*"})
    if only is not None:
        devices = devnodes.only_minors(devices, only[1])
        patterns = [f"/dev/nvidia{m}" for m in sorted(only[1])]
    return Scope(vmid, cgroupfs.container_cgroup(root, vmid), devices, frozenset(cfg.protect),
                 patterns, running=cgroupfs.monitor_running(root, vmid),
                 gpu_indices=None if only is None else only[0])


def reserve_for(cfg: Config) -> float:
    """Time kept back at the end of the run for the report (and its last NVML query)."""
    return min(0.5, cfg.deadline_seconds * 0.1)


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
        disc.sources["probe"] = Source(State.FAILED, f"failed: {exc}")
        disc.warnings.append(f"in-namespace probe did not run: {exc}; using the host view")
        return []
    disc.sources["probe"] = Source(State.OK)
    if disc.view is None:
        return []

    def make(found: list[tuple[records.ProcStatus, str]]) -> list[Holder]:
        got = reads.call(w_make_holders, found, scope, end=end, what="probe holders")
        return got if isinstance(got, list) else []

    warnings, new = merge_probe(disc.view, result, scope, make)
    disc.warnings += warnings
    return new


def _drop_probe(disc: Discovery, why: Source) -> None:
    """Kill a probe still running, its whole process group, unread (PctReader.abandon)."""
    if disc.probe is not None:
        probing, disc.probe = disc.probe, None
        disc.sources["probe"] = why
        probing.abandon()


def stop_and_verify(
    disc: Discovery,
    scope: Scope,
    cfg: Config,
    grace: float,
    reads: Reads,
    deadline: Deadline,
    progress: Progress | None,
    fz: Freezer,
) -> tuple[list[Holder], bool, int, float | None]:
    """Returns (all holders handled, verified-free, rounds used, last exit, monotonic).
    Every read goes through the worker; the parent holds the pidfds and signals. Proofs and
    signals are decided and sent frozen (`fz`); the SIGTERM grace and the waits run thawed.
    A look is frozen and reads the fds and maps of the holders and of processes new since
    discovery; the settling look reads them all, thawed (docs/security.md)."""
    all_holders = list(disc.holders)
    handled: set[ProcIdentity] = {h.identity for h in all_holders}
    targets = [h for h in all_holders if not h.protected]
    round_no = 0
    end = deadline.end - reserve_for(cfg)
    last_exit: float | None = None
    quiet = policy.known_idle(disc.view)
    full, term = False, True
    while True:
        fz.hold()
        batch = fd_budget()
        for i in range(0, len(targets), batch):  # one batch unless the hard limit is low
            proven, rejected = pidfds.prove_all(
                targets[i:i + batch], lambda hs: reads.identities(hs, scope, end))
            for h, why in rejected:
                h.outcome = why.outcome
                h.signals.append(why.note)
            if proven:
                exited = pidfds.stop(
                    proven, grace, end, progress,
                    lambda pids: reads.call(pidfds.describe, pids,
                                            end=deadline.end, what="survivors' state"),
                    fz.set, term)
                if exited is not None:
                    last_exit = max(last_exit or exited, exited)
        known = {h.host_pid for h in all_holders}
        clean_since: float | None = None
        chase: list[Holder] = []
        term = True
        while True:  # thawed here; a look freezes (the settling one aside: docs/security.md)
            chase += _late_holders(disc, scope, reads, end, handled, all_holders)
            if policy.chase_late(len(chase), deadline.expired()):
                break
            rescan = reads.rescan(scope, known, end, None if full else quiet, disc.scanned,
                                  None if full else fz.hold)
            look, new = policy.look_at(rescan, handled)
            step = policy.next_step(look, round_no, cfg.chase_rounds, deadline.expired(),
                                    deadline.clock(), end, clean_since)
            clean_since = step.clean_since
            if step.step is Step.SETTLED and step.verified and quiet and not full:
                full = True  # a non-holder may have been passed a GPU fd (SCM_RIGHTS)
                fz.release()
                continue
            if step.step is Step.CHASE:
                chase, full = new, False
                term = policy.with_grace(len(new), len(targets))
                break
            if step.step is Step.RESPAWNED:  # they keep coming back: report them
                parents = _parents(reads, new, end)
                for h in new:
                    h.outcome, h.respawned_by = Outcome.SURVIVED, parents.get(h.ppid)
                    h.note(f"appeared after the last of {cfg.chase_rounds} rounds; "
                           "not signalled")
                    handled.add(h.identity)
                    all_holders.append(h)
            if step.step is not Step.POLL:
                return all_holders, step.verified, round_no, last_exit
            fz.release()
            full = False
            time.sleep(step.wait)
        round_no += 1
        if not term:
            for h in chase:
                h.note(policy.NO_GRACE)
        if progress:
            progress(f"round {round_no}: {len(chase)} new holder(s) appeared; stopping them")
        parents = _parents(reads, chase, end)
        for h in chase:
            h.round = round_no
            h.respawned_by = parents.get(h.ppid)
            handled.add(h.identity)
            all_holders.append(h)
        targets = chase


def _late_holders(disc: Discovery, scope: Scope, reads: Reads, end: float,
                  handled: set[ProcIdentity], all_holders: list[Holder]) -> list[Holder]:
    """The late probe's new holders to chase; its protected ones are recorded as such."""
    chase = []
    for h in _merge_probe(disc, scope, reads, end):
        if h.identity not in handled and not h.protected:
            chase.append(h)
        elif h.identity not in handled:
            h.outcome = Outcome.PROTECTED
            handled.add(h.identity)
            all_holders.append(h)
    return chase


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
    only: OnlyGpus | None = None,
) -> RunResult:
    """One run. A cleanup holds the container's lock (a second one reports `busy`); a dry run
    only reads and takes no lock. One deadline covers the run, the lock wait included. With
    `stop_units`, the holders' units are stopped before any signal; with `only`, only holders
    of those GPUs count (make_scope). `worker`: NVML's (host/prelude.py)."""
    started = time.time()
    deadline = deadline or start_deadline(cfg.deadline_seconds)
    raise_open_files_limit()
    scan = Worker()  # the run's reads of /proc and /etc/pve (host/reads.Reads)
    wk = worker
    try:
        ctconf = read_ct_config(cfg, vmid, scan, deadline)
        if dry_run:
            res = _clean(vmid, cfg, ctconf, phase, dry_run, grace, progress, write_report, wk,
                         deadline, started, stop_units, scan, only)
        else:
            wait = min(cfg.lock_wait_seconds, max(0.0, deadline.remaining() - reserve_for(cfg)))
            try:
                with container_lock(cfg.state_dir, vmid, wait, f"{phase} run"):
                    res = _clean(vmid, cfg, ctconf, phase, dry_run, grace, progress,
                                 write_report, wk, deadline, started, stop_units, scan, only)
            except Busy as exc:
                busy = busy_report(stamp(started, time.time() - started), vmid, phase,
                                   dry_run, ctconf.gpu_lines(), str(exc))
                res = finish(busy, cfg, write_report, deadline, scan)
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
    only: OnlyGpus | None = None,
) -> RunResult:
    scope = make_scope(vmid, cfg, ctconf, only)
    end = deadline.end - reserve_for(cfg)
    idle = cgroupfs.nothing_left(scope.cgroup_dir, scope.running)  # then no NVML at all
    with Reads(wk, deadline, stall_for(cfg), not idle,
               Nvml.for_run(cfg.nvml_library, cfg.deadline_seconds).timeout, scan) as reads:
        errors: list[str] = []
        # A dry run starts no probe: it shows what a cleanup would act on now, and the probe's
        # findings would come in after it (a `pct exec` takes 0.5 s on Proxmox to start).
        no_probe = (Source(State.DISABLED, "disabled in config") if not cfg.probe else
                    Source(State.NOT_RUN, "container not running" if not scope.running
                           else "not run: a dry run shows what the host view and NVML find"))
        g = cfg.grace_seconds if grace is None else grace
        fz = Freezer(scope.cgroup_dir, cfg.state_dir, vmid, not (dry_run or idle),
                     "not used: a dry run changes nothing (its tree was read while it ran)"
                     if dry_run else "not needed: container stopped, its cgroup tree is empty")
        with fz:  # thawed on every way out; a run that dies: freezer.py
            disc = discover(scope, reads, cfg.pct_command if cfg.probe and not dry_run else None,
                            deadline, end, no_probe, fz, 0.0 if dry_run else g + 1)
            before = reads.before  # asked with the host scan
            disc.warnings += ctconf.unapplied()  # lines Proxmox does not apply either
            if idle:
                disc.sources["nvml"] = Source(State.NOT_RUN, "not needed: container "
                                              "stopped, its cgroup tree is empty")
            if progress:
                progress(f"found {len(disc.holders)} GPU holder(s) in CT {vmid}")
            unit_stops = None
            if stop_units:
                fz.release()  # systemctl runs in the container
                unit_stops = guestunits.before_stop(vmid, cfg, scope, disc, deadline, dry_run,
                                                    progress)
            rounds = 0
            verify_s: float | None = None
            last_exit: float | None = None
            if dry_run:
                holders = disc.holders
                for h in holders:
                    h.outcome = Outcome.PROTECTED if h.protected else Outcome.WOULD_STOP
                verdict = Verdict.DRY_RUN
            elif not disc.holders:
                holders = []
                verdict = Verdict.NOTHING_TO_DO
            else:
                for h in disc.holders:
                    if h.protected:
                        h.outcome = Outcome.PROTECTED
                holders, verified, rounds, last_exit = stop_and_verify(disc, scope, cfg, g, reads,
                                                                       deadline, progress, fz)
                if last_exit is not None:
                    # how long verification took after the last holder was gone (pidfd readable)
                    verify_s = round(time.monotonic() - last_exit, 3)
                verdict = verdicts.after_stop(verified, [h.outcome for h in holders])
        disc.sources["freeze"] = Source(State.OK if fz.holds else State.NOT_RUN, fz.summary())
        disc.warnings += fz.warnings
        if disc.probe is not None:
            late = (Source(State.NOT_RUN, "not waited for: the host view and NVML "
                           "found nothing to clean") if not holders else
                    Source(State.LATE, f"late: not finished when the run ended "
                           f"({deadline.elapsed():.2f} s); its findings were not used"))
            _drop_probe(disc, late)
        asked = not (dry_run or idle) and (disc.scanned or bool(holders))
        after = reads.memory(end) if asked else before
        problems = list(dict.fromkeys(reads.problems))
        errors += problems
        verdict = verdicts.with_problems(verdict, problems)
        if reads.nvml_error and not idle and disc.sources["nvml"].ok:
            errors.append(reads.nvml_error)
        found = Findings(verdict, holders, disc, before, after, rounds, errors, verify_s,
                         len(reads.killed))
        rep = build_report(stamp(started, deadline.elapsed()), vmid, phase, dry_run, found,
                           ctconf.gpu_lines(), cfg)
        if unit_stops is not None or holders:  # else there is nothing to say of units
            if phase == "manual" and last_exit is not None:
                # a stopping container's units stop with it: hooks do not wait for restarts
                guestunits.await_restarts(holders, scope.cgroup_dir.parent.parent,
                                          min(last_exit + RESTART_WATCH, end))
            rep = guestunits.annotate(rep, scope, unit_stops)
        return finish(rep, cfg, write_report, deadline, reads.worker)


REPORT_WAIT = 0.5  # s: writing the report may take at least this, even at the deadline


def _write_report(rep: Report, cfg: Config) -> str:
    """In a worker (a report dir or metrics file on a hung NFS mount blocks here, not in the
    run): publish first, naming the file about to be written, so that what could not be
    logged or written as metrics is recorded in the report itself; then write, prune."""
    name = reportfiles.report_name(rep.vmid, rep.phase, rep.started)
    failed = notify.publish(rep, str(Path(cfg.report_dir) / name), cfg.syslog,
                            cfg.syslog_socket, cfg.metrics_path, cfg.journal_socket)
    path = reportfiles.write_report(rep.with_notify_errors(failed), cfg.report_dir)
    reportfiles.prune(cfg.report_dir, rep.vmid, cfg.keep_reports, cfg.max_report_age_days)
    return str(path)


def finish(rep: Report, cfg: Config, write_report: bool = True,
           deadline: Deadline | None = None, writer: Worker | None = None) -> RunResult:
    """Bound (core/bounds.py: a bounded time whatever the container holds), redact, write and
    prune within what is left of the run (at least REPORT_WAIT), in `writer` (the run's scan
    worker, idle by now, the caller's to close) or a worker of its own. A report that cannot
    be written is kept whole in a spare file (reportfiles.SPARE_DIR), named in syslog."""
    rep = report.Redactor(cfg.redact).value(rep.bounded())
    code = verdicts.exit_code(rep.verdict)
    if not write_report:
        return RunResult(rep, None, code)
    wait = max(deadline.remaining() if deadline else 0.0, REPORT_WAIT)
    with contextlib.nullcontext(writer) if writer else Worker() as wk:
        try:
            return RunResult(rep, Path(wk.call(_write_report, rep, cfg, timeout=wait,
                                               what="report")), code)
        except RemoteError as exc:
            why = exc.message(reportfiles.ReportError)
        except WorkerError:
            why = (f"writing the report to {cfg.report_dir} did not finish within {wait:.1f} s "
                   "(a hung file system?)")
    rep = rep.with_error(why)
    spare = reportfiles.write_spare(rep, max(cfg.keep_reports, 1))
    notify.publish(  # syslog only: metrics on the same hung file system would block here
        rep, None if spare is None else str(spare), cfg.syslog, cfg.syslog_socket,
        None, cfg.journal_socket)
    return RunResult(rep, None, max(code, ExitCode.REPORT), why, spare=spare)
