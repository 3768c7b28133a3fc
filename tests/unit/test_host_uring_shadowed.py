"""A registered io_uring file is named by the kernel by its path alone (issue 39): for the
tenant, a path that leads to no GPU node now is not judged (a mount stacked over it after
registering, or a detached tree with a plain file put at the path the kernel shows, made it
pass for innocent); the host's own processes keep their rings' plain files innocent."""

from __future__ import annotations

import os
from pathlib import Path

from pveclean.host import devnodes, fstext, uring
from tests.helpers import DEVICES
from tests.unit.test_host_devnodes import HIT, RING, labels, ring_task

PLAIN = "/etc/passwd"  # a plain file in every test root: where the tenant's decoy would be


def test_a_tenants_registered_path_to_no_gpu_node_is_not_judged(proc: Path) -> None:
    ring_task(proc, 70, RING.replace("    3: /dev/null", f"    3: {PLAIN}"))
    got = devnodes.judge_fds(70, DEVICES, devnodes.ScanCache(tenant=True))
    assert got is not None and labels(got.held) == [f"/dev/null (io_uring fixed file, {HIT[1:]}"]
    assert got.unjudged == [f"io_uring fd 4: registered file {PLAIN} leads to no GPU node now; "
                            "the kernel names it by its path only, which a mount stacked over "
                            "it or a detached tree can lead elsewhere: not judged"]


def test_the_hosts_registered_plain_file_stays_innocent(proc: Path) -> None:
    ring_task(proc, 70, RING.replace("    3: /dev/null", f"    3: {PLAIN}"))
    got = devnodes.judge_fds(70, DEVICES, devnodes.ScanCache(tenant=False))
    assert got is not None and got.unjudged == [], got


def test_a_covered_bind_mount_at_the_path_is_judged_by_its_device(tmp_path: Path) -> None:
    """The task's mountinfo lists a mount at the registered path that the path no longer
    leads to: its root is looked up through the host's mount of the same file system."""
    dev = os.stat("/dev/null")
    fs = (os.major(dev.st_dev), os.minor(dev.st_dev))
    line = f"90 30 {fs[0]}:{fs[1]} /null /x/gpu rw shared:9 - devtmpfs udev rw\n"
    covered = fstext.parse_mount(line.rstrip("\n").encode())
    assert covered is not None
    covers = uring._Covers(str(tmp_path))
    covers.at = {b"/x/gpu": [covered]}  # as read from the task's mountinfo
    covers.host = [fstext.Mount(1, 0, fs, b"/", b"/dev", b"rw", (), b"devtmpfs", b"udev",
                                b"")]
    got = covers.judge(b"/x/gpu", DEVICES)
    assert got is not None and (got.major, got.minor) == (os.major(dev.st_rdev),
                                                       os.minor(dev.st_rdev))
    assert str(got).startswith("/x/gpu (io_uring fixed file")
    assert covers.judge(b"/x/other", DEVICES) is None  # no mount there: not judged stays
    covers.host = [fstext.Mount(1, 0, fs, b"/elsewhere", b"/dev", b"rw", (), b"devtmpfs",
                                b"udev", b"")]
    assert covers.judge(b"/x/gpu", DEVICES) is None  # its root is not below that mount's
