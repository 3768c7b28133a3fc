"""A GPU's MIG mode and its MIG devices left, through NVML, for `pveclean reset`: a GPU in
MIG mode is reset only once its instances are gone (nvidia-smi refuses otherwise, and the
instances' users would lose them)."""

from __future__ import annotations

from types import ModuleType

from pveclean.host import worker
from pveclean.host.nvml import Nvml, NvmlUnavailable, nvml_allowance

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED: a GPU without MIG
NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: no MIG device at that index
FUNCTION_NOT_FOUND = 13  # a driver before MIG: no such symbol
MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE


def _code(exc: Exception) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def mig_state(nv: Nvml, index: int, timeout: float | None = None) -> tuple[bool, int]:
    """(MIG mode on, MIG devices that exist) of GPU `index`; NvmlUnavailable: not told."""

    def call(lib: ModuleType, h: object) -> tuple[bool, int]:
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(h)
        except Exception as exc:
            if _code(exc) in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                return False, 0
            raise
        if current != MIG_ENABLE:
            return False, 0
        left = 0
        for i in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                lib.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except Exception as exc:
                if _code(exc) == NOT_FOUND:
                    continue
                raise
            left += 1
        return True, left

    got: tuple[bool, int] = nv.device_call(index, "MIG mode", call, timeout)
    return got


def w_mig_state(index: int, timeout: float) -> tuple[bool | None, int, str | None]:
    """In a worker: (MIG on, devices left, None), or (None, 0, why NVML did not say)."""
    worker.note(("nvml", "MIG mode"), nvml_allowance(timeout))
    try:
        on, left = mig_state(Nvml.in_worker(worker.state()), index, timeout)
    except NvmlUnavailable as exc:
        return None, 0, str(exc)
    return on, left, None
