"""A slow release is not a leak: watching the GPU memory a run set out to free come back.

A real driver gives a dead process's GPU memory back some time after the process is gone
(0.4-0.8 s on an H100 for device memory alone; a process that pinned host memory spends
seconds unpinning it before its device files close), and NVML may show that memory under no
process meanwhile. So a stop is judged on the memory, per GPU, not only on NVML's process
list: `left` is the memory no process accounts for now beyond what none accounted for before
the run (at most what the run's holders had there). Memory that comes back is `released`
(after how long), memory still falling is `releasing`, memory that stays put for SETTLE_S
after every holder is gone, or is left when the release allowance ends, is `leaked`. Memory
NVML did not answer for (a GPU or process list with no answer, per-process memory "not
available") is `not-judged` with its reason: never leaked, never counted as 0.

A pure step function (`step`) on hand-built samples, as core/policy.py: the host's loop
(host/releasewatch.py) only asks NVML and sleeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pveclean.core.records import LEAK_SLACK_MIB, GpuMemory, GpuStatus, NvmlProcesses

SLACK_MIB = LEAK_SLACK_MIB  # the leak check's slack: allocator slack, contexts
SETTLE_S = 5.0  # memory that stays put this long after every holder is gone: leaked
POLL_S = 0.1  # between two looks at the memory
# How long after the last holder's exit a run waits for its memory by default (config
# `release_seconds`): vLLM's CI waits 30 s for GPU memory to go idle; SGLang measured 25.9 s
# for a process that pinned 243 GB of host memory. The real-GPU check (tests/gpu) measures it.
RELEASE_S = 30.0


class Release(StrEnum):
    """What became of the memory a run set out to free on one GPU."""

    RELEASED = "released"  # back (within SLACK_MIB)
    RELEASING = "releasing"  # still coming back when the run's time ended
    LEAKED = "leaked"  # stayed put for SETTLE_S after every holder was gone, or left at the end
    NOT_JUDGED = "not-judged"  # NVML did not answer for it: never leaked, never clean


@dataclass(frozen=True)
class Target:
    """One GPU's memory the run set out to free: its holders' MiB there, and the memory no
    process accounted for before the run (what is left after is measured above it)."""

    index: int
    uuid: str
    mib: int
    base_unaccounted: int


@dataclass(frozen=True)
class GpuRelease:
    """Where the memory of one GPU stands: `after_s` since the last holder's exit (released in,
    or left after), `left_mib` not back yet."""

    index: int
    uuid: str
    state: Release
    set_out_mib: int
    left_mib: int | None = None
    after_s: float | None = None
    reason: str | None = None
    base_mib: int | None = None  # memory no process accounted for before (None: unknown)
    changed_at: float | None = None  # the loop's: when `left` last fell

    @property
    def done(self) -> bool:
        return self.state in (Release.RELEASED, Release.LEAKED)

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"gpu": self.index, "uuid": self.uuid, "state": str(self.state),
                                "set_out_to_free_mib": self.set_out_mib,
                                "left_mib": self.left_mib, "after_s": self.after_s}
        if self.reason:
            d["reason"] = self.reason
        return d

    def line(self) -> str:
        """One line for a terminal, the task log and the report's warnings."""
        what = f"GPU {self.index}: {self.set_out_mib} MiB"
        if self.state is Release.RELEASED:
            return f"{what} released in {self.after_s} s"
        if self.state is Release.NOT_JUDGED:  # a holder's N/A figure: no MiB to say
            return (f"{what} not judged: {self.reason}" if self.set_out_mib else
                    f"GPU {self.index}: not judged: {self.reason}")
        return f"{what}: {self.left_mib} MiB {self.state} after {self.after_s} s"


def _per_gpu(holders: Sequence[Mapping[int, int | None]]) -> tuple[dict[int, int], set[int]]:
    """MiB per GPU over the holders' NVML figures, and the GPUs where one was N/A."""
    mib: dict[int, int] = {}
    na: set[int] = set()
    for per in holders:
        for i, m in per.items():
            if m is None:
                na.add(i)
            else:
                mib[i] = mib.get(i, 0) + m
    return mib, na


