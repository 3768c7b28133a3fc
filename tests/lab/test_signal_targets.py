"""Who gets a signal, on lab containers: never a recycled PID, a process that left the tree, or
a holder that dropped its GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from pveclean.core.config import Config
from pveclean.core.records import Scope
from pveclean.host import pidfds
from pveclean.host.devnodes import gpu_devices
from pveclean.host.procfs import read_status
from pveclean.host.procscan import scan_host
from tests.harness.lxclab import Lab


def _scope(lab: Lab, vmid: int) -> Scope:
    return Scope(vmid, lab.cgroup(vmid), gpu_devices([str(lab.root / "dev/nvidia*")]),
                 frozenset(Config().protect))


def _spawn_with_pid(target: int) -> subprocess.Popen[bytes] | None:
    """Start a host process that gets PID `target` (real PID reuse via ns_last_pid)."""
    for _ in range(20):
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(target - 1))
        p = subprocess.Popen(["sleep", "30"])
        if p.pid == target:
            return p
        p.kill()
        p.wait()
    return None


def test_recycled_pid_is_never_signalled(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    scope = _scope(lab, vmid)
    holder = scan_host(scope).holders[pid]  # discovered while it held the GPU
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while read_status(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_status(pid) is None, "container init did not reap the holder"
    # start times count in clock ticks (10 ms): let two pass so the new owner of the PID has
    # a start time of its own, as any PID recycled after a real cleanup does
    time.sleep(3 / os.sysconf("SC_CLK_TCK"))
    intruder = _spawn_with_pid(pid)
    if intruder is None:
        pytest.skip("could not get the same PID back (busy host)")
    try:
        fd, why = pidfds.prove(holder, vmid, scope.devices)
        assert fd is None and "reused" in why
        assert intruder.poll() is None  # the new owner of the PID lives
    finally:
        intruder.kill()
        intruder.wait()


def test_process_leaving_the_tree_is_not_signalled(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    scope = _scope(lab, vmid)
    holder = scan_host(scope).holders[pid]
    elsewhere = lab.cgroup(vmid).parent.parent / f"pveclean-test-{vmid}"
    elsewhere.mkdir()
    try:
        (elsewhere / "cgroup.procs").write_text(str(pid))
        fd, why = pidfds.prove(holder, vmid, scope.devices)
        assert fd is None and "cgroup tree" in why
        assert lab.alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 5
        while elsewhere.exists() and time.monotonic() < end:
            try:
                elsewhere.rmdir()
            except OSError:
                time.sleep(0.05)


def test_holder_that_dropped_its_gpu_is_not_signalled(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    scope = _scope(lab, vmid)
    holder = scan_host(scope).holders[pid]
    # the same process and start time, but it holds none of these devices any more
    fd, why = pidfds.prove(holder, vmid, gpu_devices([]))
    assert fd is None and "no longer holds" in why
    assert lab.alive(pid)
