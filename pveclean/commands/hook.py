"""`pveclean hook VMID PHASE`: what the guest hookscript does in each Proxmox phase.

Lean on purpose (no typer, no proxmoxer): it runs on every container start and stop.
Proxmox gives hooks no timeout, so every phase is bounded by the config's deadline.
Only pre-start can fail a task (a non-zero exit aborts the start), and only by a decision:
ExitCode.REFUSE (see errors.py); the others always exit 0.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable

from pveclean.core.config import PHASES, Config
from pveclean.core.text import safe
from pveclean.core.verdicts import Verdict
from pveclean.errors import ConfigError, ExitCode, PvecleanError
from pveclean.host.configfile import load
from pveclean.host.prelude import NvmlWorker
from pveclean.proxmox import chain, pveconf

TYPE_CHECKING = False
if TYPE_CHECKING:  # each handler imports its run's modules: post-start, which has none, not
    from pveclean.cleanup import RunOptions
    from pveclean.core.amendments import Leak, PreStopBrief
    from pveclean.core.report import Report, RunResult
    from pveclean.proxmox import tasks

Sink = Callable[[str, str], None]  # (text, priority: info, warning or err)
_sink: Sink | None = None  # where a phase's lines go instead of stdout (the drop-in's journal)


def redirect(sink: Sink | None) -> None:
    """Send every line a phase says (and an unsaved report) to `sink` from now on."""
    global _sink
    _sink = sink


def say(text: str) -> None:
    if _sink is not None:
        _sink(text, "warning" if ": WARNING:" in text or "refusing" in text else "info")
        return
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _where(res: RunResult) -> str:
    if res.path:
        return f"report {res.path}"
    kept = f"; kept in {res.spare}" if res.spare else ""
    return f"report NOT written: {safe(res.report_error, 300)}{kept}"




def logged_run(vmid: int, phase: str, grace: float) -> RunOptions:
    """A hook phase's run, saying before it waits, so that the task log is not silent for up
    to the deadline: `stopping 6 GPU holder(s) of CT 129, grace 10 s ...` (from the count
    discovery tells, never read back from text), then rounds and unit stops as they come.
    Finding nothing says nothing (the outcome line follows at once)."""
    from pveclean.cleanup import RunOptions

    def tell(msg: str) -> None:
        say(f"pveclean: CT {vmid} {phase}: {safe(msg, 300)} ...")

    def found(holders: int) -> None:
        if holders:
            say(f"pveclean: CT {vmid} {phase}: stopping {holders} GPU holder(s) of CT "
                f"{vmid}, grace {grace:g} s ...")

    return RunOptions(phase=phase, write_report=False, progress=tell, on_found=found)


def pre_stop(vmid: int, cfg: Config, nvml: NvmlWorker) -> int:
    """A stop that kills the container (pct stop, destroy, rollback): its GPU holders get
    their grace now. Any other stop (a shutdown, reboot, backup or migration, or no task
    known) is the guest's to do: the holders are recorded and post-stop cleans what it
    leaves (proxmox/tasks.py)."""
    from pveclean.cleanup import clean, finish
    from pveclean.core.release import leaked
    from pveclean.host.clock import start_deadline
    from pveclean.proxmox import tasks
    task = tasks.running_task()
    if task is None or not task.kills:
        return _pre_shutdown(vmid, cfg, nvml, task)
    deadline = start_deadline(cfg.deadline_seconds)
    res = clean(vmid, cfg, nvml.warm(cfg, vmid),
                logged_run(vmid, "pre-stop", cfg.grace_seconds), deadline)
    rep = res.report
    if rep.verdict == Verdict.NOTHING_TO_DO and not cfg.report_nothing_to_do:
        say(f"pveclean: CT {vmid} pre-stop: no GPU holders ({rep.duration_s:.2f} s); no "
            "report (report_nothing_to_do: false)")
        return 0
    res = finish(rep, cfg, deadline=deadline)
    if rep.busy:
        return _busy(vmid, "pre-stop", res)
    s = rep.summary
    dur = rep.duration_s
    if rep.verdict == Verdict.NOTHING_TO_DO:
        say(f"pveclean: CT {vmid} pre-stop: no GPU holders ({dur:.2f} s); {_where(res)}")
    elif rep.verdict == Verdict.CLEAN:
        say(f"pveclean: CT {vmid} pre-stop: stopped {s.stopped} GPU holders "
            f"({s.freed_mib} MiB freed) in {dur:.1f} s; {_where(res)}")
    elif rep.verdict == Verdict.NOT_JUDGED:  # issue 38: not clean, nothing remains
        say(f"pveclean: WARNING: CT {vmid} pre-stop: stopped {s.stopped} GPU holders, but "
            f"NVML did not answer for their memory (not judged): {_not_judged(rep)}; "
            f"{_where(res)}")
    elif rep.verdict == Verdict.LEAKED and not rep.remaining():  # issue 38: not "REMAIN"
        stuck = "; ".join(r.line() for r in leaked(rep.release))
        say(f"pveclean: WARNING: CT {vmid} pre-stop: stopped {s.stopped} GPU holders, but "
            f"their memory stayed allocated: {stuck}; {_where(res)}")
    else:
        left = rep.remaining()
        names = ", ".join(f"PID {h.host_pid} {safe(h.name, 16)} ({h.outcome}, "
                          f"state {safe(h.shown_state, 4)})" for h in left[:5])
        why = f": {names}" if left else f" or cannot be ruled out: {_first_error(rep)}"
        say(f"pveclean: WARNING: CT {vmid} pre-stop: {rep.remaining_count()} GPU holder(s) "
            f"REMAIN after "
            f"{dur:.1f} s{why}; GPU memory may stay allocated; {_where(res)}")
    _unsaved(res)
    return 0


def _pre_shutdown(vmid: int, cfg: Config, nvml: NvmlWorker, task: tasks.Task | None) -> int:
    """Record what holds GPUs as the guest begins its own shutdown; signal nothing."""
    from pveclean.cleanup import RunOptions, clean, finish
    from pveclean.host.clock import start_deadline
    from pveclean.host.worker import Worker

    deadline = start_deadline(cfg.deadline_seconds)
    what = f"a {task.type} task" if task is not None else "no Proxmox task known"
    with Worker() as scan:  # the run's reads, then its report's writer (no second fork)
        res = clean(vmid, cfg, nvml.warm(cfg, vmid), RunOptions(
            phase="pre-stop", dry_run=True, write_report=False), deadline, scan)
        rep = res.report.deferred(
            f"clean shutdown ({what}): holders recorded, not signalled; the guest shuts them "
            "down, and post-stop stops and reports whatever it leaves")
        res = finish(rep, cfg, deadline=deadline, writer=scan)
    n = len(rep.holders)
    say(f"pveclean: CT {vmid} pre-stop: clean shutdown ({what}): {n} GPU holder(s) left "
        f"to the guest; post-stop cleans what remains; {_where(res)}")
    _unsaved(res)
    return 0


def _first_error(rep: Report) -> str:
    errors = rep.errors or ["unknown"]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{safe(errors[0], 300)}{more}"


def _unsaved(res: RunResult) -> None:
    """A report that could not be written goes to stderr (the task log), cut to
    bounds.UNSAVED_SHOWN characters; the whole one is in the spare file finish() wrote and
    named in syslog."""
    from pveclean.host import reportfiles
    if res.report_error:
        text = ("--- pveclean report (not saved) ---\n"
                + reportfiles.unsaved_text(res.report, res.spare))
        if _sink is not None:
            _sink(text, "err")
            return
        sys.stderr.write(text)
        sys.stderr.flush()


def _last_report(cfg: Config, vmid: int, phase: str, max_age: float) -> Report | None:
    """The last report of `phase` on this container, written within `max_age` s, typed
    (reportfiles.load_report); None when there is none or it cannot be read."""
    from pveclean.host import reportfiles
    path = reportfiles.latest(cfg.report_dir, vmid, phase, max_age, time.time())
    try:
        return reportfiles.load_report(path) if path is not None else None
    except (OSError, reportfiles.ReportError):
        return None


def _container_minors(ctconf: pveconf.CtConfig | None) -> set[int]:
    """N of each host /dev/nvidiaN the container's config (as the run read it) passes
    through, wherever it lands inside; empty when it grants every GPU or none is known (the
    leak check then looks at the GPUs the pre-stop report saw in use, else at all)."""
    minors = ctconf.gpu().minors if ctconf is not None else None
    return set(minors or ())


def _pre_stop_config(pre: Report | None, vmid: int) -> pveconf.CtConfig | None:
    """The container's GPU lines as the pre-stop run of this stop read them (the config
    before post-stop's pending changes were applied), read as Proxmox's config syntax."""
    if pre is None:
        return None
    return pveconf.parse_config("\n".join(pre.container.gpu_config), vmid)


def _brief(pre: Report | None) -> PreStopBrief | None:
    """What a post-stop's report says of the pre-stop run."""
    from pveclean.core.amendments import PreStopBrief

    if pre is None:
        return None
    return PreStopBrief(pre.start, str(pre.verdict), pre.summary.freed_mib)


