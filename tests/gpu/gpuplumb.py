"""What the real-GPU scripts share (gpu_check.py, release_check.py): whether this machine can
run them (one line when not), NVML (the driver's, or the lab's fake with its state file), the
CUDA context a holder makes through ctypes, the fake holders' GPU node, and /proc looks at a
holder. Standard library only (pynvml imported when NVML is asked), loaded by path beside the
scripts, so each script still runs standalone."""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from pathlib import Path
from typing import Any

MIB = 2**20

# The ctypes side of a CUDA holder (no PyTorch needed): `cuda`, `ok()`, a context on GPU `gpu`
# and `alloc(gib)` -> device pointer; a holder script defines `gpu` first.
CUDA_CTYPES = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0:
        print(f"holder: {what} failed: CUDA error {r}", flush=True); sys.exit(3)
ok(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int(); ok(cuda.cuDeviceGet(ctypes.byref(dev), gpu), "cuDeviceGet")
ctx = ctypes.c_void_p(); ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
def alloc(gib):
    ptr = ctypes.c_uint64()
    ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(gib * 2**30))), "cuMemAlloc")
    return ptr
"""

# A fake holder holds the fake GPU node named by GPU_CHECK_NODE, as a CUDA context holds
# /dev/nvidiaN (fake_node() sets it from --devices).
FAKE_NODE = 'fd = os.open(os.environ["GPU_CHECK_NODE"], os.O_RDWR)'


def preflight(fake: str | None, need_root: bool = True) -> str | None:
    """Why this machine cannot run the check (one line), or None. `fake`: the lab's fake
    libnvidia-ml.so.1 (then no GPU, CUDA or util-linux is needed)."""
    if sys.platform != "linux":
        return "needs Linux"
    if need_root and os.geteuid() != 0:
        return "needs root (cgroups, PID namespaces, signals)"
    if fake:
        return None
    if not Path("/dev/nvidiactl").exists():
        return "no NVIDIA GPU here (/dev/nvidiactl missing): run it on a machine with a GPU"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver library (libcuda.so.1) here"
    try:
        nvml(None)
    except Exception as exc:
        return f"NVML does not work here: {type(exc).__name__}: {exc}"
    for tool in ("unshare", "nsenter") if need_root else ():
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) not found"
    return None


def nvml(fake: str | None) -> Any:
    """pynvml, initialised: on the driver's library, or on the fake one at `fake`."""
    import pynvml

    if fake and pynvml.nvmlLib is None:
        pynvml.nvmlLib = ctypes.CDLL(fake)
    pynvml.nvmlInit()
    return pynvml


def used_mib(fake: str | None) -> dict[int, int]:
    """Each GPU's used MiB, as NVML says."""
    nv = nvml(fake)
    return {i: int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used) // MIB
            for i in range(nv.nvmlDeviceGetCount())}


def fake_state(fake: str | None, line: str) -> None:
    """Fake mode: one directive appended to the fake library's state file (beside it)."""
    if fake:
        with open(Path(fake).parent / "fakenvml.state", "a") as fh:
            fh.write(line + "\n")


def fake_memory(fake: str | None, pid: int, gib: float, gpu: int) -> None:
    """Fake mode: the memory a CUDA context would have, keyed by host PID as NVML does."""
    fake_state(fake, f"proc {gpu} {pid} {int(gib * 1024)}")


def fake_node(devices: str) -> None:
    """Fake mode: the node the fake holders open, the first that `devices` (a glob) names."""
    os.environ["GPU_CHECK_NODE"] = sorted(
        str(p) for p in Path(devices).parent.glob(Path(devices).name))[0]


def stat_rest(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the name (state first); None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 1:].split()


def alive(pid: int) -> bool:
    """There and not a zombie (reaped or not, a zombie holds nothing)."""
    rest = stat_rest(pid)
    return bool(rest) and rest[0] not in ("Z", "X")
