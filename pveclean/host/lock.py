"""Per-container run lock: two cleanups on one container never interleave their signals;
runs on different containers never wait for each other.

Only runs that signal take it. Read-only runs (`--dry-run`, `status`) take no lock at all, not
even a shared one: a shared lock would still make a cleanup wait (or report `busy`) behind a
dry run stuck on a hung probe, and a read-only run has nothing to protect. The wait is bounded
by the caller (within the run's deadline); the lock goes with its fd, and the run's worker
closes its inherited copy, so a reader stuck in the kernel never keeps it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

TYPE_CHECKING = False




class Busy(Exception):
    """Another run holds the lock; the message names it."""


def flock_within(fd: int, wait: float) -> bool:
    """An exclusive flock on `fd`, polled until `wait` seconds have passed: False when it
    stayed busy (a blocking flock has no timeout)."""
    end = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)


def lock_path(state_dir: str, vmid: int) -> Path:
    return Path(state_dir) / "locks" / f"{vmid}.lock"


@contextlib.contextmanager
def container_lock(state_dir: str, vmid: int, wait: float, what: str) -> Iterator[None]:
    path = lock_path(state_dir, vmid)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if not flock_within(fd, wait):
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
            raise Busy(
                f"another pveclean run holds CT {vmid}'s lock"
                + (f": {holder}" if holder else "")
                + f" (waited {wait:.1f} s)"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"PID {os.getpid()} ({what}) since {time.strftime('%H:%M:%S')}\n"
                  .encode(), 0)
        yield
    finally:
        os.close(fd)
