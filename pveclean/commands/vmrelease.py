"""A VM's start and a slow release (issue 38): memory on the VM's GPUs that no process
accounts for, and that is still falling (a container's holders just stopped, the driver giving
it back), is waited for before the guard decides; memory still falling when the run's time is
spent is said as "N MiB still being released on GPU X", memory that stays put is a leak as
ever (core/vmguard.py's blocker)."""

from __future__ import annotations

import time
from collections.abc import Callable

from pveclean.core import release
from pveclean.core.gpumap import GpuMap
from pveclean.core.pci import PciAddress
from pveclean.core.records import Deadline

LOOK_EVERY = 0.5  # s between two looks at the host (each a whole `gpus` look)


def _leaking(gmap: GpuMap, addrs: set[PciAddress]) -> dict[int, int]:
    """GPU index -> MiB no process accounts for, of the VM's GPUs nothing else holds."""
    return {g.index: g.leak_mib for g in gmap.gpus
            if g.pci_bus_id in addrs and g.leak_mib and not g.processes}


def settle(gmap: GpuMap, addrs: list[PciAddress], look: Callable[[], GpuMap],
           deadline: Deadline) -> tuple[GpuMap, list[str]]:
    """Look again while the VM's GPUs' unaccounted memory falls, until it is gone, stays put
    for release.SETTLE_S, or 1 s of the run is left; the last look, and a line per GPU whose
    memory was still falling then."""
    wanted = set(addrs)
    seen: dict[int, tuple[int, float]] = {}
    while True:
        leaking = _leaking(gmap, wanted)
        now = time.monotonic()
        seen = release.falls(seen, leaking, now)
        if not leaking or release.still(seen, now) or deadline.remaining() < 1.0 + LOOK_EVERY:
            break
        time.sleep(LOOK_EVERY)
        gmap = look()
    return gmap, [f"{mib} MiB still being released on GPU {i}"
                  for i, (mib, since) in sorted(seen.items())
                  if i in leaking and now - since < release.SETTLE_S]