def targets(before: Sequence[GpuMemory] | None, holders: Sequence[Mapping[int, int | None]],
            others: Sequence[Mapping[int, int | None]]) -> list[GpuRelease]:
    """The memory a run sets out to free, one row per GPU its holders had memory on (NVML's
    figures before the stop): `releasing` to start with, `not-judged` where NVML did not
    answer (the GPU, or a per-process figure N/A)."""
    mine, mine_na = _per_gpu(holders)
    theirs, their_na = _per_gpu(others)
    rows = []
    for g in before or []:
        if g.index not in mine and g.index not in mine_na:
            continue
        mib = mine.get(g.index, 0)
        why = (f"GPU {g.index} is {g.status} ({g.reason})" if not g.ok else
               "NVML reports a holder's memory on it as not available" if g.index in mine_na
               else "NVML reports another process's memory on it as not available"
               if g.index in their_na else None)
        base = g.used_mib - mib - theirs.get(g.index, 0)
        rows.append(GpuRelease(g.index, g.uuid, Release.NOT_JUDGED if why else
                               Release.RELEASING, mib, reason=why,
                               base_mib=None if why else max(base, 0)))
    return rows


def left_now(row: GpuRelease, gpus: Sequence[GpuMemory] | None, procs: NvmlProcesses | None
             ) -> int | str:
    """MiB of `row`'s memory not back now (no process accounts for it beyond what none did
    before; at most what the holders had), or why NVML does not tell."""
    g = next((g for g in gpus or [] if g.index == row.index), None)
    if g is None or procs is None:
        return "NVML gave no answer"
    if not g.ok:
        return f"GPU {g.index} is {g.status} ({g.reason})"
    if row.index in procs.faults:
        status, reason = procs.faults[row.index]
        return f"its process list is {status} ({reason})"
    listed = [per[row.index] for per in procs.by_pid.values() if row.index in per]
    if any(m is None for m in listed):
        return "NVML reports a process's memory on it as not available"
    accounted = sum(m for m in listed if m is not None)
    return g.used_mib - accounted


def step(rows: Sequence[GpuRelease], gpus: Sequence[GpuMemory] | None,
         procs: NvmlProcesses | None, since_exit: float) -> list[GpuRelease]:
    """One look (`gpus`, `procs`, `since_exit` s after the last holder's exit) at the rows
    not done. A row NVML did not answer for at this look is not judged until one answers."""
    out = []
    t = round(max(since_exit, 0.0), 3)
    for r in rows:
        if r.done or r.base_mib is None:
            out.append(r)
            continue
        got = left_now(r, gpus, procs)
        if isinstance(got, str):
            out.append(dataclasses.replace(r, state=Release.NOT_JUDGED, reason=got, after_s=t))
            continue
        left = min(max(got - r.base_mib, 0), r.set_out_mib)
        if left <= SLACK_MIB:
            out.append(dataclasses.replace(r, state=Release.RELEASED, left_mib=0, after_s=t,
                                           reason=None))
            continue
        fell = r.left_mib is None or left < r.left_mib - SLACK_MIB
        changed = t if fell else (r.changed_at if r.changed_at is not None else t)
        stuck = t - changed >= SETTLE_S and not fell
        state = Release.LEAKED if stuck else Release.RELEASING
        out.append(dataclasses.replace(r, state=state, left_mib=left, after_s=t, reason=None,
                                       changed_at=changed))
    return out


def finished(rows: Sequence[GpuRelease]) -> bool:
    """Nothing left to wait for: every row released or leaked, or never judgeable."""
    return all(r.done or r.base_mib is None for r in rows)


def at_allowance_end(rows: Sequence[GpuRelease]) -> list[GpuRelease]:
    """The release allowance is spent: what is still not back is leaked."""
    return [dataclasses.replace(r, state=Release.LEAKED) if r.state is Release.RELEASING
            and r.left_mib else r for r in rows]


def falls(seen: Mapping[int, tuple[int, float]], now_mib: Mapping[int, int], now: float
          ) -> dict[int, tuple[int, float]]:
    """Post-stop's leak check, look after look: GPU index -> (MiB no process accounts for,
    when it last fell by more than SLACK_MIB); a GPU first seen counts from `now`."""
    out = {}
    for i, mib in now_mib.items():
        prev = seen.get(i)
        out[i] = (mib, now) if prev is None or mib < prev[0] - SLACK_MIB else (prev[0], prev[1])
    return out


