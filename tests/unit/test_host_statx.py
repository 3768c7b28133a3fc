"""host/statx's views of its statx buffer (the fd loop of devnodes reads a mode and device
numbers through them, no call per field), and procfs.one_task, which spares a single-threaded
process the listing of its threads: each said what the slower read says, on this kernel."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pveclean.core.records import GpuDevices
from pveclean.host import devnodes, fdtables, procfs, statx
from tests.helpers import NULL


def test_the_views_read_what_statx_says(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    fast = statx.quick()
    assert fast is not None
    call, u16, u32 = fast
    for path in ("/dev/null", str(tmp_path / "f"), str(tmp_path)):
        slow = statx.statx(path)
        assert isinstance(slow, statx.Stat)
        assert call(statx.AT_FDCWD, path.encode(), statx.FLAGS, statx.MASK, statx.BUF) == 0
        assert u16[statx.MODE] == slow.mode
        assert os.makedev(u32[statx.RDEV], u32[statx.RDEV + 1]) == slow.rdev
        assert (u32[statx.DEV], u32[statx.DEV + 1]) == slow.dev
    assert stat.S_ISCHR(u16[statx.MODE]) is False  # the last one, a directory


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    yield child
    child.kill()
    child.wait()


def test_one_task_is_told_by_the_link_count_of_task(sleeper: subprocess.Popen[bytes]) -> None:
    assert procfs.one_task(sleeper.pid)
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        assert not procfs.one_task(os.getpid())  # this process: a second thread
    finally:
        done.set()
        thread.join()
    assert not procfs.one_task(2**22 + 7)  # no such process: cannot tell


def test_a_single_threaded_process_has_no_thread_listing(
        sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its fd table is read; its threads are not looked for (one stat said there are
    none). A process with threads still has them listed."""
    listed: list[int] = []
    real = fdtables.other_tables

    def spy(pid: int, unjudged: list[str]) -> list[str]:
        listed.append(pid)
        return real(pid, unjudged)

    monkeypatch.setattr(fdtables, "other_tables", spy)
    got = devnodes.judge_fds(sleeper.pid, GpuDevices({NULL: "/dev/null"}, frozenset()))
    assert got is not None and [d.path for d in got.held] == ["/dev/null"]  # its stdin
    assert listed == []
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        devnodes.judge_fds(os.getpid(), GpuDevices({}, frozenset()))
    finally:
        done.set()
        thread.join()
    assert listed == [os.getpid()]