def post_stop(vmid: int, cfg: Config, nvml: NvmlWorker, via: str | None = None) -> int:
    """The container's processes are gone: is the GPU memory they had released?
    NVML is asked in the run's worker, within the run's deadline (see worker.py). `via`:
    what ran it, in its report, when not the hookscript (the systemd drop-in)."""
    from pveclean.cleanup import RunOptions, clean, finish, reserve_for
    from pveclean.core.discovery import stall_for
    from pveclean.core.gpufaults import unchecked
    from pveclean.core.report import find_leaks
    from pveclean.core.reportread import gpus_used  # post-stop's alone: not on every start
    from pveclean.host import releasewatch
    from pveclean.host.clock import start_deadline
    from pveclean.host.nvml import Nvml
    from pveclean.host.runreads import Reads
    from pveclean.host.worker import Worker
    from pveclean.proxmox import startrecord

    deadline = start_deadline(cfg.deadline_seconds)
    with Worker() as scan:  # the run's reads, then its report's writer (no second fork)
        # its settings, no init for a stopped container; closed once NVML has answered, before
        # the report is written
        with nvml.warm(cfg, vmid) as wk:
            res = clean(vmid, cfg, wk, RunOptions(phase="post-stop", write_report=False),
                        deadline, scan)
            rep = res.report.ran_by(via)
            if rep.busy:
                return _busy(vmid, "post-stop", res)
            pre = _last_report(cfg, vmid, "pre-stop", max_age=3600)
            leaks: list[Leak] = []
            end = deadline.keeping(reserve_for(cfg)).work_end
            with Reads(wk, deadline, stall_for(cfg), True,
                       Nvml.for_run(cfg.nvml_library, cfg.deadline_seconds).timeout) as reads:
                memory = reads.memory(end)
                procs = reads.processes(end) if memory is not None else None
            if memory is None or procs is None:  # not judged: never clean (issue 38)
                rep = rep.with_unjudged([f"post-stop memory check skipped: {reads.nvml_error}"])
            else:
                ran_with = (startrecord.started_with(cfg, vmid) or _pre_stop_config(pre, vmid)
                            or res.ctconf)
                grant = ran_with.gpu() if ran_with is not None else None
                if grant is None or grant.any or grant.allow_all:  # else it had no GPU to leak
                    minors = _container_minors(ran_with)
                    used = gpus_used(pre) if pre else set()  # memory still falling: waited for
                    leaks, memory, procs = releasewatch.settled_leaks(  # (reads' NVML session)
                        reads, (memory, procs), end, lambda m, p: find_leaks(m, p, minors, used))
                    # a GPU NVML could not answer for: not judged, never clean
                    rep = rep.with_unjudged(unchecked(memory, procs, minors))
        rep = rep.with_leaks(leaks, _brief(pre))
        res = finish(rep, cfg, deadline=deadline, writer=scan)
    _unsaved(res)
    if rep.verdict == Verdict.LEAKED:
        desc = ", ".join(f"GPU {x.index} {x.unaccounted_mib} MiB" for x in leaks)
        say(f"pveclean: CT {vmid} post-stop: leaked {desc}; see {res.path}")
    elif rep.verdict == Verdict.RESIDUAL:
        say(f"pveclean: CT {vmid} post-stop: GPU holders remain; see {res.path}")
    elif rep.verdict == Verdict.NOT_JUDGED:
        say(f"pveclean: WARNING: CT {vmid} post-stop: GPU memory not judged (NVML did not "
            f"answer for it): {_not_judged(rep)}; see {res.path}")
    return 0


