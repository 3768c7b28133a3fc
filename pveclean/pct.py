"""Adapter for the `pct` CLI: every call bounded by a timeout, its process group killed after."""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass

HOOK_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
# What `pct exec` runs under, whatever the caller's environment holds: Proxmox 8's pct exec
# passes its environment into the container, where the tenant's shell could read tokens.
PCT_ENV = {"PATH": HOOK_PATH, "LC_ALL": "C"}
MAX_STDOUT = 1 << 20  # bytes of output kept; the container's /bin/sh writes it
MAX_STDERR = 64 << 10
MAX_LINE = 8 << 10  # bytes of one output line (a path is at most 4096)


@dataclass(frozen=True)
class PctResult:
    returncode: int | None  # None: timed out, or killed over a limit
    stdout: str
    stderr: str
    over_limit: str | None = None  # which cap the output passed; it was killed then

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class PctMissing(Exception):
    pass


def start_pct(pct_command: str, args: list[str]) -> subprocess.Popen[bytes]:
    """Start `pct ARGS` in its own process group, so a hung one can be killed whole."""
    argv = [*shlex.split(pct_command), *args]
    env = dict(PCT_ENV)
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
    except FileNotFoundError:
        raise PctMissing(f"pct command not found: {argv[0]!r}") from None
    except PermissionError:
        raise PctMissing(f"pct command not executable: {argv[0]!r}") from None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_pct(proc: subprocess.Popen[bytes], timeout: float, max_stdout: int = MAX_STDOUT,
             max_stderr: int = MAX_STDERR, max_line: int = MAX_LINE) -> PctResult:
    """Collect a started pct; never waits longer than `timeout` (a hung `pct exec` into a
    frozen container is killed with its whole process group) and never keeps more than
    `max_stdout`/`max_stderr` bytes or a line longer than `max_line`: the container's shell
    writes this output, and over a cap the whole process group is killed."""
    end = time.monotonic() + max(timeout, 0.01)
    bufs: dict[int, bytearray] = {}
    caps: dict[int, tuple[str, int]] = {}
    line_len: dict[int, int] = {}
    over: str | None = None
    sel = selectors.DefaultSelector()
    for name, pipe, cap in (("stdout", proc.stdout, max_stdout),
                            ("stderr", proc.stderr, max_stderr)):
        if pipe is not None:
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            bufs[fd], caps[fd], line_len[fd] = bytearray(), (name, cap), 0
            sel.register(fd, selectors.EVENT_READ)
    timed_out = False
    try:
        while sel.get_map():
            left = end - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ev in sel.select(left):
                fd = key.fd
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                name, cap = caps[fd]
                room = cap - len(bufs[fd])
                bufs[fd] += chunk[: max(room, 0)]
                segs = chunk.split(b"\n")  # the first continues the line before
                longest = line_len[fd] + len(segs[0])
                if len(segs) > 1:
                    longest = max(longest, *(len(x) for x in segs[1:]))
                    line_len[fd] = len(segs[-1])
                else:
                    line_len[fd] = longest
                if len(chunk) > room:
                    over = f"{name} over {cap} bytes"
                elif longest > max_line:
                    over = f"{name} has a line over {max_line} bytes"
                if over:
                    break
            if over:
                break
    finally:
        sel.close()
    if over or timed_out:
        _kill(proc)
    try:
        rc = proc.wait(timeout=1.0) if (over or timed_out) else proc.wait(
            timeout=max(end - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        _kill(proc)
        rc = None
    out = bytes(bufs[proc.stdout.fileno()]) if proc.stdout is not None else b""
    err = bytes(bufs[proc.stderr.fileno()]) if proc.stderr is not None else b""
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    return PctResult(None if (over or timed_out) else rc, out.decode(errors="replace"),
                     err.decode(errors="replace"), over)


def run_pct(pct_command: str, args: list[str], timeout: float) -> PctResult:
    return wait_pct(start_pct(pct_command, args), timeout)
