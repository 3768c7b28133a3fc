"""One cleanup run: discover -> plan -> stop (with chasing) -> verify -> report."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from pveclean.core import records, report, verdicts
from pveclean.core.config import Config
from pveclean.core.discovery import merge_probe, stall_for
from pveclean.core.records import Deadline, Discovery, Holder, Scope, Source
from pveclean.core.records import SourceState as State
from pveclean.core.report import Findings, Report, RunResult, build_report, busy_report
from pveclean.core.run import Asked, OnlyGpus, Run, RunOptions
from pveclean.core.verdicts import Outcome, Verdict
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import cgroupfs, devnodes, releasewatch
from pveclean.host.clock import stamp, start_deadline
from pveclean.host.freezer import Freezer
from pveclean.host.nvml import Nvml
from pveclean.host.procfs import raise_open_files_limit
from pveclean.host.procscan import w_make_holders, w_parents
from pveclean.host.runreads import Reads
from pveclean.host.worker import RemoteError, Worker, WorkerError
from pveclean.proxmox import pveconf

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core import policy
    from pveclean.core.amendments import UnitStops
    from pveclean.core.stopping import Loop, Stopped
    from pveclean.proxmox.pct import PctReader


RESTART_WATCH = 0.3  # s after the last exit: systemd's default RestartSec (100 ms) and a start


def _no_probe(run: Run) -> Source | None:
    """Why the run starts no probe, or None: it starts one. A dry run starts none: it shows
    what a cleanup would act on now, and the probe's findings would come in after it (a
    `pct exec` takes 0.5 s on Proxmox to start)."""
    return (Source(State.DISABLED, "disabled in config") if not run.cfg.probe else
            Source(State.NOT_RUN, "container not running") if not run.scope.running else
            Source(State.NOT_RUN, "not run: a dry run shows what the host view and NVML find")
            if run.opts.dry_run else None)


def discover(run: Run) -> Discovery:
    """Host view and NVML decide; the probe is started and left running (merged when it
    arrives): it never holds up a stop or a verdict. The tree is read frozen. Should the scan
    not finish, grace + 1 s is left (at most half; a dry run: none) for what NVML alone names."""
    scope, reads, end = run.scope, run.reads, run.deadline.work_end
    sources = {"host": Source(State.OK)}
    warnings: list[str] = []
    probing: PctReader | None = None
    no_probe = _no_probe(run)
    if no_probe is not None:
        sources["probe"] = no_probe
    else:
        # the probe's modules for a probe only: a dry run, a stopped container and a
        # disabled probe start none
        from pveclean.proxmox.pct import PctReader
        from pveclean.proxmox.probe import start_probe
        try:
            probing = PctReader(start_probe(scope, run.cfg.pct_command))
            sources["probe"] = Source(State.PENDING)
        except RuntimeError as exc:
            sources["probe"] = Source(State.FAILED, f"failed: {exc}")
            warnings.append(f"in-namespace probe did not run: {exc}; using the host view")
    keep = 0.0 if run.opts.dry_run else run.grace + 1
    scan_end = end - min(keep, run.deadline.work_left() / 2)
    view, others, nvml_status, late = reads.host(scope, end, scan_end, run.freezer.hold)
    sources["nvml"] = nvml_status
    if view is None:
        sources["host"] = Source(State.DID_NOT_FINISH)
        if late:
            warnings.append(f"the host scan did not finish: {len(late)} process(es) that NVML "
                            "lists in the container's cgroup tree are stopped; others may hold "
                            "GPU nodes unseen")
        return Discovery(late, scope.running, None, len(cgroupfs.tree_pids(scope.cgroup_dir)),
                         sources, warnings, others, list(reads.problems), probing, scanned=False)
    holders = sorted(view.holders.values(), key=lambda h: h.host_pid)
    return Discovery(holders, scope.running, view.init_pid, len(view.tree), sources, warnings,
                     others, list(reads.problems), probing, view=view)


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


def _merge_probe(run: Run, disc: Discovery, wait: float = 0.0) -> list[Holder]:
    """Merge the probe if it has arrived (or arrives within `wait`); returns holders only it
    saw. A probe still running stays pending."""
    proc = disc.probe
    if proc is None or not proc.pump(wait):  # drained as it comes: it may write a lot
        return []
    disc.probe = None
    from pveclean.proxmox.probe import finish_probe  # imported when the probe was started
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
        got = run.reads.call(w_make_holders, found, run.scope, end=run.deadline.work_end,
                             what="probe holders")
        return got if isinstance(got, list) else []

    warnings, new = merge_probe(disc.view, result, run.scope, make)
    disc.warnings += warnings
    return new


def _drop_probe(disc: Discovery, why: Source) -> None:
    """Kill a probe still running, its whole process group, unread (PctReader.abandon)."""
    if disc.probe is not None:
        probing, disc.probe = disc.probe, None
        disc.sources["probe"] = why
        probing.abandon()


def _signal_round(run: Run, targets: list[Holder], term: bool) -> float | None:
    """Prove and stop one round's targets, frozen (the freezer's protocol); when (monotonic)
    the last of them exited, None if none did."""
    from pveclean.host import pidfds  # its proofs and records: for a stop only
    reads, scope, end = run.reads, run.scope, run.deadline.work_end
    last_exit: float | None = None
    run.freezer.hold([h.host_pid for h in targets])  # a v1-frozen target thawed first
    batch = pidfds.fd_budget()
    for i in range(0, len(targets), batch):  # one batch unless the hard limit is low
        proven, rejected = pidfds.prove_all(
            targets[i:i + batch], lambda hs: reads.identities(hs, scope, end))
        for h, why in rejected:
            h.outcome = why.outcome
            h.signals.append(why.note)
        if proven:
            exited = pidfds.stop(
                proven, run.grace if term else None, end, run.opts.progress,
                releasewatch.describer(run), run.freezer.set, run.cfg.release_seconds)
            if exited is not None:
                last_exit = max(last_exit or exited, exited)
    return last_exit


def _verify(run: Run, disc: Discovery, loop: Loop) -> tuple[policy.Decision, list[Holder]]:
    """Looks, each decided by core/policy.py, until a step other than POLL or FULL_LOOK: that
    decision and the holders to chase next. The tree is frozen as host/freezer.py says."""
    from pveclean.core import policy
    from pveclean.core.policy import Step
    reads, scope, end = run.reads, run.scope, run.deadline.work_end
    limits = policy.Limits(run.cfg.chase_rounds, end, partial_looks=bool(loop.quiet))
    chase: list[Holder] = []
    while True:
        chase += _late_holders(run, disc, loop)
        late = policy.late_chase(len(chase), run.deadline.expired())
        if late is not None:
            return late, chase
        partial = not loop.at.full  # every look frozen: the settling one reads everyone
        rescan = reads.rescan(scope, loop.known, end, loop.quiet if partial else None,
                              disc.scanned, run.freezer.hold)
        look, new = policy.look_at(rescan, loop.handled)
        d, at = policy.decide(look, loop.at, limits, expired=run.deadline.expired(),
                              now=run.deadline.clock())
        if d.step is Step.CHASE:
            return d, new
        if d.step is Step.RESPAWNED:  # they keep coming back: report them
            parents = _parents(run, new)
            for h in new:
                h.outcome, h.respawned_by = Outcome.SURVIVED, parents.get(h.ppid)
                h.note(f"appeared after the last of {run.cfg.chase_rounds} rounds; "
                       "not signalled")
                loop.add(h)
        if d.step not in (Step.POLL, Step.FULL_LOOK):
            return d, []  # frozen still after a partial look: the next round holds anyway
        run.freezer.release()
        loop.at = at
        if d.step is Step.POLL:
            time.sleep(d.wait)


def stop_and_verify(run: Run, disc: Discovery) -> Stopped:
    """Stop the holders, verify, chase new ones for `chase_rounds` rounds: the parent holds the
    pidfds and signals; core/policy.py (imported here: a run that stops nothing needs none)
    decides each step; host/freezer.py's protocol says when the tree is held."""
    from pveclean.core import policy
    from pveclean.core.policy import Step
    from pveclean.core.stopping import Loop, Stopped
    loop = Loop(list(disc.holders), {h.identity for h in disc.holders}, set(),
                 policy.known_idle(disc.view), policy.Verifying())
    targets = [h for h in loop.holders if not h.protected]
    last_exit: float | None = None
    term = True
    while True:
        exited = _signal_round(run, targets, term)
        if exited is not None:
            last_exit = max(last_exit or exited, exited)
        loop.known = {h.host_pid for h in loop.holders}
        d, chase = _verify(run, disc, loop)
        if d.step not in (Step.CHASE, Step.LATE_CHASE):
            # how long verification took after the last holder was gone (pidfd readable)
            verify_s = None if last_exit is None else round(time.monotonic() - last_exit, 3)
            return Stopped(loop.holders, d.verified, loop.at.rounds_used, last_exit, verify_s)
        term = policy.gets_grace(d, len(chase), len(targets))
        loop.at = policy.after(loop.at, d)
        if not term:
            for h in chase:
                h.note(policy.NO_GRACE)
        run.say(f"round {loop.at.rounds_used}: {len(chase)} new holder(s) appeared; "
                "stopping them")
        parents = _parents(run, chase)
        for h in chase:
            h.round = loop.at.rounds_used
            h.respawned_by = parents.get(h.ppid)
            loop.add(h)
        targets = chase


