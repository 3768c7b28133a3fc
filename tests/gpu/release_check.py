#!/usr/bin/env python3
"""`gpu_check.py --release`: how long a real NVIDIA driver takes to give a killed process's
GPU memory back (issue 38), measured, never assumed. It never resets or reconfigures the GPU.

For each case (device memory alone, and with 8 and 32 GiB of pinned host memory) and each
signal (SIGKILL; SIGTERM, which the holder answers by freeing and exiting), `--runs` times: a
holder allocates (PyTorch where it is installed, ctypes on libcuda where it is not), the signal
is sent, and the script times, from the signal: the kernel's exit starting (PF_EXITING in
/proc/PID/stat), the process gone (its pidfd readable; /proc polled where pidfds are missing,
as under gVisor), NVML's process list letting go of the PID, and the GPU's used memory back to
its baseline. A table and JSON; the largest "memory back" sets `release_seconds`' default.
Cases that need more host memory than is available, or time past `--budget`, are skipped and
say so. Without a GPU: one line, "cannot run here: why", exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings, run from anywhere
import gpuplumb  # tests/gpu/gpuplumb.py: what the GPU scripts share

PF_EXITING = 0x4
MIB = gpuplumb.MIB

HOLDER = r"""
import ctypes, os, signal, sys, time
gib, pinned_gib, gpu = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
freed = []
try:
    import torch
    torch.cuda.set_device(gpu)
    dev = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    host = (torch.empty(int(pinned_gib * 2**30), dtype=torch.uint8, pin_memory=True)
            if pinned_gib else None)
    if host is not None:
        host[:: 4096] = 1  # touch every page
    def free():
        global dev, host
        dev = host = None
        torch.cuda.empty_cache()
    how = "torch"
except ImportError:
""" + gpuplumb.CUDA_CTYPES.replace("\n", "\n    ") + r"""
    ptr = alloc(gib)
    hptr = ctypes.c_void_p()
    if pinned_gib:
        ok(cuda.cuMemAllocHost_v2(ctypes.byref(hptr), ctypes.c_size_t(int(pinned_gib * 2**30))),
           "cuMemAllocHost")
        ctypes.memset(hptr, 1, int(pinned_gib * 2**30))
    def free():
        if pinned_gib:
            cuda.cuMemFreeHost(hptr)
        cuda.cuMemFree_v2(ptr)
        cuda.cuCtxDestroy_v2(ctx)
    how = "ctypes"
def on_term(_s, _f):
    free(); os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", how, flush=True)
time.sleep(3600)
"""

# --fake-nvml: the same steps against the lab's fake NVML, its `release` directive standing
# in for the driver's late release, so the script is tested before a GPU run.
FAKE_HOLDER = r"""
import os, signal, sys, time
gib, pinned_gib = float(sys.argv[1]), float(sys.argv[2])
""" + gpuplumb.FAKE_NODE + r"""
host = bytearray(int(pinned_gib * 2**20))  # fake mode: MiB, not GiB
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
print("ready fake", flush=True)
time.sleep(3600)
"""


class CannotRun(Exception):
    pass


@dataclass
class Trial:
    case: str
    signal: str
    run: int
    holder: str = ""
    alloc_s: float | None = None
    exiting_s: float | None = None  # PF_EXITING first seen
    exited_s: float | None = None  # the process gone (pidfd readable, or /proc says)
    unlisted_s: float | None = None  # NVML's process list let go of the PID
    memory_back_s: float | None = None  # used memory back within tolerance of the baseline
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)


class Gpu:
    """NVML for one GPU: used MiB and the PIDs of its process lists."""

    def __init__(self, index: int, fake: str | None) -> None:
        self.nv = gpuplumb.nvml(fake)
        self.h = self.nv.nvmlDeviceGetHandleByIndex(index)

    def used(self) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.h).used) // MIB

    def pids(self) -> set[int]:
        out = set()
        for fn in (self.nv.nvmlDeviceGetComputeRunningProcesses,
                   self.nv.nvmlDeviceGetGraphicsRunningProcesses):
            with contextlib.suppress(self.nv.NVMLError):
                out |= {p.pid for p in fn(self.h)}
        return out


def flags(pid: int) -> int | None:
    rest = gpuplumb.stat_rest(pid)
    return int(rest[6]) if rest and len(rest) > 6 and rest[6].isdigit() else None


def gone(pid: int) -> bool:
    return not gpuplumb.alive(pid)


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def environment() -> list[str]:
    """What kind of kernel this is: gVisor lacks the cgroup v2 freezer and maybe pidfds."""
    notes = []
    version = Path("/proc/version").read_text().strip()
    if "gVisor" in version or os.uname().release.startswith("4.4.0"):
        notes.append("gVisor-like kernel (runsc): PF_EXITING and pidfds may not be real")
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as exc:
        notes.append(f"no pidfds ({exc}): exits polled through /proc")
    return notes


def settled(gpu: Gpu, tolerance: int, still: float = 1.0, limit: float = 15.0) -> int:
    """The GPU's used MiB once it has not moved by more than `tolerance` for `still` s (an
    earlier process's memory may still be on its way back), or after `limit` s."""
    end = time.monotonic() + limit
    last, since = gpu.used(), time.monotonic()
    while time.monotonic() < end and time.monotonic() - since < still:
        time.sleep(0.1)
        now = gpu.used()
        if abs(now - last) > tolerance:
            last, since = now, time.monotonic()
    return gpu.used()


