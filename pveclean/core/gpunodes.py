"""Which GPU a device number is: the N of /dev/nvidiaN, a node of the driver's that is no single
GPU's (nvidiactl, nvidia-uvm, nvidia-caps), or one that ties to neither. A run's scan and
`pveclean gpus`' map both ask it, so it stays light: no records (the map's Nodes is
core/gpumap.py's; a run's scan needs the GPUs' minors only, and each record costs every hook
run its import)."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from pveclean.core.lazyre import lazy
from pveclean.core.records import GpuDevices

_NODE = lazy(r"nvidia(\d+)")
NVIDIA_MAJOR = 195  # /dev/nvidiaN, nvidia-modeset (254), nvidiactl (255) on every host


# ---- device numbers ---------------------------------------------------------------------
def makedev(major: int, minor: int) -> int:
    """os.makedev without the os module: glibc's encoding of a device number."""
    return ((minor & 0xFF) | ((major & 0xFFF) << 8) | ((minor & ~0xFF) << 12)
            | ((major & ~0xFFF) << 32))


def major_minor(rdev: int) -> tuple[int, int]:
    """os.major and os.minor of a device number (glibc's encoding)."""
    major = ((rdev >> 8) & 0xFFF) | ((rdev >> 32) & 0xFFFFF000)
    minor = (rdev & 0xFF) | ((rdev >> 12) & 0xFFFFFF00)
    return major, minor


Sorted = tuple[frozenset[int], bool, frozenset[int]]  # minors, shared, untied: see gpumap.Nodes


def sort_nodes(rdevs: Iterable[int], devices: GpuDevices) -> Sorted:
    """What a process's GPU device numbers are: the N of each /dev/nvidiaN (one GPU each),
    whether it holds a node of no single GPU (nvidiactl, nvidia-uvm, nvidia-caps), and the
    device numbers that can be tied to neither (a GPU major whose node this host lacks)."""
    minors: set[int] = set()
    untied: set[int] = set()
    shared = False
    for rdev in rdevs:
        path = devices.rdevs.get(rdev)
        major, minor = major_minor(rdev)
        n = _NODE.fullmatch(posixpath.basename(path)) if path else None
        if n:
            minors.add(int(n.group(1)))
        elif path is not None or (major == NVIDIA_MAJOR and minor >= 254):
            shared = True  # a node of the driver's, of no single GPU
        elif major == NVIDIA_MAJOR:
            minors.add(minor)  # /dev/nvidiaN on any host
        else:
            untied.add(rdev)
    return frozenset(minors), shared, frozenset(untied)


def gpu_minors(rdevs: Iterable[int], devices: GpuDevices) -> frozenset[int]:
    """The N of each /dev/nvidiaN among a process's device numbers."""
    return sort_nodes(rdevs, devices)[0]