def _late_holders(run: Run, disc: Discovery, loop: Loop) -> list[Holder]:
    """The late probe's new holders to chase; its protected ones are recorded as such."""
    chase = []
    for h in (h for h in _merge_probe(run, disc) if h.identity not in loop.handled):
        if h.protected:
            h.outcome = Outcome.PROTECTED
            loop.add(h)
        else:
            chase.append(h)
    return chase


def _parents(run: Run, hs: list[Holder]) -> dict[int, str]:
    ppids = sorted({h.ppid for h in hs})
    return run.reads.call(w_parents, ppids, end=run.deadline.work_end, what="parents") or {}


def clean(vmid: int, cfg: Config, worker: Worker, opts: RunOptions = RunOptions(),
          deadline: Deadline | None = None, scan: Worker | None = None) -> RunResult:
    """One run. A cleanup holds the container's lock (a second one reports `busy`); a dry run
    only reads and takes no lock. One deadline covers the run, the lock wait included; it
    keeps reserve_for(cfg) back for the report. `worker`: NVML's (host/prelude.py); `scan`: the
    caller's for the run's reads, left open for its report (finish's writer), else the run's."""
    started = time.time()
    deadline = (deadline or start_deadline(cfg.deadline_seconds)).keeping(reserve_for(cfg))
    raise_open_files_limit()
    with contextlib.ExitStack() as own:  # the run's reads of /proc and /etc/pve
        scan = scan or own.enter_context(Worker())
        asked = Asked(vmid, cfg, opts, read_ct_config(cfg, vmid, scan, deadline), deadline, started)
        if opts.dry_run:
            res = _clean(asked, worker, scan)
        else:
            from pveclean.host.lock import Busy, container_lock  # a dry run takes no lock
            wait = min(cfg.lock_wait_seconds, deadline.work_left())
            try:
                with container_lock(cfg.state_dir, vmid, wait, f"{opts.phase} run"):
                    res = _clean(asked, worker, scan)
            except Busy as exc:
                busy = busy_report(stamp(started, time.time() - started), vmid, opts.phase,
                                   opts.dry_run, asked.ctconf.gpu_lines(), str(exc))
                res = finish(busy, cfg, opts.write_report, deadline, scan)
        res.ctconf = asked.ctconf
        return res


