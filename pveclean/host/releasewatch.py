"""After a verified stop, the run watches the GPU memory it set out to free come back
(core/release.py judges each look; this loop only asks NVML and sleeps).

The watch ends when every GPU's memory is released or leaked, at the run's work end (a
hook's deadline is never passed: what is still falling then is `releasing`, and post-stop
judges it), or `release_seconds` after the last holder's exit (the allowance: what is left
then is `leaked`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from pveclean.core import release
from pveclean.core.records import GpuMemory, NvmlProcesses, SourceState
from pveclean.core.release import GpuRelease
from pveclean.core.verdicts import STOPPED, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.amendments import Leak
    from pveclean.core.records import Discovery
    from pveclean.core.run import Run
    from pveclean.core.stopping import Stopped
    from pveclean.host.pidfds import Described
    from pveclean.host.runreads import Reads


def describer(run: Run) -> Callable[[list[int]], dict[int, Described] | None]:
    """pidfds.stop's look at holders still there after their signals: their state and the
    marks of an exit's progress from /proc (in the scan's worker), with the MiB NVML still
    lists for each (None where NVML gives no answer)."""
    from pveclean.host import pidfds

    def look(pids: list[int]) -> dict[int, Described] | None:
        got = run.reads.call(pidfds.describe, pids, end=run.deadline.end,
                             what="survivors' state")
        procs = run.reads.processes(run.deadline.work_end) if got else None
        if not got or procs is None:
            return got
        mib = {pid: sum(m for m in per.values() if m is not None)
               for pid, per in procs.by_pid.items()}
        return {pid: dataclasses.replace(d, marks=(*d.marks[:3], mib.get(pid, 0)))
                for pid, d in got.items()}

    return look


def watch(reads: Reads, rows: list[GpuRelease], exited_at: float, end: float,
          allowance_end: float, say: Callable[[str], None] | None = None
          ) -> tuple[list[GpuRelease], list[GpuMemory] | None]:
    """Look at the memory every POLL_S until nothing is left to wait for or `end` (monotonic
    times); the rows as they stand and the last memory NVML gave (None: none). `say`: told
    once when the first look finds memory still on its way back."""
    last: list[GpuMemory] | None = None
    while True:
        gpus = reads.memory(end)
        procs = reads.processes(end) if gpus is not None else None
        now = time.monotonic()
        rows = release.step(rows, gpus, procs, now - exited_at)
        last = gpus if gpus is not None else last
        if release.finished(rows) or now + release.POLL_S >= end:
            break
        if say is not None:
            left = [r for r in rows if r.left_mib]
            say(f"waiting up to {end - now:.1f} s for {sum(r.left_mib or 0 for r in left)} MiB "
                f"on GPU(s) {', '.join(str(r.index) for r in left) or '?'} to be released")
            say = None
        time.sleep(release.POLL_S)
    if now + release.POLL_S >= allowance_end:
        rows = release.at_allowance_end(rows)
    return rows, last


def after_stop(run: Run, disc: Discovery, stopped: Stopped | None, asked: bool
               ) -> tuple[list[GpuMemory] | None, list[GpuRelease] | None]:
    """GPU memory after the run, and where the memory its stopped holders had stands (None:
    nothing was watched: no verified stop, or no memory of theirs NVML showed)."""
    reads, end = run.reads, run.deadline.work_end
    if not asked:
        return reads.before, None
    if stopped is None or not stopped.verified or stopped.last_exit is None:
        return reads.memory(end), None
    gone = [h.gpu_memory_mib for h in stopped.holders if h.outcome in STOPPED]
    rows = release.targets(reads.before, gone, [o.gpu_memory_mib for o in disc.other_holders])
    if not rows:
        return reads.memory(end), None
    allowance_end = stopped.last_exit + run.cfg.release_seconds
    rows, last = watch(reads, rows, stopped.last_exit, min(end, allowance_end), allowance_end,
                       run.say)
    return (last if last is not None else reads.memory(end)), rows


def unjudged(reads: Reads, disc: Discovery, so_far: Verdict) -> list[str]:
    """What NVML did not answer for: each GPU that may be the container's whose process list
    or memory it could not give, and, when holders were stopped (`so_far` clean), NVML itself
    when it was not used (failed, hung, absent): the memory they had is not judged."""
    out = list(dict.fromkeys(reads.unjudged))
    nvml = disc.sources.get("nvml")
    if so_far is Verdict.CLEAN and nvml is not None and not nvml.ok and nvml.state not in (
            SourceState.NOT_RUN, SourceState.DISABLED):
        out.append(f"NVML did not answer ({nvml}): the GPU memory of the stopped holders is "
                   "not judged")
    return out


Judge = Callable[[list[GpuMemory], NvmlProcesses], list["Leak"]]


def settled_leaks(reads: Reads, first: tuple[list[GpuMemory], NvmlProcesses], end: float,
                  judge: Judge) -> tuple[list[Leak], list[GpuMemory], NvmlProcesses]:
    """Post-stop's leak check with the release allowance: memory no process accounts for
    (`judge`: find_leaks) is looked at again every POLL_S while it falls; a leak is what
    stays put for SETTLE_S, or is left at `end` (the post-stop's deadline). The leaks and
    the last answers; a look NVML did not answer ends the wait with what was judged."""
    memory, procs = first
    seen: dict[int, tuple[int, float]] = {}
    while True:
        leaks = judge(memory, procs)
        now = time.monotonic()
        seen = release.falls(seen, {x.index: x.unaccounted_mib for x in leaks}, now)
        if not leaks or release.still(seen, now) or now + release.POLL_S >= end:
            return leaks, memory, procs
        time.sleep(release.POLL_S)
        again = reads.memory(end)
        more = reads.processes(end) if again is not None else None
        if again is None or more is None:
            return leaks, memory, procs
        memory, procs = again, more