def _not_judged(rep: Report) -> str:
    """Why a run's memory was not judged, in one line: its first reason and how many more."""
    from pveclean.core.release import not_judged
    reasons = [r.line() for r in not_judged(rep.release)] or rep.errors or [
        w for w in rep.warnings if "not judged" in w or "not checked" in w
        or "check skipped" in w] or ["unknown"]
    more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
    return f"{safe(reasons[0], 300)}{more}"


def _busy(vmid: int, phase: str, res: RunResult) -> int:
    errors = safe("; ".join(res.report.errors), 300)
    say(f"pveclean: WARNING: CT {vmid} {phase}: skipped, {errors}; {_where(res)}")
    return 0


def pre_start(vmid: int, cfg: Config, nvml: NvmlWorker, via: str | None = None) -> int:
    """`nvml` was not forked ahead: a start asks NVML nothing unless something is left (see
    prelude.forks_early). `via`: as post_stop's."""
    from pveclean.cleanup import cgroup_root, clean, finish
    from pveclean.commands.doctor import prestart  # (a start with a mismatch: a warning)
    from pveclean.host import cgroupfs
    from pveclean.proxmox import startrecord
    prestart(vmid, cfg, say)
    res = clean(vmid, cfg, nvml.warm(cfg, vmid),
                logged_run(vmid, "pre-start", cfg.grace_seconds))
    if res.ctconf is not None:
        startrecord.write(cfg, vmid, res.ctconf.gpu_lines(), by_hook=via is None)
    rep = res.report.ran_by(via)
    if rep.busy:
        res = finish(rep, cfg)
        return _busy(vmid, "pre-start", res)  # not knowing is no reason to refuse
    if not rep.container.running:
        # Leftover cgroups of an earlier run make lxc-start fail; empty ones can go.
        removed = cgroupfs.remove_empty_cgroups(cgroupfs.container_cgroup(cgroup_root(cfg), vmid))
        if removed:
            rep = rep.with_removed_cgroups(removed)
    if rep.verdict == Verdict.NOTHING_TO_DO and not rep.removed_cgroups:
        return 0
    res = finish(rep, cfg)
    _unsaved(res)
    if rep.verdict == Verdict.NOTHING_TO_DO:
        return 0
    if rep.verdict == Verdict.CLEAN:
        say(f"pveclean: CT {vmid} pre-start: stopped {rep.summary.stopped} leftover GPU "
            f"holder(s) of an earlier run; {_where(res)}")
        return 0
    left = rep.remaining()
    names = ", ".join(f"PID {h.host_pid} {safe(h.name, 16)} (state {safe(h.shown_state, 4)})"
                      for h in left[:5])
    if rep.verdict == Verdict.NOT_JUDGED and not left:  # not knowing: no reason to refuse
        say(f"pveclean: WARNING: CT {vmid} pre-start: stopped {rep.summary.stopped} leftover "
            f"GPU holder(s); NVML did not answer for their memory (not judged): "
            f"{_not_judged(rep)}; starting anyway; {_where(res)}")
        return 0
    if not left:  # nothing seen that stays: not knowing is no reason to refuse
        say(f"pveclean: WARNING: CT {vmid} pre-start: could not check every leftover process: "
            f"{_first_error(rep)}; starting anyway; {_where(res)}")
        return 0
    if cfg.pre_start_policy == "refuse":
        say(f"pveclean: CT {vmid} pre-start: refusing to start: {rep.remaining_count()} "
            "process(es) of an "
            f"earlier run still hold GPUs: {names}; {_where(res)}")
        return ExitCode.REFUSE
    say(f"pveclean: WARNING: CT {vmid} pre-start: {rep.remaining_count()} leftover process(es) "
        "still hold "
        f"GPUs: {names}; starting anyway (pre_start_policy: warn); {_where(res)}")
    return 0


