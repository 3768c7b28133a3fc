"""Adapter for the `pct` CLI: every call bounded by a timeout, its process group killed after."""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import time
from dataclasses import dataclass

from pveclean.core.config import HOOK_PATH

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess


# The PATH Proxmox runs hooks and `pct exec` under (and pct's own lookup of a bare command).


# What `pct exec` runs under, whatever the caller's environment holds: Proxmox 8's pct exec
# passes its environment into the container, where the tenant's shell could read tokens.
PCT_ENV = {"PATH": HOOK_PATH, "LC_ALL": "C"}
MAX_STDOUT = 1 << 20  # bytes of output kept; the container's /bin/sh writes it
MAX_STDERR = 64 << 10
MAX_LINE = 8 << 10  # bytes of one output line (a path is at most 4096)


@dataclass(frozen=True)
class PctResult:
    """How a `pct` call ended."""

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
    import subprocess  # here: a run that starts no pct (a stopped container) never needs it

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


class PctReader:
    """Bounded, incremental collection of a started pct's output. `pump()` reads what is there
    and says when the output is complete, so a caller can poll it while it does other work:
    a pct writing more than a pipe holds never finishes unless someone reads it. Never keeps
    more than `max_stdout`/`max_stderr` bytes or a line longer than `max_line` (the container's
    shell writes this output); over a cap the whole process group is killed."""

    def __init__(self, proc: subprocess.Popen[bytes], max_stdout: int = MAX_STDOUT,
                 max_stderr: int = MAX_STDERR, max_line: int = MAX_LINE) -> None:
        self.proc = proc
        self.max_line = max_line
        self.over: str | None = None
        self.bufs: dict[int, bytearray] = {}
        self.caps: dict[int, tuple[str, int]] = {}
        self.line_len: dict[int, int] = {}
        self.open: set[int] = set()
        for name, pipe, cap in (("stdout", proc.stdout, max_stdout),
                                ("stderr", proc.stderr, max_stderr)):
            if pipe is not None:
                fd = pipe.fileno()
                os.set_blocking(fd, False)
                self.bufs[fd], self.caps[fd], self.line_len[fd] = bytearray(), (name, cap), 0
                self.open.add(fd)

    def abandon(self) -> None:
        """Kill the process group without reading what it wrote (a `pct exec` stuck in a
        frozen container may never close its pipes)."""
        import subprocess  # imported by the start

        _kill(self.proc)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(0.05)

    @property
    def done(self) -> bool:
        return bool(self.over) or not self.open

    def pump(self, timeout: float = 0.0) -> bool:
        """Read for at most `timeout` seconds (0: only what is there); True when complete."""
        end = time.monotonic() + max(timeout, 0.0)
        with selectors.DefaultSelector() as sel:
            for fd in self.open:
                sel.register(fd, selectors.EVENT_READ)
            while not self.done:
                events = sel.select(max(end - time.monotonic(), 0.0))
                if not events:
                    break
                for key, _ev in events:
                    if self._read(key.fd):
                        sel.unregister(key.fd)
                    if self.done:
                        break
        return self.done

    def _read(self, fd: int) -> bool:
        """One read; True at end of file."""
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.open.discard(fd)
            return True
        name, cap = self.caps[fd]
        room = cap - len(self.bufs[fd])
        self.bufs[fd] += chunk[: max(room, 0)]
        segs = chunk.split(b"\n")  # the first continues the line before
        longest = self.line_len[fd] + len(segs[0])
        if len(segs) > 1:
            longest = max(longest, *(len(x) for x in segs[1:]))
            self.line_len[fd] = len(segs[-1])
        else:
            self.line_len[fd] = longest
        if len(chunk) > room:
            self.over = f"{name} over {cap} bytes"
        elif longest > self.max_line:
            self.over = f"{name} has a line over {self.max_line} bytes"
        return False

    def result(self, wait: float = 1.0) -> PctResult:
        """Finish: kill it if it is over a cap or its output is not complete, reap it (at
        most `wait` seconds), close the pipes."""
        proc = self.proc
        cut = not self.done or bool(self.over)
        if cut:
            _kill(proc)
        import subprocess

        try:
            rc = proc.wait(timeout=1.0 if cut else max(wait, 0.01))
        except subprocess.TimeoutExpired:
            _kill(proc)
            rc = None
        out = bytes(self.bufs[proc.stdout.fileno()]) if proc.stdout is not None else b""
        err = bytes(self.bufs[proc.stderr.fileno()]) if proc.stderr is not None else b""
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return PctResult(None if cut else rc, out.decode(errors="replace"),
                         err.decode(errors="replace"), self.over)


def wait_pct(proc: subprocess.Popen[bytes], timeout: float, max_stdout: int = MAX_STDOUT,
             max_stderr: int = MAX_STDERR, max_line: int = MAX_LINE) -> PctResult:
    """Collect a started pct; never waits longer than `timeout` (a hung `pct exec` into a
    frozen container is killed with its whole process group), output bounded as PctReader."""
    end = time.monotonic() + max(timeout, 0.01)
    reader = PctReader(proc, max_stdout, max_stderr, max_line)
    reader.pump(end - time.monotonic())
    return reader.result(end - time.monotonic())


def run_pct(pct_command: str, args: list[str], timeout: float) -> PctResult:
    return wait_pct(start_pct(pct_command, args), timeout)
