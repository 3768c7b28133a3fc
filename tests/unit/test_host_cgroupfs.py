"""host/cgroupfs on fake cgroup trees and a fake /proc under tmp_path: the bounded walk (also on
trees thousands deep, past PATH_MAX), removing empty cgroups, the mount point, a process's
cgroup and the freezer."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pveclean.errors import PvecleanError
from pveclean.host import cgroupfs


@pytest.fixture
def proc(proc: Path) -> Path:
    """conftest's fake /proc, with a self/ directory."""
    (proc / "self").mkdir(parents=True)
    return proc


def cgroups(root: Path, tree: dict[str, str | None]) -> Path:
    """Cgroup directories below `root`, each with its cgroup.procs (None: none there)."""
    for rel, procs in tree.items():
        d = root / rel if rel else root
        d.mkdir(parents=True, exist_ok=True)
        if procs is not None:
            (d / "cgroup.procs").write_text(procs)
    return root


def test_tree_pids_maps_every_process_to_its_relative_cgroup(tmp_path: Path) -> None:
    ct = cgroups(tmp_path / "lxc" / "129", {"": "", "ns": "100\n", "ns/system.slice": "",
                                            "ns/system.slice/a.service": "101\n102\n",
                                            "ns/user.slice": "103\n"})
    tree = cgroupfs.tree_pids(ct)
    assert dict(tree) == {100: "ns", 101: "ns/system.slice/a.service",
                          102: "ns/system.slice/a.service", 103: "ns/user.slice"}
    assert tree.truncated is None


def test_a_cgroup_that_vanished_mid_walk_is_passed_over(tmp_path: Path) -> None:
    ct = cgroups(tmp_path / "ct", {"": "1\n", "gone": None, "here": "2\n"})
    assert dict(cgroupfs.tree_pids(ct)) == {1: ".", 2: "here"}


def test_a_cgroup_procs_that_cannot_be_read_is_named_and_the_rest_walked(tmp_path: Path
                                                                          ) -> None:
    ct = cgroups(tmp_path / "ct", {"": "1\n", "bad": None, "ok": "3\n"})
    (ct / "bad" / "cgroup.procs").mkdir()  # EISDIR: read, but not readable
    tree = cgroupfs.tree_pids(ct)
    assert dict(tree) == {1: ".", 3: "ok"}
    assert tree.truncated == f"cannot read {ct}/bad/cgroup.procs: Is a directory"


def test_a_tree_past_the_cap_is_cut_and_says_so(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroupfs, "MAX_CGROUPS", 3)
    ct = cgroups(tmp_path / "ct", {f"d{i}": f"{10 + i}\n" for i in range(5)} | {"": ""})
    tree = cgroupfs.tree_pids(ct)
    assert len(tree) == 2  # the root and two of the five
    assert tree.truncated == ("the cgroup tree has more than 3 cgroups; processes in the "
                              "cgroups past the first 3 were not looked at")


def test_an_empty_but_cut_tree_is_still_something_to_report(tmp_path: Path) -> None:
    ct = cgroups(tmp_path / "ct", {"": "", "a": "", "b": ""})
    tree = cgroupfs.tree_pids(ct, limit=1)
    assert len(tree) == 0 and tree.truncated and bool(tree)
    assert not cgroupfs.tree_pids(ct)


def test_a_missing_tree_has_no_process(tmp_path: Path) -> None:
    tree = cgroupfs.tree_pids(tmp_path / "nothing")
    assert dict(tree) == {} and tree.truncated is None


def test_a_deep_tree_is_walked_without_recursion(tmp_path: Path) -> None:
    ct = cgroups(tmp_path / "ct", {"": ""})
    d = str(ct)
    for _ in range(1100):  # deeper than Python recurses (pathlib's mkdir would)
        d += "/d"
        os.mkdir(d)
    Path(d, "cgroup.procs").write_text("77\n")
    try:
        assert dict(cgroupfs.tree_pids(ct)) == {77: "/".join(["d"] * 1100)}
    finally:  # iteratively too: shutil.rmtree recurses per level
        os.unlink(f"{d}/cgroup.procs")
        while d != str(ct):
            os.rmdir(d)
            d = os.path.dirname(d)


def test_remove_empty_cgroups_goes_deepest_first_and_leaves_the_busy(tmp_path: Path) -> None:
    ct = cgroups(tmp_path / "ct", {"": None, "a/b/c": None, "x/y": None})
    (ct / "x" / "busy").write_text("a file: rmdir fails as on a cgroup with a process")
    removed = cgroupfs.remove_empty_cgroups(ct)
    assert removed == [f"{ct}/a/b/c", f"{ct}/a/b", f"{ct}/x/y", f"{ct}/a"]
    assert (ct / "x").is_dir() and not (ct / "a").exists()
    assert cgroupfs.remove_empty_cgroups(tmp_path / "nothing") == []


@pytest.mark.parametrize(("procs", "running"), [("4242\n", True), ("", False),
                                                ("\n", False), (None, False)])
def test_monitor_running_reads_the_lxc_monitor_cgroup(tmp_path: Path, procs: str | None,
                                                      running: bool) -> None:
    cgroups(tmp_path, {"lxc.monitor/129": procs})
    assert cgroupfs.monitor_running(str(tmp_path), 129) is running


def test_nothing_left_only_for_a_stopped_container_with_an_empty_tree(tmp_path: Path) -> None:
    empty = cgroups(tmp_path / "empty", {"": "", "ns": ""})
    busy = cgroups(tmp_path / "busy", {"": "", "ns": "5\n"})
    assert cgroupfs.nothing_left(empty, running=False)
    assert not cgroupfs.nothing_left(empty, running=True)
    assert not cgroupfs.nothing_left(busy, running=False)
    assert cgroupfs.nothing_left(tmp_path / "gone", running=False)


