"""A run as an object: how it is asked for (RunOptions), the run before its lock (Asked) and
under it (Run). cleanup.py carries a Run out; what its stop loop did is core/stopping.py's
Stopped (imported for a stop only)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pveclean.core.config import Config
from pveclean.core.records import Deadline, Scope

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.host.freezer import Freezer
    from pveclean.host.runreads import Reads
    from pveclean.proxmox.pveconf import CtConfig

Progress = Callable[[str], None]
OnlyGpus = tuple[frozenset[int], frozenset[int]]  # (NVML indices, /dev/nvidiaN minors)


@dataclass(frozen=True)
class RunOptions:
    """How a run is asked for: by `pveclean ct`, a hook phase, status, a VM's hand-off."""

    phase: str = "manual"
    dry_run: bool = False
    grace: float | None = None  # None: the config's grace_seconds
    write_report: bool = True
    stop_units: bool = False  # stop the holders' units before any signal
    only: OnlyGpus | None = None  # only holders of these GPUs count (make_scope)
    progress: Progress | None = None
    # told the number of holders discovery found, instead of progress's "found N" line
    on_found: Callable[[int], None] | None = None


@dataclass(frozen=True)
class Asked:
    """A run asked for, its container's config read: what it is before its lock."""

    vmid: int
    cfg: Config
    opts: RunOptions
    ctconf: CtConfig
    deadline: Deadline  # keeps reserve_for(cfg) back for the report: work_end
    started: float  # time.time() at the start: the report's

    def running(self, scope: Scope, reads: Reads, freezer: Freezer) -> Run:
        return Run(self.vmid, self.cfg, self.opts, self.ctconf, self.deadline, self.started,
                   scope, reads, freezer)


@dataclass(frozen=True)
class Run(Asked):
    """One run on one container, under its lock: what each step reads and tells. `reads` is
    the run's transport; `freezer` holds the tree still (host/freezer.py: its docstring is
    the protocol)."""

    scope: Scope
    reads: Reads
    freezer: Freezer

    @property
    def grace(self) -> float:
        return self.cfg.grace_seconds if self.opts.grace is None else self.opts.grace

    def say(self, text: str) -> None:
        if self.opts.progress:
            self.opts.progress(text)

    def found(self, holders: int) -> None:
        """Discovery found `holders`: told as a number where asked (a hook's task log), never
        as text to be read back."""
        if self.opts.on_found is not None:
            self.opts.on_found(holders)
        else:
            self.say(f"found {holders} GPU holder(s) in CT {self.vmid}")

