"""A GPU's persistence mode through NVML: read it, and set it for one GPU alone.

With nvidia-persistenced running, NVML hands a change to the daemon, which closes the GPU's
device node when the mode goes off and opens it again when it comes back on. The daemon's open
node is what makes the driver's unbind of that GPU (nv_pci_remove) wait for ever, so a GPU
handed to a VM has persistence turned off for it alone, and back on when it comes back.
Setting the mode needs root: NVML answers NO_PERMISSION otherwise.
"""

from __future__ import annotations

from types import ModuleType

from pveclean.host import worker
from pveclean.host.nvml import Nvml, NvmlUnavailable, nvml_allowance

ENABLED = 1  # NVML_FEATURE_ENABLED
DISABLED = 0  # NVML_FEATURE_DISABLED


def persistence_mode(nv: Nvml, index: int, timeout: float | None = None) -> bool:
    """Whether GPU `index` has persistence mode on (NvmlUnavailable: NVML did not say)."""
    mode: int = nv.device_call(index, "persistence mode",
                               lambda lib, h: lib.nvmlDeviceGetPersistenceMode(h), timeout)
    return mode == ENABLED


def set_persistence_mode(nv: Nvml, index: int, enabled: bool,
                         timeout: float | None = None) -> None:
    """Turns GPU `index`'s persistence mode on or off, and only that GPU's."""

    def call(lib: ModuleType, h: object) -> None:
        lib.nvmlDeviceSetPersistenceMode(h, ENABLED if enabled else DISABLED)

    nv.device_call(index, "persistence mode change", call, timeout)


# ---- in a worker (module-level: they pickle) ------------------------------------------------
def w_persistence_mode(index: int, timeout: float) -> tuple[bool | None, str | None]:
    """GPU `index`'s mode, or None and why NVML did not say."""
    worker.note(("nvml", "persistence mode"), nvml_allowance(timeout))
    try:
        return persistence_mode(Nvml.in_worker(worker.state()), index, timeout), None
    except NvmlUnavailable as exc:
        return None, str(exc)


def w_set_persistence_mode(index: int, enabled: bool, timeout: float) -> str | None:
    """None once GPU `index`'s mode is set, else why it is not."""
    worker.note(("nvml", "persistence mode change"), nvml_allowance(timeout))
    try:
        set_persistence_mode(Nvml.in_worker(worker.state()), index, enabled, timeout)
    except NvmlUnavailable as exc:
        return str(exc)
    return None
