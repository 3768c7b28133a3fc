"""The cgroup walk on plain directories: iterative, capped, never an exception.

The deep trees live in their own temporary directory, removed here without recursion:
pytest's tmp_path clean-up (shutil.rmtree) recurses and would fail on them later."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pveclean.errors import PvecleanError
from pveclean.host import cgroupfs


def rm_deep(top: Path) -> None:
    """Remove a tree of any depth and path length, bottom-up through directory fds."""
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    names: list[str] = []
    while fds:
        entries = list(os.scandir(fds[-1]))
        sub = next((e.name for e in entries if e.is_dir(follow_symlinks=False)), None)
        if sub is not None:
            fds.append(os.open(sub, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
            names.append(sub)
            continue
        for e in entries:
            os.unlink(e.name, dir_fd=fds[-1])
        os.close(fds.pop())
        if fds:
            os.rmdir(names.pop(), dir_fd=fds[-1])
    os.rmdir(top)


@pytest.fixture
def tmp_path() -> Iterator[Path]:  # shadows pytest's: see the module docstring
    top = Path(tempfile.mkdtemp(prefix="pveclean-walk-"))
    try:
        yield top
    finally:
        if top.exists():
            rm_deep(top)


def _nest(root: Path, depth: int, name: str = "d") -> Path:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            new = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = new
        with open(os.open("cgroup.procs", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd),
                  "w") as fh:
            fh.write("4242\n")
    finally:
        os.close(fd)
    return root


def test_walk_is_iterative(tmp_path: Path) -> None:
    _nest(tmp_path, 1500)  # os.walk recursion failed past ~1000
    tree = cgroupfs.tree_pids(tmp_path)
    assert tree.truncated is None and tree[4242] == "/".join(["d"] * 1500)


def test_walk_past_its_cap_says_why(tmp_path: Path) -> None:
    _nest(tmp_path, 30)
    tree = cgroupfs.tree_pids(tmp_path, limit=10)
    assert tree.truncated and "more than 10 cgroups" in tree.truncated
    assert 4242 not in tree and bool(tree)  # not empty-looking: part of it was not seen


def test_path_too_long_is_a_reason_not_an_error(tmp_path: Path) -> None:
    _nest(tmp_path, 40, "x" * 200)  # 8 KB: past PATH_MAX
    tree = cgroupfs.tree_pids(tmp_path)
    assert tree.truncated and "too long" in tree.truncated and len(tree.truncated) < 400


def test_remove_empty_cgroups_is_iterative(tmp_path: Path) -> None:
    top = tmp_path / "ct"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1200):
        os.mkdir("d", dir_fd=fd)
        new = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = new
    os.close(fd)
    removed = cgroupfs.remove_empty_cgroups(top)
    assert len(removed) == 1201 and not top.exists()


def test_cgroup2_root_from_mounts(tmp_path: Path) -> None:
    m = tmp_path / "mounts"
    m.write_text("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n"
                 "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert cgroupfs.cgroup2_root(str(m)) == "/sys/fs/cgroup/unified"
    m.write_text("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    assert cgroupfs.cgroup2_root(str(m)) == "/sys/fs/cgroup"
    m.write_text("proc /proc proc rw 0 0\n")
    with pytest.raises(PvecleanError, match="no cgroup v2"):
        cgroupfs.cgroup2_root(str(m))
