"""The stop policy: after each look at the container (a rescan), what the run does next.

A pure step function, decide: (what the look saw, where the loop stands, its limits, the
deadline's clock) -> the next step and where the loop stands after it. Every step of the stop
loop is decided here: a chase round, the late probe's round (late_chase, before a look), the
full settling look, the verdict; cleanup.stop_and_verify only carries the steps out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.records import Holder, HostView, ProcIdentity

POLL_INTERVAL = 0.02  # rescans while verifying: a walk, and /proc of new processes only
SETTLE = 0.05  # a clean result must hold this long, so a respawn racing us is seen


class Step(StrEnum):
    CHASE = "chase"  # new holders appeared: stop them in the next round
    RESPAWNED = "respawned"  # new holders, but the rounds (or the time) are spent: survived
    SETTLED = "settled"  # clean for SETTLE (or too little time left to wait): done
    SURVIVORS = "survivors"  # holders still live: stop() already waited for them; done
    LOST = "lost"  # the rescan did not finish: nothing to vouch for; done
    POLL = "poll"  # look again after `wait`
    TIME_UP = "time-up"  # the run's time for verifying is spent; done
    # clean on looks that skipped the processes known to hold nothing: before a verdict, one
    # look reads them all, frozen as every look (a non-holder may have been passed a GPU fd,
    # or opened one while hopping between fresh cgroups: only a tree held still shows it)
    FULL_LOOK = "full-look"
    LATE_CHASE = "late-chase"  # the late probe named holders of its own: a round for them


@dataclass(frozen=True)
class Look:
    """What one rescan saw (None stands for a rescan that did not finish)."""

    live: int  # holders not protected, still there
    new: int  # of them, the ones no round has handled yet
    nvml: int  # processes of ours NVML still lists (it frees memory a little after an exit)
    protected: int  # protected holders, still there: never signalled, never verified away


@dataclass(frozen=True)
class Verifying:
    """Where the stop loop stands before a look."""

    rounds_used: int = 0
    clean_since: float | None = None  # when the container first looked clean, if it does
    full: bool = False  # this look reads every process (the settling look)


@dataclass(frozen=True)
class Limits:
    """What bounds the loop: the chase rounds allowed and when the time for verifying ends
    (`end`, on the deadline's clock); `partial_looks`: looks skip the processes discovery saw
    holding nothing (known_idle), so a clean one is settled by a full look."""

    rounds_allowed: int
    end: float
    partial_looks: bool = False


@dataclass(frozen=True)
class Decision:
    """The step the loop takes next, and what it knows when it takes it."""

    step: Step
    clean_since: float | None = None  # when the container first looked clean, if it does
    verified: bool = False  # SETTLED only: the GPUs were seen free of every holder
    wait: float = 0.0  # POLL only: seconds before the next look


def chase_late(pending: int, expired: bool) -> bool:
    """Holders only the late probe saw are stopped in a round of their own, while time is left
    (they do not count against the rounds: the probe was not in time for the first)."""
    return pending > 0 and not expired


NO_GRACE = ("no SIGTERM: more holders appeared than the round before signalled (processes "
            "that multiply when asked to stop); SIGKILL with the tree frozen")


def with_grace(new: int, signalled: int) -> bool:
    """Whether a chase round's `new` holders get SIGTERM and the grace: not when they
    outnumber the holders the round before signalled. A holder that forks children on SIGTERM
    would double with every round (and every run) while it is asked; killed frozen, none of
    them runs again. A respawn (one worker for one) keeps its SIGTERM."""
    return new <= signalled


def gets_grace(d: Decision, new: int, signalled: int) -> bool:
    """Whether the round after `d` sends its `new` holders SIGTERM and waits the grace: a
    CHASE round as with_grace says, the late probe's round always."""
    return d.step is Step.LATE_CHASE or with_grace(new, signalled)


def known_idle(view: HostView | None) -> dict[int, int] | None:
    """The processes discovery saw holding nothing (PID -> start time): a verification look
    does not read their fds and maps again (the settling look does). None: no view."""
    if view is None:
        return None
    return {pid: st.starttime for pid, st in view.statuses.items() if pid not in view.holders}


def next_step(look: Look | None, at: Verifying, limits: Limits, now: float, expired: bool
              ) -> Decision:
    """The next step after a look at `now` (on the deadline's clock); `expired`: the run's
    deadline has passed."""
    if look is None:
        return Decision(Step.LOST)
    if look.new:
        if at.rounds_used < limits.rounds_allowed and not expired:
            return Decision(Step.CHASE)
        return Decision(Step.RESPAWNED)
    end = limits.end
    if not look.live and not look.nvml:
        since = now if at.clean_since is None else at.clean_since
        if now - since >= SETTLE or end - now < SETTLE:
            if limits.partial_looks and not at.full and not look.protected:
                return Decision(Step.FULL_LOOK, since)
            return Decision(Step.SETTLED, since, verified=not look.protected)
    elif look.live:
        return Decision(Step.SURVIVORS)
    else:
        since = None  # only NVML still lists our exited processes: poll until it lets go
    if end - now <= 0:
        return Decision(Step.TIME_UP, since)
    return Decision(Step.POLL, since, wait=min(POLL_INTERVAL, max(end - now, 0.0)))


def after(at: Verifying, d: Decision) -> Verifying:
    """Where the loop stands for the look after decision `d`: a full look follows FULL_LOOK
    only; a chase round starts over, one more round used. A full look that was due when the
    late probe's holders came (LATE_CHASE) is still due: the round's first look is full."""
    if d.step is Step.CHASE:
        return Verifying(at.rounds_used + 1)
    if d.step is Step.LATE_CHASE:
        return Verifying(at.rounds_used + 1, full=at.full)
    return Verifying(at.rounds_used, d.clean_since, full=d.step is Step.FULL_LOOK)


def decide(look: Look | None, at: Verifying, limits: Limits, now: float, expired: bool
           ) -> tuple[Decision, Verifying]:
    """The step function: the decision after a look, and where the loop stands after it."""
    d = next_step(look, at, limits, now, expired)
    return d, after(at, d)


def late_chase(pending: int, expired: bool) -> Decision | None:
    """Before a look: a round for the late probe's `pending` holders (chase_late), or None;
    after() says where the loop stands then."""
    return Decision(Step.LATE_CHASE) if chase_late(pending, expired) else None


def look_at(rescan: tuple[HostView, set[int]] | None, handled: set[ProcIdentity]
            ) -> tuple[Look | None, list[Holder]]:
    """What a rescan (its view and the NVML PIDs of ours) saw, and the holders no round has
    handled yet: they are the next round's."""
    if rescan is None:
        return None, []
    view, nvml_pids = rescan
    live = [h for h in view.holders.values() if not h.protected]
    new = [h for h in live if h.identity not in handled]
    return Look(live=len(live), new=len(new), nvml=len(nvml_pids),
                protected=len(view.holders) - len(live)), new
