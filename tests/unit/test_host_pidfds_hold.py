"""pidfds.stop with the freezer's callback: SIGTERM sent frozen, the grace thawed, the
SIGKILLs decided and sent frozen, their exits awaited thawed; without `term`, SIGKILL only."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from pveclean.core.records import Holder, Sig
from pveclean.core.verdicts import Outcome
from pveclean.host import pidfds


def target(argv: list[str]) -> tuple[pidfds.Target, subprocess.Popen[bytes]]:
    p = subprocess.Popen(argv)
    h = Holder(host_pid=p.pid, starttime=0, ct_pid=None, name="sleep", exe=None, argv=(),
               uid=0, user="root", state="S", ppid=os.getpid(), cgroup="/lxc/129/ns")
    return pidfds.Target(h, os.pidfd_open(p.pid)), p


def _ignores_term(pid: int) -> None:
    """Wait until the shell's `trap '' TERM` is in place (SigIgn has SIGTERM's bit)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        for line in Path(f"/proc/{pid}/status").read_text().split("\n"):
            if line.startswith("SigIgn:") and int(line.split()[1], 16) & (1 << 14):
                return
        time.sleep(0.01)
    raise AssertionError("the shell did not ignore SIGTERM in 10 s")


def test_grace_thawed_kill_frozen() -> None:
    calls: list[bool] = []
    polite, p1 = target(["sleep", "30"])
    stubborn, p2 = target(["sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30"])
    _ignores_term(p2.pid)
    while Path(f"/proc/{p1.pid}/comm").read_text().strip() != "sleep":  # exec'd: TERM ends it
        time.sleep(0.01)
    pidfds.stop([polite, stubborn], 0.3, time.monotonic() + 5, hold=calls.append,
                describe_fn=lambda _pids: {})
    assert calls == [False, True, False]
    assert polite.holder.outcome is Outcome.TERMINATED
    assert stubborn.holder.outcome is Outcome.KILLED
    for p in (p1, p2):
        p.wait(5)


def test_no_term_is_sigkill_at_once_frozen() -> None:
    calls: list[bool] = []
    t, p = target(["sleep", "30"])
    pidfds.stop([t], None, time.monotonic() + 5, hold=calls.append,
                describe_fn=lambda _pids: {})
    assert calls == [False]  # frozen all along until the SIGKILLs are out
    assert [s.signal for s in t.holder.signals] == [Sig.KILL]
    assert t.holder.outcome is Outcome.KILLED
    p.wait(5)