HANDLERS = {"pre-stop": pre_stop, "post-stop": post_stop, "pre-start": pre_start}


def main(argv: list[str], nvml: NvmlWorker) -> int:
    """Never raises: every failure is one line in the task log. Only pre-start can return
    ExitCode.REFUSE (a decision); the shim turns every other non-zero status into a warning.
    `nvml`: the run's NVML worker, made by __main__ (a pre-stop's or post-stop's forked
    before this module was imported, see prelude.py)."""
    phase = argv[1] if len(argv) == 2 else "?"
    try:
        return _main(argv, nvml)
    except KeyboardInterrupt:
        say(f"pveclean: hook {phase}: interrupted; nothing more done")
    except SystemExit as exc:  # a library calling sys.exit(): never a refusal
        say(f"pveclean: hook {phase}: stopped early (exit {exc.code}); nothing more done")
    except BaseException as exc:  # MemoryError, a bug: one line, never a traceback
        say(f"pveclean: hook {phase}: internal error: {type(exc).__name__}: {exc}")
    return 0


def _chained(vmid: int, phase: str, cfg: Config) -> int:
    """The chained hookscript's exit code; a failure to run it is reported, not fatal."""
    try:
        return chain.run_chained(vmid, phase, cfg)
    except Exception as exc:
        say(f"pveclean: CT {vmid} {phase}: chained hookscript not run: "
            f"{type(exc).__name__}: {exc}")
        return 0