def one_trial(t: Trial, args: argparse.Namespace, gpu: Gpu, pinned: float) -> Trial:
    script = FAKE_HOLDER if args.fake_nvml else HOLDER
    baseline = settled(gpu, args.tolerance_mib)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", script, str(args.release_gib), str(pinned),
                          str(args.gpu)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        line = p.stdout.readline().decode().split()
        if not line or line[0] != "ready":
            err = (p.stderr.read() if p.stderr else b"").decode().strip()[-200:]
            raise CannotRun(f"the holder did not start: {err or 'no output'}")
        t.holder, t.alloc_s = line[1], round(time.monotonic() - t0, 3)
        gpuplumb.fake_memory(args.fake_nvml, p.pid, args.release_gib, args.gpu)
        _watch(t, p, gpu, baseline, args)
    finally:
        with contextlib.suppress(OSError):
            p.kill()
        with contextlib.suppress(Exception):
            p.wait(args.trial_timeout)
    return t


def _watch(t: Trial, p: subprocess.Popen[bytes], gpu: Gpu, baseline: int,
           args: argparse.Namespace) -> None:
    try:
        pidfd: int | None = os.pidfd_open(p.pid)
    except (AttributeError, OSError):
        pidfd = None
    sig = signal.SIGKILL if t.signal == "SIGKILL" else signal.SIGTERM
    start = time.monotonic()
    os.kill(p.pid, sig)
    end = start + args.trial_timeout
    while time.monotonic() < end:
        now = round(time.monotonic() - start, 3)
        if t.exiting_s is None and t.exited_s is None:
            f = flags(p.pid)
            if f is not None and f & PF_EXITING:
                t.exiting_s = now
        if t.exited_s is None:
            if pidfd is not None:
                if select.select([pidfd], [], [], 0)[0]:
                    t.exited_s = now
            elif gone(p.pid):
                t.exited_s = now
        if t.unlisted_s is None and p.pid not in gpu.pids():
            t.unlisted_s = now
        if t.memory_back_s is None and gpu.used() <= baseline + args.tolerance_mib:
            t.memory_back_s = now
        if None not in (t.exited_s, t.unlisted_s, t.memory_back_s):
            break
        time.sleep(0.01)
    else:
        t.notes.append(f"not all back within {args.trial_timeout:g} s")
    if pidfd is not None:
        os.close(pidfd)


