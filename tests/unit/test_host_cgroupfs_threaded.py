"""Threaded cgroups: cgroup.procs is EOPNOTSUPP there by design; cgroup.threads is read and
each thread counted as its process (Tgid of /proc/TID/status)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from pveclean.host import cgroupfs


def status(proc: Path, tid: int, tgid: int, name: str = "python3") -> None:
    d = proc / str(tid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\n"
                              f"Tgid:\t{tgid}\nNgid:\t0\nPid:\t{tid}\n")


def test_thread_group_reads_tgid_and_splits_at_newline_only(proc: Path) -> None:
    status(proc, 11, 10, name="x\fTgid:\t1\x85Tgid:\t2")
    assert cgroupfs.thread_group(11) == 10
    assert cgroupfs.thread_group(12) is None  # gone


def test_a_threaded_cgroup_is_read_through_its_threads(proc: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cg"
    (root / "pool" / "inner").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "cgroup.procs").write_text("5\n10\n")  # a threaded domain lists its subtree's
    for d in ("pool", "pool/inner", "empty"):
        (root / d / "cgroup.procs").write_text("")
    (root / "pool/cgroup.threads").write_text("")
    (root / "pool/inner/cgroup.threads").write_text("11\n12\n13\n")
    (root / "empty/cgroup.threads").write_text("")
    status(proc, 11, 10)
    status(proc, 12, 10)  # 13 exited meanwhile
    real = cgroupfs._ids_at

    def ids(fd: int, name: str) -> list[int]:  # the walk reads each cgroup by its fd
        if name == "cgroup.procs" and os.readlink(f"/proc/self/fd/{fd}") != str(root):
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real(fd, name)

    monkeypatch.setattr(cgroupfs, "_ids_at", ids)
    tree = cgroupfs.tree_pids(root)
    assert dict(tree) == {5: ".", 10: "pool/inner"}
    assert tree.truncated is None


def test_another_read_error_still_says_what_was_not_seen(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cg/sub").mkdir(parents=True)

    def ids(fd: int, name: str) -> list[int]:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cgroupfs, "_ids_at", ids)
    tree = cgroupfs.tree_pids(tmp_path / "cg")
    assert tree.truncated is not None and "Permission denied" in tree.truncated
