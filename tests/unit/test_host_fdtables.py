"""Every distinct fd table of a thread group is read, once (host/fdtables.py, issue 39): a
thread that unshared its fd table (unshare(CLONE_FILES)) holds a GPU fd that /proc/PID/fd
does not show; threads sharing one table (a zombie leader's 1,500) cost one read."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pveclean.core.records import GpuDevices
from pveclean.host import devnodes, fdtables
from tests.helpers import NULL
from tests.unit.test_host_devnodes import task

DEVICES = GpuDevices({NULL: "/dev/nvidia0"}, frozenset())
CLONE_FILES = 0x400


@pytest.fixture
def own_table() -> Iterator[tuple[int, int]]:
    """This process, with a thread that unshared its fd table and opened /dev/null there
    (its fd is in no table the leader's /proc/PID/fd shows), beside 20 threads that share
    the leader's. Yields (the thread's TID, its fd)."""
    ready, done = threading.Event(), threading.Event()
    got: list[int] = []

    def own() -> None:
        assert ctypes.CDLL(None, use_errno=True).unshare(CLONE_FILES) == 0
        got.extend([threading.get_native_id(), os.open("/dev/null", os.O_RDONLY)])
        ready.set()
        done.wait()

    threads = [threading.Thread(target=own)]
    threads += [threading.Thread(target=done.wait) for _ in range(20)]
    for t in threads:
        t.start()
    ready.wait()
    try:
        yield got[0], got[1]
    finally:
        done.set()
        for t in threads:
            t.join()


def test_a_thread_with_a_table_of_its_own_is_read(own_table: tuple[int, int]) -> None:
    tid, fd = own_table
    me = os.getpid()
    assert not os.path.exists(f"/proc/{me}/fd/{fd}") or os.path.realpath(
        f"/proc/{me}/fd/{fd}") != "/dev/null"
    assert os.readlink(f"/proc/{me}/task/{tid}/fd/{fd}") == "/dev/null"
    unjudged: list[str] = []
    assert fdtables.other_tables(me, unjudged) == [f"/proc/{me}/task/{tid}"]  # one, of 21
    assert unjudged == []
    got = devnodes.judge_fds(me, GpuDevices({NULL: "/dev/nvidia0"}, frozenset()))
    assert got is not None and any(d.path == "/dev/null" for d in got.held), got
    assert devnodes.still_holds(me, DEVICES)  # the pre-signal check reads it too


def test_kcmp_tells_shared_tables_from_own() -> None:
    me = os.getpid()
    assert fdtables.same_files(me, me) is True
    assert fdtables.same_files(me, os.getppid()) is False
    assert fdtables.same_files(me, 2**22 + 7) is None  # no such task


def zombie_leader(proc: Path, threads: int) -> None:
    """A fake zombie leader 80 (an empty fd table) and `threads` threads sharing one table
    that holds the GPU node."""
    task(proc / "80", {})
    for tid in range(81, 81 + threads):
        task(proc / "80" / "task" / str(tid), {"5": ("/dev/null", 25)})


def test_a_zombie_leaders_shared_table_is_read_once(proc: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    zombie_leader(proc, 1500)
    # the kernel's answer for the fake tasks: the leader's table is gone, the threads share one
    monkeypatch.setattr(fdtables, "same_files", lambda a, b: a != 80 and b != 80)
    monkeypatch.setattr(fdtables, "_kcmp_works", lambda: True)
    read: list[str] = []
    real = devnodes._judge_table

    def spy(base: str, *args: object, **kw: object) -> int | None:
        read.append(base)
        return real(base, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(devnodes, "_judge_table", spy)
    got = devnodes.judge_fds(80, DEVICES)
    assert got is not None and [d.path for d in got.held] == ["/dev/null"]
    assert read == [str(proc / "80"), str(proc / "80" / "task" / "81")]


def test_past_max_tables_the_rest_is_named(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zombie_leader(proc, 5)
    monkeypatch.setattr(fdtables, "same_files", lambda a, b: False)  # each its own
    monkeypatch.setattr(fdtables, "_kcmp_works", lambda: True)
    monkeypatch.setattr(fdtables, "MAX_TABLES", 3)
    got = devnodes.judge_fds(80, DEVICES)
    assert got is not None and len(got.held) == 3
    assert got.unjudged == ["more than 3 fd tables of its own among its threads: those past "
                            "them not judged"]


def test_without_kcmp_a_zombie_leaders_threads_are_read(proc: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    zombie_leader(proc, 2)
    monkeypatch.setattr(fdtables, "_kcmp_works", lambda: False)
    got = devnodes.judge_fds(80, DEVICES)
    assert got is not None and [d.path for d in got.held] == ["/dev/null", "/dev/null"]
