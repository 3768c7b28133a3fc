"""Stopping: prove identity, signal through pidfds, escalate, and wait by polling pidfds.

A pidfd is opened first; then the process behind the PID is checked (same start time, still
in the container's cgroup tree, still holding a GPU device); then a null signal through the
pidfd proves it was alive across the check. From then on every signal goes through that pidfd,
so a PID recycled by another process can never be hit.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from pveclean.core import records, release
from pveclean.core.records import (
    GpuDevices,
    Holder,
    Sent,
    Sig,
)
from pveclean.core.stopping import NotProven, Rejection
from pveclean.core.verdicts import Outcome
from pveclean.host import cgroupfs, devnodes, procfs, worker


def fd_budget() -> int:
    """How many pidfds may be open at once: the open-file limit less what is open and a
    margin (pipes, the report, NVML's worker). Holders beyond it are stopped in batches."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    names = procfs.listdir(procfs.path("self", "fd"))
    used = 64 if names is None else len(names)
    return max(16, soft - used - 64)


@dataclass
class Target:
    """A holder to stop, through its pidfd."""

    holder: Holder
    pidfd: int
    exited_at: float | None = None


EXITED = Rejection(NotProven.EXITED, "exited before it was signalled")


def prove(holder: Holder, vmid: int, devices: GpuDevices, running: bool = True
          ) -> tuple[int | None, str]:
    """Open a pidfd for the holder if, and only if, it is still the same GPU holder."""
    try:
        fd = os.pidfd_open(holder.host_pid)
    except ProcessLookupError:
        return None, EXITED.text
    except OSError as exc:
        return None, f"pidfd_open failed: {exc.strerror}"
    reason = _check_identity(holder, vmid, devices, running)
    if reason is None:
        try:
            signal.pidfd_send_signal(fd, 0)
            return fd, "proven"
        except ProcessLookupError:
            reason = EXITED
        except OSError as exc:
            reason = Rejection(NotProven.PIDFD, f"pidfd signal check failed: {exc.strerror}")
    os.close(fd)
    return None, reason.text


def prove_all(
    holders: list[Holder],
    check: Callable[[list[Holder]], list[Rejection | None]],
) -> tuple[list[Target], list[tuple[Holder, Rejection]]]:
    """prove() for many: every pidfd is opened first, then `check` (the identity checks, run
    in the worker because they read /proc) says for each holder why not, or None; then a null
    signal through each pidfd proves the process lived across its check."""
    opened: list[tuple[Holder, int]] = []
    rejected: list[tuple[Holder, Rejection]] = []
    for h in holders:
        try:
            opened.append((h, os.pidfd_open(h.host_pid)))
        except ProcessLookupError:
            rejected.append((h, EXITED))
        except OSError as exc:
            rejected.append((h, Rejection(NotProven.PIDFD,
                                          f"pidfd_open failed: {exc.strerror}")))
    reasons = check([h for h, _fd in opened]) if opened else []
    targets: list[Target] = []
    for (h, fd), reason in zip(opened, reasons, strict=True):
        if reason is None:
            try:
                signal.pidfd_send_signal(fd, 0)
                targets.append(Target(h, fd))
                continue
            except ProcessLookupError:
                reason = EXITED
            except OSError as exc:
                reason = Rejection(NotProven.PIDFD,
                                   f"pidfd signal check failed: {exc.strerror}")
        os.close(fd)
        rejected.append((h, reason))
    return targets, rejected


def check_identities(holders: list[Holder], vmid: int, devices: GpuDevices, running: bool,
                     skip: frozenset[int] = frozenset(), stall: float | None = None
                     ) -> list[Rejection | None]:
    """_check_identity for each (in the worker: each PID announced first, see worker.py); a
    PID in `skip` hung in an earlier read and is not looked at again."""
    out: list[Rejection | None] = []
    for h in holders:
        if h.host_pid in skip:
            out.append(Rejection(NotProven.UNCHECKED,
                                 "reading its /proc files hung; not signalled"))
            continue
        worker.note(("pid", h.host_pid), stall)
        out.append(_check_identity(h, vmid, devices, running))
    return out


@dataclass(frozen=True)
class Described:
    """A process still there after its signals, as /proc shows it (in the worker)."""

    state: str | None = None
    wchan: str | None = None
    frozen: bool = False
    exiting: bool = False  # PF_EXITING or SIGKILL pending (procfs.exit_look)
    marks: release.Marks = (None, None, None, None)  # where an exit's progress shows

    @property
    def on_its_way_out(self) -> bool:
        """In the kernel's exit and not frozen: a frozen task makes no progress."""
        return self.exiting and not self.frozen


EXIT_LOOK = 0.25  # s between two looks at holders still there after their SIGKILL
EXITING_NOTE = ("in the kernel's exit when the run stopped waiting (PF_EXITING or SIGKILL "
                "pending): not a survivor; its GPU memory comes back once the kernel lets it go")


def describe(pids: list[int]) -> dict[int, Described]:
    """Processes still there after their signals (in the worker: /proc reads)."""
    out: dict[int, Described] = {}
    for pid in pids:
        worker.note(("pid", pid), None)
        st = procfs.read_status(pid)
        exiting, (rss, tasks, cpu) = procfs.exit_look(pid)
        out[pid] = Described(st.state if st else None, procfs.wchan(pid),
                             cgroupfs.frozen(pid), exiting,
                             (rss, tasks, cpu, None))  # NVML's MiB: the caller's
    return out


def await_exits(rest: list[Target], deadline_at: float, allowance_end: float,
                describe_fn: Callable[[list[int]], dict[int, Described] | None]
                ) -> dict[int, release.InExit]:
    """Wait for the SIGKILLed `rest` until they are gone or the deadline, looking every
    EXIT_LOOK at those still there: once every one left is in the kernel's exit and has made
    no progress for release.SETTLE_S (or the release allowance is spent), it waits no more.
    What each look saw of each (core/release.py)."""
    watch: dict[int, release.InExit] = {}
    while True:
        wait_exits(rest, min(deadline_at, time.monotonic() + EXIT_LOOK))
        stuck = [t.holder.host_pid for t in rest if t.exited_at is None]
        now = time.monotonic()
        if not stuck or now >= deadline_at:
            return watch
        info = describe_fn(stuck) or {}
        watch |= {pid: release.exit_step(watch.get(pid), d.on_its_way_out, d.marks, now)
                  for pid, d in info.items()}
        if release.exits_waited({p: watch[p] for p in stuck if p in watch}, now,
                                allowance_end):
            return watch


def _check_identity(holder: Holder, vmid: int, devices: GpuDevices, running: bool
                    ) -> Rejection | None:
    st = procfs.read_status(holder.host_pid)
    if st is None:
        return EXITED
    if st.starttime != holder.starttime:
        return Rejection(NotProven.REUSED, "PID was reused by another process; not signalled")
    if not records.in_tree(cgroupfs.pid_cgroup(holder.host_pid), vmid):
        return Rejection(NotProven.LEFT_TREE, "left the container's cgroup tree; not signalled")
    if len(st.nspid) < 2:
        return Rejection(NotProven.HOST_NAMESPACE, "in the host's PID namespace; not signalled")
    if running and st.nspid[1] == 1:
        return Rejection(NotProven.INIT, "is the container's PID 1; not signalled")
    if "host" in holder.sources or "probe" in holder.sources:
        holds = devnodes.still_holds(holder.host_pid, devices)  # or cannot be ruled out
        if not holds and "nvml" not in holder.sources:
            return Rejection(NotProven.NO_DEVICE, "no longer holds a GPU device; not signalled")
    return None


def wait_exits(targets: list[Target], until: float) -> None:
    """Block until every target has exited or `until` (monotonic) passes; no fixed sleeps."""
    poller = select.poll()
    by_fd: dict[int, Target] = {}
    for t in targets:
        if t.exited_at is None:
            poller.register(t.pidfd, select.POLLIN)
            by_fd[t.pidfd] = t
    while by_fd:
        left = until - time.monotonic()
        if left <= 0:
            return
        for fd, _ev in poller.poll(left * 1000):
            if fd in by_fd:
                by_fd.pop(fd).exited_at = time.monotonic()
                poller.unregister(fd)


def _send(t: Target, sig: Sig, t0: float) -> bool:
    at = time.monotonic() - t0
    try:
        signal.pidfd_send_signal(t.pidfd, signal.Signals[sig])
    except ProcessLookupError:
        t.exited_at = t.exited_at or time.monotonic()
        return False
    except OSError as exc:
        t.holder.signals.append(Sent(sig, at, error=str(exc.strerror)))
        return False
    t.holder.signals.append(Sent(sig, at))
    return True


def _outcome(t: Target, info: dict[int, Described], seen: release.InExit | None,
             after_term: float, killed_at: float) -> None:
    """What became of one target (its pidfd closed): gone after SIGTERM or SIGKILL, or still
    there, `exiting` (in the kernel's exit, not frozen) or `survived`; a holder seen in exit
    gets a line saying how long it took (core/release.py)."""
    h = t.holder
    if seen is not None and seen.exiting:
        h.note(release.exit_note(seen, killed_at, t.exited_at, time.monotonic()))
    if t.exited_at is None:
        d = info.get(h.host_pid, Described())
        h.outcome = Outcome.EXITING if d.on_its_way_out else Outcome.SURVIVED
        if d.on_its_way_out:
            h.note(EXITING_NOTE)
        h.state = d.state or h.state
        h.wchan = d.wchan
        h.frozen = h.frozen or d.frozen
    elif t.exited_at <= after_term and not any(s.signal is Sig.KILL for s in h.signals):
        h.outcome = Outcome.TERMINATED
    else:
        h.outcome = Outcome.KILLED
    os.close(t.pidfd)


def stop(
    targets: list[Target],
    grace: float | None,
    deadline_at: float,
    progress: Callable[[str], None] | None = None,
    describe_fn: Callable[[list[int]], dict[int, Described] | None] | None = None,
    hold: Callable[[bool], None] | None = None,
    allowance: float | None = None,
) -> float | None:
    """SIGTERM all at once, poll up to `grace`, SIGKILL the rest, poll until the deadline
    (await_exits: a holder in the kernel's exit is waited for while it makes progress, up to
    `allowance` s, release_seconds, after the first signal; never past `deadline_at`).
    Returns when (monotonic) the last of them exited, None if none did. `hold(on)` freezes
    (True) or thaws (False) the container's tree (host/freezer.py); it is called frozen:
    the grace runs thawed (a process exits cleanly only if it runs), the SIGKILLs are
    decided and sent frozen, their exits waited for thawed. `grace` None: SIGKILL at once,
    no SIGTERM and no grace (processes that multiply when asked to stop)."""
    hold = hold or (lambda _on: None)
    term = grace is not None
    grace = grace or 0.0
    watch: dict[int, release.InExit] = {}
    t0 = time.monotonic()
    termed = [t for t in targets if _send(t, Sig.TERM, t0)] if term else []
    if progress and termed:
        left = deadline_at - time.monotonic()
        progress(f"SIGTERM sent to {len(termed)}; waiting up to {min(grace, left):.1f} s for "
                 f"them to exit (deadline in {left:.1f} s)")
    if term:
        hold(False)
        wait_exits(targets, min(t0 + grace, deadline_at))
    after_term = time.monotonic()
    if term and any(t.exited_at is None for t in targets):
        hold(True)
    rest = [t for t in targets if t.exited_at is None]
    for t in rest:
        _send(t, Sig.KILL, t0)
    hold(False)
    if rest:
        if progress:
            progress(f"SIGKILL sent to {len(rest)} still running after the grace "
                     f"({', '.join(t.holder.name for t in rest[:5])}); waiting up to "
                     f"{deadline_at - time.monotonic():.1f} s")
        watch = await_exits(rest, deadline_at, t0 + (allowance if allowance is not None
                                                     else deadline_at), describe_fn or describe)
    stuck = [t.holder.host_pid for t in targets if t.exited_at is None]
    info = ((describe_fn or describe)(stuck) or {}) if stuck else {}
    killed_at = time.monotonic() if not rest else min(
        (t0 + s.at for t in rest for s in t.holder.signals if s.signal is Sig.KILL and
         s.at is not None), default=after_term)
    for t in targets:
        _outcome(t, info, watch.get(t.holder.host_pid), after_term, killed_at)
    exits = [t.exited_at for t in targets if t.exited_at is not None]
    return max(exits) if exits else None
