"""The stop policy: after each look at the container (a rescan), what the run does next.

A pure function of what the look saw, the rounds used and allowed, the deadline and since when
the container has looked clean; cleanup.stop_and_verify carries the steps out.
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


@dataclass(frozen=True)
class Look:
    """What one rescan saw (None stands for a rescan that did not finish)."""

    live: int  # holders not protected, still there
    new: int  # of them, the ones no round has handled yet
    nvml: int  # processes of ours NVML still lists (it frees memory a little after an exit)
    protected: int  # protected holders, still there: never signalled, never verified away


@dataclass(frozen=True)
class Decision:
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


def known_idle(view: HostView | None) -> dict[int, int] | None:
    """The processes discovery saw holding nothing (PID -> start time): a verification look
    does not read their fds and maps again (the settling look does). None: no view."""
    if view is None:
        return None
    return {pid: st.starttime for pid, st in view.statuses.items() if pid not in view.holders}


def next_step(look: Look | None, rounds_used: int, rounds_allowed: int, expired: bool,
              now: float, end: float, clean_since: float | None) -> Decision:
    """The next step after a look at `now` (on the deadline's clock); `end`: when the time for
    verifying ends; `expired`: the run's deadline has passed."""
    if look is None:
        return Decision(Step.LOST)
    if look.new:
        if rounds_used < rounds_allowed and not expired:
            return Decision(Step.CHASE)
        return Decision(Step.RESPAWNED)
    if not look.live and not look.nvml:
        since = now if clean_since is None else clean_since
        if now - since >= SETTLE or end - now < SETTLE:
            return Decision(Step.SETTLED, since, verified=not look.protected)
    elif look.live:
        return Decision(Step.SURVIVORS)
    else:
        since = None  # only NVML still lists our exited processes: poll until it lets go
    if end - now <= 0:
        return Decision(Step.TIME_UP, since)
    return Decision(Step.POLL, since, wait=min(POLL_INTERVAL, max(end - now, 0.0)))


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
