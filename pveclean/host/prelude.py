"""The start of a run, overlapped (`ct`, and the pre-stop and post-stop hooks): the run's
NVML worker is forked first thing, and imports nvidia-ml-py and the NVML adapter and gets
NVML ready while the parent imports the run and reads the config.

Importing nvidia-ml-py and initialising NVML are a fixed cost of every run on a running
container (the import alone about 40 ms in the lab, near what the parent spends on all of
the run's modules; NVML's init takes seconds on a host without nvidia-persistenced) that
needs nothing from the parent but the config's `nvml_library`. So __main__ forks the worker
before it imports the run, the worker imports at once, and inits NVML as soon as the parent
has read the config.
__main__ makes the one NvmlWorker of a command; the command warms it with the config and hands
its worker to cleanup.clean. This module imports nothing but the worker at first: it is
imported before the fork.
"""

from __future__ import annotations

import contextlib
import sys

from pveclean.host import worker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.config import Config


NVML_PHASES = ("pre-stop", "post-stop")  # the hook phases that ask NVML


def forks_early(argv: list[str]) -> bool:
    """Does this command line ask NVML for sure, so that its worker is forked at once: `ct`,
    `gpus` (whose worker reads the host too, see _prepare), and the pre-stop and post-stop
    hooks (a start asks NVML nothing unless something is left in the container)?"""
    return argv[:1] in (["ct"], ["gpus"]) or (len(argv) == 3 and argv[0] == "hook"
                                              and argv[2] in NVML_PHASES)


_EARLY: list[NvmlWorker] = []  # the run's worker, when forked at once (one per run)


def early_worker() -> worker.Worker | None:
    """The run's worker forked at start-up, for a command not handed it (`gpus`); None when
    none was (a caller that is no run's entry point: a test, another command)."""
    return _EARLY[0].worker if _EARLY else None


class NvmlWorker:
    """The run's NVML worker: made once at the entry point, handed to the command, closed at
    the exit. With `early` it is forked now, before the command's imports; else on its first
    call, if there is one."""

    def __init__(self, early: bool = False) -> None:
        self.early = early
        self.worker = worker.Worker(_prepare)
        if early:
            # Out of processes or memory: not here, before the command's error handling; the
            # fork is tried again by warm(), where a failure is said in the command's one line.
            with contextlib.suppress(OSError):
                self.worker.start()
            _EARLY[:] = [self]

    def warm(self, cfg: Config, vmid: int) -> worker.Worker:
        """The worker with the config's NVML settings (a worker started again after a kill
        gets them too). One forked early also inits NVML now, while the parent goes on (its
        first call reads past it), unless there is nothing left in the container (a run then
        asks NVML nothing, see cgroupfs.nothing_left)."""
        from pveclean.host import cgroupfs
        from pveclean.host.nvml import Nvml, w_warm

        settings = Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)
        self.worker.init.update(settings)
        if self.early:
            root = cfg.cgroup_root or cgroupfs.cgroup2_root()
            idle = cgroupfs.nothing_left(cgroupfs.container_cgroup(root, vmid),
                                         cgroupfs.monitor_running(root, vmid))
            self.worker.submit(w_warm, settings, not idle, timeout=1.0, what="NVML init")
        return self.worker

    def close(self) -> None:
        self.worker.close()
        if _EARLY and _EARLY[0] is self:
            _EARLY.clear()

    def __enter__(self) -> NvmlWorker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _prepare() -> None:
    """In the worker, once: its calls are NVML's (the host scan has a worker of its own,
    forked later from the parent, see host/runreads.py). For `pveclean gpus` (its command
    line, sys.argv) the worker reads the host too (commands/gpulook.py): the scan's modules
    are imported here, while the parent imports typer and reads the config."""
    with contextlib.suppress(ImportError):  # no nvidia-ml-py: the run says so, as ever
        import pynvml  # noqa: F401
    from pveclean.host import nvml  # noqa: F401

    if sys.argv[1:2] == ["gpus"]:
        from pveclean.core import gpufaults, notjudged, vmguard  # noqa: F401
        from pveclean.host import hostscan, procscan  # noqa: F401
