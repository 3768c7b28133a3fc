"""The start of a run, overlapped (`ct`, and the pre-stop and post-stop hooks): the run's
NVML worker is forked first thing, and imports nvidia-ml-py and the NVML adapter and gets
NVML ready while the parent imports the run and reads the config.

Importing nvidia-ml-py and initialising NVML are a fixed cost of every run on a running
container (the import alone about 40 ms in the lab, near what the parent spends on all of
the run's modules; NVML's init takes seconds on a host without nvidia-persistenced) that
needs nothing from the parent but the config's `nvml_library`. So __main__ forks the worker
before it imports the run, the worker imports at once, and inits NVML as soon as the parent
has read the config.
This module imports nothing but the worker: it is imported before the fork.
"""

from __future__ import annotations

import contextlib

from pveclean.host import worker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.config import Config


NVML_PHASES = ("pre-stop", "post-stop")  # the hook phases that ask NVML


def begin() -> worker.Worker:
    """The run's worker, forked now; it imports meanwhile (see _prepare)."""
    return worker.Worker(_prepare).start()


def begin_early() -> worker.Worker | None:
    """begin() for __main__, before a command's own error handling: None when the fork fails
    (out of processes or memory); the command then forks its worker itself where its errors
    are handled, and says why in one line if that fails too."""
    try:
        return begin()
    except OSError:
        return None


def _prepare() -> None:
    """In the worker, once: its calls are NVML's (the host scan has a worker of its own,
    forked later from the parent, see discover.Reads)."""
    with contextlib.suppress(ImportError):  # no nvidia-ml-py: the run says so, as ever
        import pynvml  # noqa: F401
    from pveclean.host import nvml  # noqa: F401


def warm(wk: worker.Worker, cfg: Config, vmid: int) -> None:
    """Give the worker its settings, and have it init NVML while the parent goes on (its
    first call reads past it) unless there is nothing left in the container (a run then asks
    NVML nothing, see procfs.nothing_left)."""
    from pveclean.host import cgroupfs
    from pveclean.host.nvml import Nvml, w_warm

    settings = Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)
    wk.init.update(settings)  # a worker started again after a kill gets them too
    root = cfg.cgroup_root or cgroupfs.cgroup2_root()
    idle = cgroupfs.nothing_left(cgroupfs.container_cgroup(root, vmid),
                               cgroupfs.monitor_running(root, vmid))
    wk.submit(w_warm, settings, not idle, timeout=1.0, what="NVML init")
