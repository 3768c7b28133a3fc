"""lock: one cleanup per container at a time; the one that waits is told who holds it, and never
waits longer than it was given."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pveclean.host import lock
from pveclean.host.lock import Busy, container_lock


def test_the_holder_writes_who_it_is(tmp_path: Path) -> None:
    with container_lock(str(tmp_path), 129, 1.0, "hook pre-start"):
        path = lock.lock_path(str(tmp_path), 129)
        assert path == tmp_path / "locks/129.lock"
        text = path.read_text()
        assert re.fullmatch(rf"PID {os.getpid()} \(hook pre-start\) since \d\d:\d\d:\d\d\n", text)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_second_run_is_busy_and_names_the_holder(tmp_path: Path) -> None:
    with container_lock(str(tmp_path), 129, 1.0, "manual ct"):
        t = time.monotonic()
        with pytest.raises(Busy) as exc, container_lock(str(tmp_path), 129, 0.2, "hook"):
            pass
        waited = time.monotonic() - t
    assert 0.15 < waited < 3
    msg = str(exc.value)
    assert msg.startswith(f"another pveclean run holds CT 129's lock: PID {os.getpid()} "
                          "(manual ct) since ")
    assert msg.endswith(" (waited 0.2 s)")


def test_other_containers_do_not_wait(tmp_path: Path) -> None:
    with container_lock(str(tmp_path), 129, 1.0, "a"):
        t = time.monotonic()
        with container_lock(str(tmp_path), 130, 0.0, "b"):
            pass
        assert time.monotonic() - t < 0.5


def test_the_lock_is_free_again_after_the_block_even_on_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), container_lock(str(tmp_path), 129, 1.0, "a"):
        raise RuntimeError("boom")
    with container_lock(str(tmp_path), 129, 0.0, "b"):
        text = lock.lock_path(str(tmp_path), 129).read_text()
        assert "(b)" in text and "(a)" not in text  # the old holder's line is replaced


def test_a_lock_released_while_waiting_is_taken(tmp_path: Path) -> None:
    """Another process holds it for 0.3 s; a run that may wait 5 s gets it."""
    script = ("import sys, time\n"
              "from pveclean.host.lock import container_lock\n"
              "with container_lock(sys.argv[1], 129, 1.0, 'other'):\n"
              "    print('held', flush=True)\n"
              "    time.sleep(0.3)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        t = time.monotonic()
        with container_lock(str(tmp_path), 129, 5.0, "me"):
            waited = time.monotonic() - t
    finally:
        proc.wait(10)
    assert 0.05 < waited < 4


def test_a_holder_without_a_line_is_still_busy(tmp_path: Path) -> None:
    import fcntl

    path = lock.lock_path(str(tmp_path), 129)
    path.parent.mkdir(parents=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(Busy) as exc, container_lock(str(tmp_path), 129, 0.0, "x"):
            pass
    finally:
        os.close(fd)
    assert str(exc.value) == "another pveclean run holds CT 129's lock (waited 0.0 s)"