def read_ct_config(cfg: Config, vmid: int, wk: Worker, deadline: Deadline) -> pveconf.CtConfig:
    """The container's config, read in the worker: /etc/pve is pmxcfs, a FUSE file system,
    and a pmxcfs that stopped answering must not hold a run past its deadline."""
    left = max(deadline.work_left(), 0.05)
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


def _clean(asked: Asked, nvml: Worker, scan: Worker) -> RunResult:
    """The run under its lock (a dry run: none): its scope, reads and freezer, then act and
    report. `idle`: the container's cgroup tree is empty, so NVML is not asked at all."""
    cfg, vmid, dry_run = asked.cfg, asked.vmid, asked.opts.dry_run
    scope = make_scope(vmid, cfg, asked.ctconf, asked.opts.only)
    idle = cgroupfs.nothing_left(scope.cgroup_dir, scope.running)
    with Reads(nvml, asked.deadline, stall_for(cfg), not idle,
               Nvml.for_run(cfg.nvml_library, cfg.deadline_seconds).timeout, scan) as reads:
        fz = Freezer(scope.cgroup_dir, cfg.state_dir, vmid, not (dry_run or idle),
                     "not used: a dry run changes nothing (its tree was read while it ran)"
                     if dry_run else "not needed: container stopped, its cgroup tree is empty")
        run = asked.running(scope, reads, fz)
        with fz:  # thawed on every way out; a run that dies: freezer.py
            disc = _found(run, idle)
            unit_stops = _stop_units(run, disc)
            stopped = _stop(run, disc)
        return _conclude(run, disc, unit_stops, stopped, idle)


def _found(run: Run, idle: bool) -> Discovery:
    """Discover (GPU memory `before` is read with the host scan: run.reads.before)."""
    disc = discover(run)
    disc.warnings += run.ctconf.unapplied()  # lines Proxmox does not apply either
    if idle:
        disc.sources["nvml"] = Source(State.NOT_RUN, "not needed: container stopped, its "
                                      "cgroup tree is empty")
    run.found(len(disc.holders))
    return disc


