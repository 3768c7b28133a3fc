"""Host load for the discovery bench: thousands of idle processes with ~20 open fds each.

They come from ``loadproc.c``, a static C program: one fork per process, a few pages each,
so 5,000 of them cost well under a GiB. Each batch runs in its own process group and dies
with the bench (PR_SET_PDEATHSIG), and `HostLoad.stop()` SIGKILLs every group and waits
until the processes are gone, so a later measurement is not disturbed by their exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "loadproc.c"
BUILD = Path(__file__).resolve().parent / "build"  # git-ignored (build/)
CFLAGS = ("-static", "-O2", "-Wall", "-std=gnu11")


def build_loadproc(out_dir: Path = BUILD) -> Path:
    """Compile loadproc.c into ``out_dir/loadproc`` (skipped when newer than the source)."""
    binary = out_dir / "loadproc"
    if binary.exists() and binary.stat().st_mtime >= SOURCE.stat().st_mtime:
        return binary
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("cannot build loadproc: gcc not found (apt-get install gcc libc6-dev)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".loadproc.{os.getpid()}.tmp"
    res = subprocess.run([gcc, *CFLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"cannot build loadproc (gcc -static): {res.stderr.strip()}")
    tmp.replace(binary)
    return binary


def group_pids(pgids: set[int]) -> list[int]:
    """The processes in the given process groups, zombies included: a killed load process
    keeps its PID until init reaps it, which can take seconds for thousands."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(text[text.rfind(")") + 2:].split()[2]) in pgids:
            out.append(int(name))
    return out


class HostLoad:
    """Idle host processes, added in batches: ``grow_to(1000)``, then ``grow_to(5000)``."""

    def __init__(self, fds: int = 20, binary: Path | None = None) -> None:
        self.fds = fds
        self.binary = binary or build_loadproc()
        self.batches: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def grow_to(self, total: int, timeout: float = 120) -> None:
        if total <= self.count:
            return
        n = total - self.count
        p = subprocess.Popen([str(self.binary), str(n), str(self.fds)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, start_new_session=True)
        self.batches.append(p)
        assert p.stdout is not None
        line = b""
        end = time.monotonic() + timeout
        while not line and time.monotonic() < end and p.poll() is None:
            line = p.stdout.readline()  # the children's stdout is /dev/null: one line, then EOF
        words = line.split()
        if len(words) != 2 or words[0] != b"ready" or int(words[1]) != n:
            self.stop()
            raise RuntimeError(f"loadproc {n} {self.fds} did not start: {line!r} "
                               f"(exit {p.poll()})")
        self.count = total

    def move_to(self, cgroup: Path) -> None:
        """Every load process into `cgroup` (a container's, below ns/): where a host's
        processes may live instead of its own cgroups."""
        cgroup.mkdir(parents=True, exist_ok=True)
        for pid in group_pids(self.pgids()):
            try:
                (cgroup / "cgroup.procs").write_text(str(pid))
            except OSError:
                continue

    def pgids(self) -> set[int]:
        return {p.pid for p in self.batches}

    def stop(self, timeout: float = 30) -> None:
        pgids = self.pgids()
        for p in self.batches:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.batches:
            with contextlib.suppress(Exception):
                p.wait(timeout)
            if p.stdout is not None:
                p.stdout.close()
        end = time.monotonic() + timeout
        while pgids and group_pids(pgids) and time.monotonic() < end:
            time.sleep(0.05)
        self.batches.clear()
        self.count = 0

    def __enter__(self) -> HostLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