def test_container_cgroup_is_below_lxc() -> None:
    assert cgroupfs.container_cgroup("/sys/fs/cgroup", 129) == Path("/sys/fs/cgroup/lxc/129")


MOUNTS = """\
sysfs /sys sysfs rw,nosuid 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid 0 0
cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nsdelegate 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,freezer 0 0
"""


def test_cgroup2_root_is_the_shortest_cgroup2_mount(proc: Path) -> None:
    (proc / "self" / "mounts").write_text(MOUNTS)
    assert cgroupfs.cgroup2_root() == "/sys/fs/cgroup"


def test_cgroup2_root_unescapes_a_space(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup2 /my\\040cgroups cgroup2 rw 0 0\n")
    assert cgroupfs.cgroup2_root(str(mounts)) == "/my cgroups"


def test_cgroup2_root_without_cgroup2_or_mounts_is_an_error(proc: Path) -> None:
    (proc / "self" / "mounts").write_text("sysfs /sys sysfs rw 0 0\n")
    with pytest.raises(PvecleanError, match="no cgroup v2 hierarchy is mounted"):
        cgroupfs.cgroup2_root()
    (proc / "self" / "mounts").unlink()
    with pytest.raises(PvecleanError) as err:
        cgroupfs.cgroup2_root()
    assert str(err.value) == f"cannot read {proc}/self/mounts: No such file or directory"


def test_pid_cgroup_is_the_unified_line(proc: Path) -> None:
    (proc / "42").mkdir()
    (proc / "42" / "cgroup").write_text("12:freezer:/lxc/129\n0::/lxc/129/ns/init.scope\n")
    assert cgroupfs.pid_cgroup(42) == "/lxc/129/ns/init.scope"
    (proc / "42" / "cgroup").write_text("12:freezer:/lxc/129\n")
    assert cgroupfs.pid_cgroup(42) is None
    assert cgroupfs.pid_cgroup(43) is None


def test_frozen_by_the_v2_freezer(tmp_path: Path, proc: Path) -> None:
    root = tmp_path / "cg2"
    (proc / "self" / "mounts").write_text(f"cgroup2 {root} cgroup2 rw 0 0\n")
    cgroups(root, {"lxc/129/ns": None})
    (proc / "42").mkdir()
    (proc / "42" / "cgroup").write_text("0::/lxc/129/ns\n")
    events = root / "lxc" / "129" / "ns" / "cgroup.events"
    events.write_text("populated 1\nfrozen 1\n")
    assert cgroupfs.frozen(42)
    events.write_text("populated 1\nfrozen 0\n")
    assert not cgroupfs.frozen(42)
    assert not cgroupfs.frozen(43)  # gone


@pytest.mark.parametrize(("state", "frozen"), [("FROZEN", True), ("FREEZING", True),
                                               ("THAWED", False)])
def test_frozen_by_a_v1_freezer(tmp_path: Path, proc: Path, state: str, frozen: bool) -> None:
    v1 = tmp_path / "freezer"
    (proc / "self" / "mounts").write_text(f"cgroup {v1} cgroup rw,nosuid,freezer 0 0\n")
    cgroups(v1, {"lxc/129": None})
    (v1 / "lxc" / "129" / "freezer.state").write_text(f"{state}\n")
    (proc / "42").mkdir()
    (proc / "42" / "cgroup").write_text("7:freezer:/lxc/129\n0::/lxc/129/ns\n")
    assert cgroupfs.frozen(42) is frozen


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
def deep_tmp() -> Iterator[Path]:
    """A directory for trees too deep for tmp_path's clean-up (shutil.rmtree recurses and
    would fail on them later), removed here without recursion."""
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


def test_walk_is_iterative(deep_tmp: Path) -> None:
    _nest(deep_tmp, 1500)  # os.walk recursion failed past ~1000
    tree = cgroupfs.tree_pids(deep_tmp)
    assert tree.truncated is None and tree[4242] == "/".join(["d"] * 1500)


def test_walk_past_its_cap_says_why(deep_tmp: Path) -> None:
    _nest(deep_tmp, 30)
    tree = cgroupfs.tree_pids(deep_tmp, limit=10)
    assert tree.truncated and "more than 10 cgroups" in tree.truncated
    assert 4242 not in tree and bool(tree)  # not empty-looking: part of it was not seen


def test_a_chain_past_path_max_is_walked_whole(deep_tmp: Path) -> None:
    """Each cgroup is opened from its parent's fd (issue 39): a chain of 8 KB is no limit
    (it made every run `residual` and hid every cgroup after it)."""
    _nest(deep_tmp, 40, "x" * 200)  # 8 KB: past PATH_MAX
    tree = cgroupfs.tree_pids(deep_tmp)
    assert tree.truncated is None and tree[4242] == "/".join(["x" * 200] * 40)


def test_a_branch_that_cannot_be_read_is_skipped_and_named_the_rest_walked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the walk gave up at the first error: every cgroup after it went unseen."""
    ct = cgroups(tmp_path / "ct", {"": "1\n", "a": "2\n", "b": "4\n", "b/deep": "5\n",
                                   "c": "3\n"})
    real = os.open

    def refusing(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None
                 ) -> int:
        if path == "b" and dir_fd is not None:
            raise OSError(errno.EACCES, "Permission denied")
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", refusing)
    tree = cgroupfs.tree_pids(ct)
    monkeypatch.undo()
    assert dict(tree) == {1: ".", 2: "a", 3: "c"}
    assert tree.truncated == f"cannot read cgroup {ct}/b: Permission denied"


def test_remove_empty_cgroups_is_iterative(deep_tmp: Path) -> None:
    top = deep_tmp / "ct"
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
