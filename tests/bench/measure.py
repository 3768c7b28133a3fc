"""Measuring: wall time, peak RSS of a process tree, NVML readings, machine facts."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from tests.harness.lxclab import Lab, LabUnavailable, cgroup2_root

HOOK_ENV = {"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"}


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Tear-down that a second Ctrl-C (or SIGTERM/SIGHUP) cannot cut short: the signal is
    held until the block is done, then raised as KeyboardInterrupt."""
    caught: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        caught.append(signum)

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, hold) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if caught:
        raise KeyboardInterrupt(signal.Signals(caught[0]).name)


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The first and third quartiles (the min and max of fewer than four values)."""
    if len(values) < 4:
        return min(values), max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def ratio_spread(num: Sequence[float], den: Sequence[float]) -> str:
    """The spread of run-by-run ratios of two interleaved series: `runs i/i quartiles a-b`,
    the noise a ratio of medians hides on a shared machine."""
    pairs = [a / b for a, b in zip(num, den, strict=False) if b > 0]
    if not pairs:
        return "no pairs"
    lo, hi = quartiles(pairs)
    return f"run by run {lo:.2f}-{hi:.2f}x (quartiles of {len(pairs)})"


@dataclass
class Timed:
    seconds: float
    returncode: int
    stdout: str
    stderr: str


def timed(argv: Sequence[str], env: dict[str, str] | None = None,
          timeout: float = 120) -> Timed:
    """Run argv to completion (stdin /dev/null, output captured); wall time from fork to
    reap, which is what an admin waiting at the prompt sees."""
    t0 = time.perf_counter()
    res = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout,
                         stdin=subprocess.DEVNULL, check=False)
    return Timed(time.perf_counter() - t0, res.returncode, res.stdout, res.stderr)


@dataclass
class Spawned:
    seconds: float
    returncode: int
    max_rss_kib: int  # the largest process of the tree (ru_maxrss of the reaped child)
    output: str


# Forks argv from a small process and writes its wall time, wait status and ru_maxrss: a
# child spawned straight from this one (posix_spawn's vfork) starts its ru_maxrss at this
# process's high-water mark, which in a long pytest run is larger than pveclean's peak.
_METER = """import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execve(sys.argv[2], sys.argv[2:], os.environ)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    f.write(f"{seconds} {status} {usage.ru_maxrss}")
"""


def spawn_like_proxmox(argv: Sequence[str], workdir: Path, env: dict[str, str] | None = None
                       ) -> Spawned:
    """Run argv as Proxmox runs a hookscript (cleared env, stdin a pipe closed at once) and
    return its wall time and peak RSS: the largest of the process (across exec, sh ->
    pveclean) and the descendants it reaped (pct exec for the probe), read by a small
    metering parent (_METER) so that this process's own size does not count."""
    out_path = workdir / f".spawn-{os.getpid()}.out"
    meter_path = workdir / f".spawn-{os.getpid()}.meter"
    spawned = [sys.executable, "-I", "-S", "-c", _METER, str(meter_path), *argv]
    r, w = os.pipe()
    os.close(w)
    try:
        actions = [
            (os.POSIX_SPAWN_DUP2, r, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(out_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
             0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
            (os.POSIX_SPAWN_CLOSE, r),
        ]
        pid = os.posix_spawn(spawned[0], spawned, env if env is not None else HOOK_ENV,
                             file_actions=actions)
        _pid, meter_status, _usage = os.wait4(pid, 0)
    finally:
        os.close(r)
    output = out_path.read_text(errors="replace")
    out_path.unlink(missing_ok=True)
    if os.waitstatus_to_exitcode(meter_status) != 0 or not meter_path.exists():
        raise RuntimeError(f"the spawn meter failed: {output[-500:]}")
    seconds, status, rss = meter_path.read_text().split()
    meter_path.unlink()
    return Spawned(float(seconds), os.waitstatus_to_exitcode(int(status)), int(rss), output)


def new_lab(tries: int = 10, wait: float = 3.0) -> Lab:
    """A lab under a fresh /tmp/pveclean-bench-* root. Retries while the lab is unavailable
    for a passing reason (another lab on this host holds the spare device numbers); a root
    whose lab could not be made is removed."""
    for attempt in range(tries):
        root = Path(tempfile.mkdtemp(prefix="pveclean-bench-", dir="/tmp"))
        try:
            return Lab.create(root)
        except LabUnavailable as exc:
            shutil.rmtree(root, ignore_errors=True)
            passing = "device number" in str(exc) or "does not open" in str(exc)
            if not passing or attempt == tries - 1:
                raise
            time.sleep(wait)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
    raise AssertionError("unreachable")


# ---- NVML through the lab's fake library, in a child like nvidia-smi would be ------------
_NVML_CODE = r"""
import ctypes, json, sys
import pynvml
pynvml.nvmlLib = ctypes.CDLL(sys.argv[1])
pynvml.nvmlInit()
out = {}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    procs = {}
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        mem = p.usedGpuMemory
        procs[str(p.pid)] = None if mem is None else mem // 2**20
    out[str(i)] = {"used_mib": pynvml.nvmlDeviceGetMemoryInfo(h).used // 2**20, "procs": procs}
print(json.dumps(out))
"""


@dataclass
class GpuReading:
    used_mib: int
    procs: dict[int, int]  # host PID -> MiB (None counted as 0)


def nvml_reading(lab: Lab) -> dict[int, GpuReading]:
    """Per GPU: used MiB and the processes NVML lists (the fake counts live PIDs only)."""
    assert lab.nvml is not None
    res = subprocess.run([sys.executable, "-c", _NVML_CODE, str(lab.nvml.lib_path)], env={},
                         capture_output=True, text=True, check=True, timeout=30)
    raw = json.loads(res.stdout)
    return {int(g): GpuReading(int(v["used_mib"]), {int(p): int(m or 0)
                                                    for p, m in v["procs"].items()})
            for g, v in raw.items()}


# ---- machine and VMIDs -------------------------------------------------------------------
def machine_info() -> dict[str, object]:
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    u = os.uname()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "uname": f"{u.sysname} {u.nodename} {u.release} {u.version} {u.machine}",
        "nproc": os.cpu_count() or 0,
        "cpu": model,
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


class VmidPool:
    """Fresh VMIDs from a high range whose cgroup does not exist on this host."""

    def __init__(self, start: int | None = None) -> None:
        self.next = start if start is not None else 995000 + (os.getpid() % 100) * 40

    def take(self) -> int:
        root = cgroup2_root()
        while True:
            vmid = self.next
            self.next += 1
            if not (root / "lxc" / str(vmid)).exists():
                return vmid
