"""The stop loop's records: where it stands (Loop), why a holder was not signalled (Rejection,
NotProven) and what the loop did (Stopped).

Imported by the stop loop only (cleanup.stop_and_verify), as core/policy.py is: a dry run and a
run with nothing to stop make neither, and each dataclass costs every hook run its import."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pveclean.core.records import Sent
from pveclean.core.verdicts import Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.policy import Verifying
    from pveclean.core.records import Holder, ProcIdentity


@dataclass
class Loop:
    """The stop loop's holders, PIDs known at the round's start, and where policy says it is."""

    holders: list[Holder]
    handled: set[ProcIdentity]
    known: set[int]
    quiet: dict[int, int] | None
    at: Verifying  # where the loop stands (core/policy.py)

    def add(self, h: Holder) -> None:
        self.handled.add(h.identity)
        self.holders.append(h)


class NotProven(StrEnum):
    """Why a holder was not signalled: it could not be proven the process that was found."""

    EXITED = "exited"  # gone before it was signalled: nothing to signal
    REUSED = "reused"  # its PID is another process's now
    LEFT_TREE = "left tree"  # no longer in the container's cgroup tree
    HOST_NAMESPACE = "host namespace"
    INIT = "init"  # the container's PID 1
    NO_DEVICE = "no device"  # no longer holds a GPU device
    UNCHECKED = "unchecked"  # its identity could not be checked (a read failed or hung)
    PIDFD = "pidfd"  # its pidfd could not be opened or signalled


@dataclass(frozen=True)
class Rejection:
    """Why one holder was not signalled, and the line its signal record shows for it."""

    reason: NotProven
    text: str

    @property
    def outcome(self) -> Outcome:
        return Outcome.EXITED if self.reason is NotProven.EXITED else Outcome.SKIPPED

    @property
    def note(self) -> Sent:
        return Sent(note=self.text)


@dataclass(frozen=True)
class Stopped:
    """What the stop loop did: every holder it handled, whether the GPUs were seen free, the
    chase rounds used, when (monotonic) the last holder exited and how long verification
    took after that (its pidfd readable)."""

    holders: list[Holder]
    verified: bool = False
    rounds: int = 0
    last_exit: float | None = None
    verify_s: float | None = None
