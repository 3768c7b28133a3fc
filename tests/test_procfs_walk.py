"""The cgroup walk on plain directories: iterative, capped, never an exception."""

from __future__ import annotations

import os
from pathlib import Path

from pveclean import procfs


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
    tree = procfs.tree_pids(tmp_path)
    assert tree.truncated is None and tree[4242] == "/".join(["d"] * 1500)


def test_walk_past_its_cap_says_why(tmp_path: Path) -> None:
    _nest(tmp_path, 30)
    tree = procfs.tree_pids(tmp_path, limit=10)
    assert tree.truncated and "more than 10 cgroups" in tree.truncated
    assert 4242 not in tree and bool(tree)  # not empty-looking: part of it was not seen


def test_path_too_long_is_a_reason_not_an_error(tmp_path: Path) -> None:
    _nest(tmp_path, 40, "x" * 200)  # 8 KB: past PATH_MAX
    tree = procfs.tree_pids(tmp_path)
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
    removed = procfs.remove_empty_cgroups(top)
    assert len(removed) == 1201 and not top.exists()
