"""Trust, round three (issue 39), io_uring on lab containers: a GPU node held only by a
request in flight (a pending poll whose fd was closed), and a registered fixed file whose
path a mount stacked over its directory, or a detached tree, makes lead elsewhere. Each
ended `clean` with the node still held before its protection; the hold is proven the
issue's way: the lock the holder took on the node is still in /proc/locks after the run."""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.lxclab import Lab
from tests.helpers import run_json, start_in_ct

GPU = "/dev/nvidia0"
POLLABLE = (1, 8)  # /dev/random: poll_wait()s and never raises POLLPRI|POLLMSG


def flock_held(pid: int, node: Path) -> bool:
    """/proc/locks lists a FLOCK lock of `pid` on `node`'s inode ("maj:min:ino")."""
    ino = os.stat(node).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if len(f) > 5 and f[1] == "FLOCK" and f[4] == str(pid) and f[5].endswith(f":{ino}"):
            return True
    return False


def pollable_gpu(lab: Lab) -> None:
    """nvidia0 becomes a node whose driver lets a poll wait (the lab's first candidates,
    /dev/full and the like, have no poll: POLL_ADD fails with EINVAL at once)."""
    node = lab.nodes["nvidia0"]
    node.unlink()
    os.mknod(node, 0o666 | 0o020000, os.makedev(*POLLABLE))
    os.chmod(node, 0o666)


def test_a_pending_poll_on_a_closed_fd_is_not_clean(lab: Lab, vmid: int) -> None:
    """IORING_OP_POLL_ADD on the node, then its fd closed: the request alone holds the file
    (and the holder's flock on it). The ring's fdinfo shows the request under "PollList:"
    as "op=6" without naming its file: not judged, so `residual` naming it, never `clean`."""
    pollable_gpu(lab)
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "hideout", [GPU, "--mode", "poll"])
    (pid,) = w.host_pids(lab)
    fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert GPU not in fds and "anon_inode:[io_uring]" in fds, fds
    assert flock_held(pid, lab.nodes["nvidia0"])
    _code, rep = run_json(lab, vmid)
    assert rep["verdict"] == "residual", rep  # before: nothing-to-do, the node held
    text = str(rep)
    assert f"PID {pid}" in text and "pending polls" in text, rep
    assert lab.alive(pid) and flock_held(pid, lab.nodes["nvidia0"])  # held through the run


def _ring_lists(pid: int, wanted: str) -> bool:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if (os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[io_uring]"
                    and f": {wanted}\n" in Path(f"/proc/{pid}/fdinfo/{fd}").read_text()):
                return True
        except OSError:
            continue
    return False


def test_a_fixed_file_under_a_stacked_mount_is_judged_by_its_device(lab: Lab,
                                                                    vmid: int) -> None:
    """The node is bind-mounted at /tmp/hideout-gpu/nvidia0, registered from there (its fd
    closed), and a tmpfs is mounted over /tmp/hideout-gpu with a plain file at that name:
    the ring lists /tmp/hideout-gpu/nvidia0, which now leads to the plain file. The
    container's mountinfo still lists the covered bind mount at that path: its file is
    looked up on the host and judged by its device number, a GPU node: the holder is
    stopped and the node freed (before: nothing-to-do, the node held)."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "hideout", [GPU, "--mode", "stacked"])
    (pid,) = w.host_pids(lab)
    assert _ring_lists(pid, "/tmp/hideout-gpu/nvidia0")
    assert flock_held(pid, lab.nodes["nvidia0"])
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean", rep
    (h,) = [h for h in rep["holders"] if h["host_pid"] == pid]
    assert any("/tmp/hideout-gpu/nvidia0" in d and "io_uring fixed file" in d
               for d in h["devices"]), h
    assert not lab.alive(pid) and not flock_held(pid, lab.nodes["nvidia0"])


def test_a_fixed_file_from_a_detached_tree_is_never_innocent(lab: Lab, vmid: int) -> None:
    """The container's /dev (Proxmox's `devN:` style: nodes made in its /dev tmpfs, not
    bind-mounted one by one) is bind-mounted at /tmp/hideout-det, the node registered from
    there (its fd closed) and the bind detached (umount -l); a plain file /nvidia0 is made:
    the ring lists /nvidia0 (the path from the detached tree's top), which leads to it.
    (A node bind-mounted by itself, LXC's way, is listed as "/" once detached: a directory,
    not judged already.)"""
    lab.create_ct(vmid, gpus=(0,), style="dev")
    w = start_in_ct(lab, vmid, "hideout", [GPU, "--mode", "detached"])
    (pid,) = w.host_pids(lab)
    assert _ring_lists(pid, "/nvidia0")
    node = Path(f"/proc/{pid}/root/dev/nvidia0")  # made by pct in the container's /dev
    assert flock_held(pid, node)
    _code, rep = run_json(lab, vmid)
    assert rep["verdict"] == "residual", rep  # before: nothing-to-do, the node held
    assert f"PID {pid}" in str(rep) and "registered file /nvidia0" in str(rep), rep
    assert lab.alive(pid) and flock_held(pid, node)
