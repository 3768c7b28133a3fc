"""Trust, round three (issue 39), on lab containers: a GPU node kept open where no fd table
of the leader shows it (a thread's own fd table, an io_uring ring kept only by its mapping, a
fixed file whose path the holder's chroot shadows), and a process idle at discovery that
opens the node during the grace while hopping between fresh cgroups. Each ended `clean`
with the node still held on main before this; the hold is proven by the holder's fd or
mapping still being there after the run."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lxclab import Lab, v1_freezer_root
from tests.helpers import run_json, start_in_ct

GPU = "/dev/nvidia0"
PAD = 2000


def wait_until(cond: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.0005)
    return False


def test_a_thread_with_an_fd_table_of_its_own_is_stopped(lab: Lab, vmid: int) -> None:
    """unshare(CLONE_FILES) in a thread: the node is only in /proc/PID/task/TID/fd."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "hideout", [GPU, "--mode", "own-table"])
    (pid,) = w.host_pids(lab)
    assert not any(os.readlink(f"/proc/{pid}/fd/{fd}") == GPU
                   for fd in os.listdir(f"/proc/{pid}/fd"))  # the hiding place
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean", rep
    assert pid in [h["host_pid"] for h in rep["holders"]], rep["holders"]
    assert not lab.alive(pid)


def test_a_ring_kept_only_by_its_mapping_is_not_clean(lab: Lab, vmid: int) -> None:
    """The ring fd registered (IORING_REGISTER_RING_FDS) and closed: the ring, and the node
    registered with it, live on in its SQ mapping. The kernel shows its files through no fd:
    not judged, so `residual` naming it, never `clean` (it is not signalled: unproven)."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "hideout", [GPU, "--mode", "ring-map"])
    (pid,) = w.host_pids(lab)
    assert "anon_inode:[io_uring]" in Path(f"/proc/{pid}/maps").read_text()
    _code, rep = run_json(lab, vmid)
    assert rep["verdict"] == "residual", rep
    text = str(rep)
    assert f"PID {pid}" in text and "kept by its mapping" in text, rep
    assert lab.alive(pid)


def test_a_fixed_file_shadowed_by_the_holders_chroot_is_found(lab: Lab, vmid: int) -> None:
    """The ring lists /dev/nvidia0 as the kernel names it, from the top of the container's
    mount namespace; the holder chrooted into a tree with a plain file at that path."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "hideout", [GPU, "--mode", "chroot"])
    (pid,) = w.host_pids(lab)
    for _ in range(100):
        if os.readlink(f"/proc/{pid}/root").endswith("hideout-jail"):
            break
        time.sleep(0.02)
    assert os.readlink(f"/proc/{pid}/root").endswith("hideout-jail")
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean", rep
    (h,) = [h for h in rep["holders"] if h["host_pid"] == pid]
    assert any("io_uring fixed file" in d for d in h["devices"]), h
    assert not lab.alive(pid)


def test_a_late_hopper_is_caught_by_the_frozen_settling_look(lab: Lab, vmid: int) -> None:
    """Idle at discovery, it opens the node during the grace of another holder's SIGTERM
    while hopping between fresh cgroups. The verification looks skip it (idle before); the
    look that settles `clean` reads it, and now runs frozen, so it stands still there."""
    lab.create_ct(vmid, gpus=(0,))
    lab.write_config(probe=False)  # the tenant's shell answers the probe: it says nothing
    slow = lab.run_in_ct(vmid, "slowterm", hold=[GPU], term_delay_ms=1500)
    (slow_pid,) = slow.host_pids(lab)
    trigger = "/tmp/hopper-late"
    hop = lab.run_program(vmid, "hopper", ["--hold", GPU, "--late", trigger])
    (hop_pid,) = hop.host_pids(lab)
    pad = lab.cgroup(vmid) / "ns" / "pad"  # empty cgroups: a walk that lists, then reads,
    pad.mkdir()  # is slow enough that the hopper has always moved on
    for i in range(PAD):
        (pad / f"e{i}").mkdir()
    got: dict[str, Any] = {}

    def run() -> None:
        got["code"], got["rep"] = run_json(lab, vmid)

    t = threading.Thread(target=run)
    t.start()
    # discovery freezes the tree; the SIGTERM's grace (1.5 s) runs thawed: open it then
    freeze = lab.cgroup(vmid) / "cgroup.freeze"
    assert wait_until(lambda: freeze.read_text().strip() == "1", 20)
    assert wait_until(lambda: freeze.read_text().strip() == "0", 5)
    assert lab.alive(slow_pid)
    (lab.rootfs(vmid) / trigger.lstrip("/")).write_text("")
    t.join()
    rep = got["rep"]
    pids = [h["host_pid"] for h in rep["holders"]]
    assert slow_pid in pids, rep
    assert not lab.alive(hop_pid), rep  # before: `clean`, the hopper alive, holding
    assert hop_pid in pids and rep["verdict"] == "clean", rep


def test_a_holder_frozen_in_the_containers_v1_freezer_is_thawed_and_stopped(lab: Lab,
                                                                          vmid: int) -> None:
    """On a hybrid host the tenant freezes its holder in its own v1 freezer cgroup, where
    even SIGKILL waits for a thaw: it survived every run. It is thawed first, and said."""
    root = v1_freezer_root()
    if root is None:
        pytest.skip("no cgroup v1 freezer mounted on this host")
    lab.write_config(grace_seconds=0.3)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=[GPU], ignore_term=True)
    (pid,) = w.host_pids(lab)
    cg = root / "lxc" / str(vmid) / "ns" / "icebox"
    cg.mkdir(parents=True)
    try:
        (cg / "cgroup.procs").write_text(str(pid))
        (cg / "freezer.state").write_text("FROZEN")
        assert wait_until(lambda: (cg / "freezer.state").read_text().strip() == "FROZEN", 5)
        code, rep = run_json(lab, vmid)
        assert code == 0 and rep["verdict"] == "clean", rep
        assert not lab.alive(pid)
        assert any("v1 freezer cgroup" in w and "thawed" in w for w in rep["warnings"]), rep
    finally:
        (cg / "freezer.state").write_text("THAWED")
        for d in (cg, cg.parent, cg.parent.parent):
            with contextlib.suppress(OSError):
                for p in (d / "cgroup.procs").read_text().split():
                    (root / "cgroup.procs").write_text(p)
                d.rmdir()


def test_a_vm_start_is_refused_while_a_containers_process_is_not_judged(
        vm_host: Lab, vmid: int, vmid2: int) -> None:
    """The VM guard's map never takes the unread for innocent: a container's process whose
    ring (kept by its mapping) holds the VM's GPU where the kernel shows no file is a
    blocker naming it, and a `not judged` row in `gpus` (before: the start went on)."""
    from tests.harness import qm
    from tests.lab.test_vm_guard import make_vm

    lab = vm_host
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "hideout", [GPU, "--mode", "ring-map"])
    (pid,) = w.host_pids(lab)
    make_vm(lab, vmid2)
    res = qm.run(lab.root, "start", str(vmid2))
    assert res.returncode != 0, res.stdout + res.stderr
    assert f"CT {vmid}: PID {pid} could not be read whole" in res.stdout, res.stdout
    assert qm.run(lab.root, "status", str(vmid2)).stdout.strip() == "status: stopped"
    shown = lab.pveclean("gpus")
    assert "NOT JUDGED" in shown.stdout and str(pid) in shown.stdout, shown.stdout
    assert lab.alive(pid)