def still(seen: Mapping[int, tuple[int, float]], now: float) -> bool:
    """Every GPU's unaccounted memory has stayed put for SETTLE_S: it is leaked."""
    return all(now - since >= SETTLE_S for _mib, since in seen.values())


def unsettled(rows: Sequence[GpuRelease]) -> list[GpuRelease]:
    """Rows not released: each is a line in the report's warnings."""
    return [r for r in rows if r.state is not Release.RELEASED]


def leaked(rows: Sequence[GpuRelease] | None) -> list[GpuRelease]:
    return [r for r in rows or [] if r.state is Release.LEAKED]


def not_judged(rows: Sequence[GpuRelease] | None) -> list[GpuRelease]:
    """Rows NVML did not answer for: the run's verdict is `not-judged` (never `clean`)."""
    return [r for r in rows or [] if r.state is Release.NOT_JUDGED]


def unlisted(gpus: Sequence[GpuMemory], why: str) -> NvmlProcesses:
    """No process list came back at all (it failed or hung): every GPU's list is a fault, so
    no GPU's used memory is judged a leak (`gpus`, metrics, the VM guard)."""
    return NvmlProcesses({}, {g.index: (GpuStatus.UNAVAILABLE, f"no process list: {why}")
                              for g in gpus})


# ---- a holder in the kernel's exit: waited for while it makes progress ---------------------
# What an exit's progress shows in, per look (None: not read): resident KiB, tasks (threads),
# CPU time in clock ticks (the kernel's teardown runs as the process: unpinning host memory
# is CPU time), and the MiB NVML still lists for it. A D-state wait (a FUSE flush, a driver
# waiting on the GPU) shows in none of them.
Marks = tuple[int | None, int | None, int | None, int | None]


@dataclass(frozen=True)
class InExit:
    """One signalled holder still there: whether it is in the kernel's exit, its last marks,
    when it was first seen still there and when its marks last showed progress (monotonic)."""

    exiting: bool
    marks: Marks
    first_s: float
    moved_s: float

    def stalled(self, now: float) -> float:
        """Seconds since it last made progress."""
        return round(now - self.moved_s, 3)


def progressed(before: Marks, now: Marks) -> bool:
    """Its memory (resident, NVML's) or its tasks fell, or it used CPU time."""
    rss, tasks, cpu, gpu = (((a, b) if a is not None and b is not None else None)
                            for a, b in zip(before, now, strict=True))
    return bool((rss and rss[1] < rss[0]) or (tasks and tasks[1] < tasks[0])
                or (cpu and cpu[1] > cpu[0]) or (gpu and gpu[1] < gpu[0]))


def exit_step(prev: InExit | None, exiting: bool, marks: Marks, now: float) -> InExit:
    """One look at a holder still there after its signals: progress (or its entering the
    exit) moves `moved_s` to `now`; a first look counts as progress."""
    if prev is None:
        return InExit(exiting, marks, now, now)
    moved = progressed(prev.marks, marks) or (exiting and not prev.exiting)
    return InExit(exiting, marks, prev.first_s, now if moved else prev.moved_s)


def exits_waited(watch: Mapping[int, InExit], now: float, allowance_end: float) -> bool:
    """Nothing more to wait for: every holder still there is in the kernel's exit and has
    made no progress for SETTLE_S, or the release allowance is spent. A holder not in exit
    (frozen, or not yet) is waited for until the deadline, as before."""
    return bool(watch) and all(
        w.exiting and (now - w.moved_s >= SETTLE_S or now >= allowance_end)
        for w in watch.values())


def exit_note(w: InExit, killed_at: float, exited_at: float | None, now: float) -> str:
    """The holder's line in the report: how long after its SIGKILL (`killed_at`) it was gone,
    or how long it has been in exit and since when it made no progress."""
    if exited_at is not None:
        return (f"gone {round(exited_at - killed_at, 3)} s after its SIGKILL: in the kernel's "
                "exit, waited for while it made progress")
    return (f"in the kernel's exit {round(now - killed_at, 3)} s after its SIGKILL; no "
            f"progress (memory, tasks, CPU time) for the last {w.stalled(now)} s: not waited "
            "for longer")