def _stop_units(run: Run, disc: Discovery) -> UnitStops | None:
    """Stop the holders' units first, when asked (None: not asked)."""
    if not run.opts.stop_units:
        return None
    from pveclean.proxmox import guestunits  # asked for (or holders found) only
    run.freezer.release()  # systemctl runs in the container
    return guestunits.before_stop(run.vmid, run.cfg, run.scope, disc, run.deadline,
                                  run.opts.dry_run, run.opts.progress)


def _stop(run: Run, disc: Discovery) -> Stopped | None:
    """Stop and verify (a dry run: mark only); None when no stop loop ran (a dry run, or
    nothing to stop)."""
    if run.opts.dry_run:
        for h in disc.holders:
            h.outcome = Outcome.PROTECTED if h.protected else Outcome.WOULD_STOP
        return None
    if not disc.holders:
        return None
    for h in disc.holders:
        if h.protected:
            h.outcome = Outcome.PROTECTED
    return stop_and_verify(run, disc)


def _conclude(run: Run, disc: Discovery, unit_stops: UnitStops | None,
              stopped: Stopped | None, idle: bool) -> RunResult:
    """Thawed: the verdict, the freezer's and the probe's last word, GPU memory after, the
    report."""
    reads, before = run.reads, run.reads.before
    holders = disc.holders if stopped is None else stopped.holders  # no loop: as found
    so_far = (Verdict.DRY_RUN if run.opts.dry_run else Verdict.NOTHING_TO_DO if stopped is None
              else verdicts.after_stop(stopped.verified, [h.outcome for h in stopped.holders]))
    disc.sources["freeze"] = Source(State.OK if run.freezer.holds else State.NOT_RUN,
                                    run.freezer.summary())
    disc.warnings += run.freezer.warnings
    if disc.probe is not None:
        late = (Source(State.NOT_RUN, "not waited for: the host view and NVML found nothing "
                       "to clean") if not holders else
                Source(State.LATE, f"late: not finished when the run ended "
                       f"({run.deadline.elapsed():.2f} s); its findings were not used"))
        _drop_probe(disc, late)
    asked = not (run.opts.dry_run or idle) and (disc.scanned or bool(holders))
    after, released = releasewatch.after_stop(run, disc, stopped, asked)
    problems = list(dict.fromkeys(reads.problems))
    unjudged = releasewatch.unjudged(reads, disc, so_far)  # never `clean` (issue 38)
    errors, verdict = [*problems, *unjudged], verdicts.with_problems(so_far, problems)
    if reads.nvml_error and not idle and disc.sources["nvml"].ok:
        errors.append(reads.nvml_error)
    found = Findings(verdicts.with_unjudged(verdict, unjudged), holders, disc, before, after,
                     0 if stopped is None else stopped.rounds, errors,
                     None if stopped is None else stopped.verify_s, len(reads.killed))
    rep = build_report(stamp(run.started, run.deadline.elapsed()), run.vmid, run.opts.phase,
                       run.opts.dry_run, found, run.ctconf.gpu_lines(), run.cfg
                       ).with_release(released)
    last_exit = None if stopped is None else stopped.last_exit
    if unit_stops is not None or holders:  # else there is nothing to say of units
        from pveclean.proxmox import guestunits  # not for a run that found nothing
        if run.opts.phase == "manual" and last_exit is not None:
            # a stopping container's units stop with it: hooks do not wait for restarts
            guestunits.await_restarts(holders, run.scope.cgroup_dir.parent.parent,
                                      min(last_exit + RESTART_WATCH, run.deadline.work_end))
        rep = guestunits.annotate(rep, run.scope, unit_stops, run.deadline.end)
    rep = rep.timed(run.deadline.elapsed())  # the real duration: units' walks came after
    return finish(rep, run.cfg, run.opts.write_report, run.deadline, reads.worker)


REPORT_WAIT = 0.5  # s: writing the report may take at least this, even at the deadline


def _write_report(rep: Report, cfg: Config) -> str:
    """In a worker (a report dir or metrics file on a hung NFS mount blocks here, not in the
    run): publish first, naming the file about to be written, so that what could not be
    logged or written as metrics is recorded in the report itself; then write, prune."""
    from pveclean.host import notify, reportfiles  # a run that writes: not a dry run's
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
    if write_report:  # its GPU faults; kmsg and the report writer: not a dry run's imports
        from pveclean.host import kmsg, notify, reportfiles
        rep = kmsg.with_xids(rep, cfg.state_dir)
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
    notify.publish(rep, None if spare is None else str(spare), cfg.syslog, cfg.syslog_socket,
                   None, cfg.journal_socket)  # syslog only: metrics would block on that fs
    return RunResult(rep, None, max(code, ExitCode.REPORT), why, spare=spare)
