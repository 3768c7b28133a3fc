"""The start of a run, overlapped (`ct`, and the pre-stop and post-stop hooks): the run's
worker is forked as soon as the run's modules are imported, and gets NVML ready while the
parent reads the config.

Importing nvidia-ml-py and initialising NVML are a fixed cost of every run on a running
container (about a fifth of a dry run's time in the lab; seconds on a host without
nvidia-persistenced) that needs nothing from the parent but the config's `nvml_library`. So
the worker imports the Python side at once and inits NVML as soon as the parent has read the
config, while the parent imports PyYAML and reads it.
"""

from __future__ import annotations

import contextlib

from . import worker
from .nvml import Nvml, nvml_allowance

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .config import Config


def begin() -> worker.Worker:
    """The run's worker, forked now; it imports nvidia-ml-py meanwhile."""
    return worker.Worker(_import_nvml).start()


def warm(wk: worker.Worker, cfg: Config, vmid: int) -> None:
    """Have the worker init NVML while the parent goes on (its first call reads past it)."""
    settings = Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)
    wk.init.update(settings)  # a worker started again after a kill gets them too
    wk.submit(w_warm_nvml, settings, cfg.cgroup_root, vmid, timeout=1.0, what="NVML init")


def _import_nvml() -> None:
    with contextlib.suppress(ImportError):  # no nvidia-ml-py: the run says so, as ever
        import pynvml  # noqa: F401


def w_warm_nvml(settings: dict[str, object], cgroup_root: str | None, vmid: int) -> None:
    """In the worker: NVML's init, unless there is nothing left in the container (the run
    then asks NVML nothing, see procfs.nothing_left)."""
    from . import procfs

    state = worker.state()
    state.update(settings)
    root = cgroup_root or procfs.cgroup2_root()
    if procfs.nothing_left(procfs.container_cgroup(root, vmid),
                           procfs.monitor_running(root, vmid)):
        return
    nv = Nvml.in_worker(state)
    worker.note(("nvml", "init"), nvml_allowance(nv.timeout))
    nv.warm()
