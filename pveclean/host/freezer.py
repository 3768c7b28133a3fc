"""Holding a container's tree still while pveclean reads it and decides and sends signals.

The protocol is Freezer's docstring; docs/security.md, "A tree that holds still", points here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from pveclean.host import cgroupfs

FREEZE_WAIT = 0.1  # s a freeze waits for "frozen 1" before the run goes on without it


def record_path(state_dir: str, vmid: int) -> Path:
    return Path(state_dir) / "frozen" / str(vmid)


def recover(state_dir: str, vmid: int, cgroup_dir: Path) -> str | None:
    """Thaw the container if an earlier run froze it and died before it thawed (its record is
    still there); the warning to report, or None. Only this container's cgroup is thawed,
    whatever the record says."""
    path = record_path(state_dir, vmid)
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()[:200]
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read the freeze record {path}: {exc.strerror}"
    try:
        if cgroupfs.freeze_file(cgroup_dir) == "1":
            cgroupfs.set_frozen(cgroup_dir, False)
            what = "thawed now"
        else:
            what = "it was not frozen any more"
    except OSError as exc:
        return f"an earlier run ({text}) left CT {vmid} frozen; thawing failed: {exc.strerror}"
    with contextlib.suppress(OSError):
        path.unlink()
    return f"an earlier run ({text}) froze CT {vmid} and did not end its run; {what}"


def _guard(cgroup_dir: Path, record: Path) -> tuple[int, int]:
    """Fork the guard: it waits on a pipe; EOF without a byte (the run died) -> thaw."""
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the guard: never returns
        code = 0
        try:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C to the group: the run thaws
            null = os.open(os.devnull, os.O_RDWR)
            for std in (0, 1, 2):
                os.dup2(null, std)  # never keeps the task log's pipe open
            os.closerange(3, r)  # above all the container lock's fd
            os.closerange(r + 1, os.sysconf("SC_OPEN_MAX"))
            said = b""
            while True:
                try:
                    chunk = os.read(r, 64)
                except InterruptedError:
                    continue
                if not chunk:
                    break
                said += chunk
            if not said:
                with contextlib.suppress(OSError):
                    cgroupfs.set_frozen(cgroup_dir, False)
                    record.unlink()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(r)
    return pid, w


class Freezer:
    """The freeze protocol: one Freezer per run, the one place that freezes and thaws.

    What: the cgroup v2 freezer (`cgroup.freeze`) of the container's host-owned level,
    `lxc/<vmid>` (cgroupfs.container_cgroup; on hybrid hosts under /sys/fs/cgroup/unified).
    It is hierarchical: the tenant's `ns/` below cannot thaw it (its `cgroup.freeze` only adds
    to ours). Frozen, no process of the container can fork, exit, hop to a fresh cgroup or
    pass an fd, so one walk sees one tree; SIGKILL still ends a frozen task (v2), so nothing
    waits for a thaw. hold() freezes (idempotent), release() thaws, set(on) is either (the one
    callback pidfds.stop takes); the context's exit thaws for good.

    Frozen (hold):
      * the host scan of discovery (reads.host calls hold() after NVML has answered: a slow
        NVML never lengthens a freeze);
      * while identities are proven and SIGTERMs sent (cleanup's round holds first);
      * while the SIGKILLs are decided and sent (pidfds.stop: set(True));
      * each verification look, the full one that settles a `clean` verdict (policy's
        FULL_LOOK) included: a process idle at discovery that opened a node during the grace
        while hopping between fresh cgroups, or a fork relay, is where the walk is only in
        a tree held still (reads.rescan calls hold() after NVML's answer).
    Thawed (release):
      * during the SIGTERM grace (a process exits cleanly only if it runs) and while SIGKILLed
        processes are awaited (pidfds.stop: set(False));
      * between looks;
      * before `--stop-units` runs systemctl in the container.
    A look that ends the loop or starts a chase round leaves the tree as it was: the next
    round holds anyway (hold() is idempotent), and the run's exit thaws.

    A freeze waits at most `wait` (FREEZE_WAIT, 0.1 s) for `cgroup.events` to say
    `frozen 1`: a task in uninterruptible sleep in a driver (or frozen by a v1 freezer) stops
    only when it leaves the kernel, maybe never. The run goes on, and summary() says the tree
    was read while that task could still move.

    Not frozen (`enabled` False, `why` says why, for the report's `sources.freeze`): a dry run
    (it changes nothing; a relay or hopper can hide from it), a stopped container whose tree
    is empty, a kernel without `cgroup.freeze`, a freeze that failed, and a container already
    frozen by someone else (`pct suspend`, a backup in suspend mode): left to its owner, never
    thawed by pveclean.

    Always thawed: on every way out of the run (the context manager: exceptions, Ctrl-C, the
    deadline, a killed worker; workers never hold the freeze). If pveclean itself dies while
    it holds a freeze (SIGKILL, the OOM killer), a guard process forked before the first
    freeze thaws when its pipe from the run closes without a word (it ignores SIGINT, SIGTERM,
    SIGHUP). If the guard dies too (the unit's cgroup SIGKILLed), a record,
    `<state_dir>/frozen/<vmid>`, written before the first freeze and removed after the last
    thaw, makes the next cleanup of that container thaw it first (recover) and say so in its
    warnings; until then `echo 0 > /sys/fs/cgroup/lxc/<vmid>/cgroup.freeze` thaws it. Only the
    container's own cgroup is ever thawed, whatever the record says.
    """

    def __init__(self, cgroup_dir: Path, state_dir: str, vmid: int, enabled: bool = True,
                 why: str = "", wait: float = FREEZE_WAIT) -> None:
        self.cgroup_dir, self.state_dir, self.vmid = cgroup_dir, state_dir, vmid
        self.enabled, self.why, self.wait = enabled, why, wait
        self.frozen = False
        self.holds = 0  # freezes made
        self.held_s = 0.0  # time frozen, all freezes together
        self.longest_s = 0.0  # the longest single freeze
        self.settle_s = 0.0  # the longest wait for "frozen 1"
        self.unsettled = 0  # freezes that did not reach "frozen 1" within `wait`
        self.warnings: list[str] = []
        self._since = 0.0
        self._guard: tuple[int, int] | None = None
        self._record: Path | None = None

    def __enter__(self) -> Freezer:
        if not self.enabled:
            return self
        left = recover(self.state_dir, self.vmid, self.cgroup_dir)
        if left:
            self.warnings.append(left)
        state = cgroupfs.freeze_file(self.cgroup_dir)
        if state is None:
            self.enabled, self.why = False, "unavailable: no cgroup.freeze (kernel before 5.2?)"
        elif state == "1":  # pct suspend, a backup in suspend mode: left to its owner
            self.enabled, self.why = False, "not used: the container was frozen already"
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def hold(self, signalled: Iterable[int] = ()) -> None:
        """Freeze (v2); the `signalled` PIDs' v1 freezer cgroups in the container's tree are
        thawed first (freezer_v1: a v1-frozen task waits out even SIGKILL), and said."""
        if signalled:
            from pveclean.host.freezer_v1 import thaw_in_tree  # a round's targets only
            self.warnings += thaw_in_tree(signalled, self.vmid)
        if not self.enabled or self.frozen:
            return
        if self._guard is None:
            self._start_guard()
        t0 = time.monotonic()
        try:
            cgroupfs.set_frozen(self.cgroup_dir, True)
        except OSError as exc:
            self.enabled, self.why = False, f"failed: {exc.strerror}"
            return
        self.frozen, self._since = True, t0
        self.holds += 1
        settled = cgroupfs.wait_frozen(self.cgroup_dir, self.wait)
        self.settle_s = max(self.settle_s, time.monotonic() - t0)
        self.unsettled += not settled

    def release(self) -> None:
        if not self.frozen:
            return
        try:
            cgroupfs.set_frozen(self.cgroup_dir, False)
        except OSError as exc:  # the cgroup went away (the container stopped): nothing held
            if exc.errno != errno.ENOENT:
                self.warnings.append(f"thawing CT {self.vmid} failed: {exc.strerror}")
        took = time.monotonic() - self._since
        self.held_s += took
        self.longest_s = max(self.longest_s, took)
        self.frozen = False

    def set(self, on: bool) -> None:
        """hold() or release(): the one callback pidfds.stop takes."""
        if on:
            self.hold()
        else:
            self.release()

    def close(self) -> None:
        self.release()
        if self._record is not None and not self.frozen:
            with contextlib.suppress(OSError):
                self._record.unlink()
            self._record = None
        if self._guard is not None and self._guard[1] >= 0:
            pid, w = self._guard
            self._guard = None
            with contextlib.suppress(OSError):
                os.write(w, b"done")
            os.close(w)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)

    def _start_guard(self) -> None:
        record = record_path(self.state_dir, self.vmid)
        try:
            record.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            record.write_text(f"PID {os.getpid()} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n",
                              encoding="utf-8")
            self._record = record
        except OSError as exc:
            self.warnings.append(f"cannot write the freeze record {record}: {exc.strerror}; "
                                 "a run killed while it holds a freeze relies on its guard")
        try:
            self._guard = _guard(self.cgroup_dir, record)
        except OSError as exc:  # out of processes: the record is what is left
            self._guard = (0, -1)
            self.warnings.append(f"no guard for the freeze ({exc.strerror}): a run killed "
                                 "while it holds one leaves the thaw to the next run")

    def summary(self) -> str:
        """For the report's sources: what the freezer did."""
        if not self.enabled and not self.holds:
            return self.why
        text = (f"frozen {self.holds} time(s), {self.held_s:.3f} s in all, the longest "
                f"{self.longest_s:.3f} s; the longest wait for every task to stop "
                f"{self.settle_s:.3f} s")
        if self.unsettled:
            text += (f"; {self.unsettled} time(s) not every task stopped within "
                     f"{self.wait:.2f} s (a task in uninterruptible sleep?): the tree was "
                     "read while that task could still move")
        if not self.enabled:
            text += f"; then {self.why}"
        return text
