"""Adapter for the `pct` CLI: every call bounded by a timeout, its process group killed after."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass

HOOK_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"


@dataclass(frozen=True)
class PctResult:
    returncode: int | None  # None: timed out and killed
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class PctMissing(Exception):
    pass


def start_pct(pct_command: str, args: list[str]) -> subprocess.Popen[bytes]:
    """Start `pct ARGS` in its own process group, so a hung one can be killed whole."""
    argv = [*shlex.split(pct_command), *args]
    env = dict(os.environ)
    env.setdefault("PATH", HOOK_PATH)
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


def wait_pct(proc: subprocess.Popen[bytes], timeout: float) -> PctResult:
    """Collect a started pct; never waits longer than `timeout` (a hung `pct exec` into a
    frozen container is killed with its whole process group)."""
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.01))
        return PctResult(proc.returncode, out.decode(errors="replace"),
                         err.decode(errors="replace"))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
        return PctResult(None, out.decode(errors="replace"), err.decode(errors="replace"))


def run_pct(pct_command: str, args: list[str], timeout: float) -> PctResult:
    return wait_pct(start_pct(pct_command, args), timeout)