def _main(argv: list[str], nvml: NvmlWorker) -> int:
    if len(argv) != 2:  # a usage error on stderr, as every command's (the task log has both)
        sys.stderr.write("pveclean: usage: pveclean hook VMID PHASE (see 'pveclean hook -h')\n")
        return ExitCode.USAGE
    try:
        vmid = pveconf.parse_vmid(argv[0])
    except PvecleanError as exc:
        sys.stderr.write(f"pveclean: {exc}\n")
        return ExitCode.USAGE
    phase = argv[1]
    if phase not in PHASES:
        say(f"pveclean: CT {vmid}: unknown hook phase '{phase}'; nothing to do")
        return 0
    return _phase(vmid, phase, nvml)


def _phase(vmid: int, phase: str, nvml: NvmlWorker) -> int:
    try:
        cfg = load()
    except ConfigError as exc:
        # Without a usable config nothing is signalled; only a start could be harmed by
        # failing, and a broken pveclean config must not keep containers from starting.
        say(f"pveclean: CT {vmid} {phase}: config error, nothing done: {exc}")
        return 0
    # The chained script runs first, as it did before pveclean was installed; its own time is
    # not pveclean's: the run's deadline starts when it returns. A chained script that fails in
    # pre-start would have aborted the start under Proxmox: that stays a refusal.
    chained = _chained(vmid, phase, cfg)
    refused = phase == "pre-start" and chained != 0
    if refused:
        say(f"pveclean: CT {vmid} pre-start: refusing to start: the chained hookscript "
            f"exited {chained}")
    if not cfg.phase_enabled(phase) or phase not in HANDLERS:
        return ExitCode.REFUSE if refused else 0
    # `pct stop --overrule-shutdown` aborts a shutdown task with SIGTERM to its whole process
    # group, the hook's pveclean included (PVE::RESTEnvironment's kill_process_group; SIGKILL
    # after 5 s if the worker lives): pveclean's own phase ends by its deadline and writes its
    # report. Not the chained script's (it ran as Proxmox runs it), and restored after: an
    # ignored SIGTERM is inherited by whatever this process runs next.
    from pveclean.commands import xidhook  # a phase that runs: not post-start

    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    refused = xidhook.before_phase(vmid, phase, cfg, say) or refused  # issue 41: Xids
    try:
        code = HANDLERS[phase](vmid, cfg, nvml)
    except PvecleanError as exc:
        say(f"pveclean: CT {vmid} {phase}: {safe(exc, 300)}")
        code = 0
    except Exception as exc:  # a hook must never die with a traceback in the task log
        say(f"pveclean: CT {vmid} {phase}: internal error: {type(exc).__name__}: "
            f"{safe(exc, 300)}")
        code = 0
    finally:
        signal.signal(signal.SIGTERM, before)
    if phase == "pre-start" and (refused or code == ExitCode.REFUSE):
        return ExitCode.REFUSE
    return 0