def calibrate(args: argparse.Namespace) -> tuple[list[Trial], list[str]]:
    notes = environment()
    gpu = Gpu(args.gpu, args.fake_nvml)
    gpuplumb.fake_state(args.fake_nvml, f"release {args.gpu} {args.fake_release} 1")
    started = time.monotonic()
    trials = []
    for pinned in args.pinned_gib:
        for sig in ("SIGKILL", "SIGTERM"):
            for run in range(1, args.runs + 1):
                t = Trial(f"{args.release_gib:g} GiB device + {pinned:g} GiB pinned", sig, run)
                need = pinned + 4
                if not args.fake_nvml and available_gib() < need:
                    t.skipped = f"needs {need:g} GiB of available host memory"
                elif time.monotonic() - started > args.budget:
                    t.skipped = f"past the {args.budget:g} s budget"
                else:
                    one_trial(t, args, gpu, pinned)
                trials.append(t)
    return trials, notes


def table(trials: list[Trial], notes: list[str], args: argparse.Namespace) -> str:
    head = ("case", "signal", "run", "holder", "alloc s", "PF_EXITING s", "exited s",
            "NVML unlisted s", "memory back s")
    rows = [head]
    for t in trials:
        if t.skipped:
            rows.append((t.case, t.signal, str(t.run), f"skipped: {t.skipped}", "", "", "",
                         "", ""))
            continue
        rows.append((t.case, t.signal, str(t.run), t.holder, *(
            "-" if v is None else f"{v:.3f}" for v in (t.alloc_s, t.exiting_s, t.exited_s,
                                                      t.unlisted_s, t.memory_back_s))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"pveclean release calibration on {os.uname().nodename}, GPU {args.gpu}, "
             f"{time.strftime('%F %T %Z')}", *(f"note: {n}" for n in notes)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    back = [t.memory_back_s for t in trials if t.memory_back_s is not None]
    if back:
        lines.append(f"largest memory back: {max(back):.3f} s; release_seconds default at "
                     f"least {suggest(back)} s")
    return "\n".join(lines)


def suggest(back: list[float]) -> int:
    """Twice the slowest release seen, at least 5 s: a margin for a busier host."""
    return max(5, math.ceil(2 * max(back)))


def main_release(args: argparse.Namespace) -> int:
    """Run the calibration; 0 when every trial that ran got its memory back, 1 when one did
    not, 2 when it cannot run here (one line)."""
    why = gpuplumb.preflight(args.fake_nvml, need_root=False)
    if why:
        print(f"release-check: cannot run here: {why}", file=sys.stderr)
        return 2
    try:
        trials, notes = calibrate(args)
    except CannotRun as exc:
        print(f"release-check: cannot run here: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # NVML or CUDA missing in a way preflight did not see
        print(f"release-check: cannot run here: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(table(trials, notes, args))
    out = {"gpu": args.gpu, "notes": notes, "trials": [asdict(t) for t in trials]}
    if args.release_json:
        Path(args.release_json).write_text(json.dumps(out, indent=1) + "\n")
    else:
        print(json.dumps(out))
    ran = [t for t in trials if not t.skipped]
    return 0 if ran and all(t.memory_back_s is not None for t in ran) else 1


def add_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--release", action="store_true",
                    help="after the check, calibrate how long the driver takes to give a "
                         "killed process's memory back (table and JSON)")
    ap.add_argument("--release-only", action="store_true", help="the calibration alone")
    ap.add_argument("--release-gib", type=float, default=4.0, help="device memory per holder")
    ap.add_argument("--pinned-gib", type=float, nargs="+", default=[0.0, 8.0, 32.0],
                    help="pinned host memory per case")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trial-timeout", type=float, default=60.0)
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds of calibration; later trials are skipped")
    ap.add_argument("--release-json", metavar="FILE", help="write the JSON there")
    ap.add_argument("--fake-release", type=float, default=0.3,
                    help="fake mode: the fake driver's release time")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--tolerance-mib", type=int, default=256)
    parser.add_argument("--fake-nvml", metavar="LIB")
    parser.add_argument("--devices", default="/dev/nvidia*")
    add_options(parser)
    a = parser.parse_args()
    if a.fake_nvml:
        a.fake_nvml = str(Path(a.fake_nvml).resolve())
        gpuplumb.fake_node(a.devices)
    sys.exit(main_release(a))
