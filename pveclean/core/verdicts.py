"""A run's verdicts, the outcomes of its holders, the rules that decide a verdict and the exit
code each verdict means."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from pveclean.errors import ExitCode


class Verdict(StrEnum):
    """What a run concludes about one container."""

    CLEAN = "clean"
    NOTHING_TO_DO = "nothing-to-do"
    DRY_RUN = "dry-run"
    DEFERRED = "deferred"  # pre-stop of a clean shutdown: recorded, left to the guest
    RESIDUAL = "residual"
    LEAKED = "leaked"
    # the holders were stopped, but NVML did not answer for the memory they had (a process
    # list that failed, hung or is not supported on their GPU, per-process memory "not
    # available", NVML down): neither clean nor leaked (issue 38)
    NOT_JUDGED = "not-judged"
    ERROR = "error"
    BUSY = "busy"


class Outcome(StrEnum):
    """What became of one holder."""

    TERMINATED = "terminated"  # exited within the grace after SIGTERM
    KILLED = "killed"  # exited after SIGKILL (or after the grace)
    SURVIVED = "survived"  # still there at the deadline, or appeared after the last round
    # signalled, and at the deadline in the kernel's exit (PF_EXITING, or SIGKILL pending):
    # not a survivor the run could stop, a process whose memory comes back once it is gone
    EXITING = "exiting"
    PROTECTED = "protected"  # never signalled (see Holder.protected)
    EXITED = "exited"  # gone before its identity was proven: nothing to signal
    SKIPPED = "skipped"  # not proven to be the process that was found: not signalled
    WOULD_STOP = "would-stop"  # a dry run's holder


VERDICT_EXIT: dict[str, ExitCode] = {
    Verdict.CLEAN: ExitCode.OK,
    Verdict.NOTHING_TO_DO: ExitCode.OK,
    Verdict.DRY_RUN: ExitCode.OK,
    Verdict.DEFERRED: ExitCode.OK,
    Verdict.RESIDUAL: ExitCode.RESIDUAL,
    Verdict.LEAKED: ExitCode.RESIDUAL,
    Verdict.NOT_JUDGED: ExitCode.NOT_JUDGED,
    Verdict.ERROR: ExitCode.ACCESS,
    Verdict.BUSY: ExitCode.BUSY,
}

VERDICTS = tuple(Verdict)
STOPPED = frozenset({Outcome.TERMINATED, Outcome.KILLED})
# holders a run leaves behind (an exiting one too: not clean until it is gone)
REMAINING = frozenset({Outcome.SURVIVED, Outcome.PROTECTED, Outcome.EXITING})
UNTROUBLED = frozenset({Verdict.CLEAN, Verdict.NOTHING_TO_DO})  # verdicts that vouch for all


def exit_code(verdict: str) -> ExitCode:
    """The exit code of a verdict (a verdict this version does not know: OK)."""
    return VERDICT_EXIT.get(verdict, ExitCode.OK)


def after_stop(verified: bool, outcomes: list[Outcome | None]) -> Verdict:
    """A cleanup's verdict: clean only when the verification held and no holder remains."""
    if verified and not any(o in REMAINING for o in outcomes):
        return Verdict.CLEAN
    return Verdict.RESIDUAL


def with_problems(verdict: Verdict, problems: list[str]) -> Verdict:
    """Part of the tree could not be read: a clean or empty result cannot be vouched for."""
    return Verdict.RESIDUAL if problems and verdict in UNTROUBLED else verdict


def with_unjudged(verdict: Verdict, reasons: Sequence[str]) -> Verdict:
    """Memory NVML did not answer for (`reasons`, one per GPU or for NVML as a whole): a
    clean or empty result is `not-judged`, never `clean`; a worse one stays."""
    return Verdict.NOT_JUDGED if reasons and verdict in UNTROUBLED else verdict


def with_leaks(verdict: Verdict, leaks: Sequence[object]) -> Verdict:
    """A post-stop that finds memory no process holds: leaked, unless already worse (what
    NVML did show on one GPU outweighs what it did not answer for on another)."""
    return Verdict.LEAKED if leaks and (verdict in UNTROUBLED
                                        or verdict is Verdict.NOT_JUDGED) else verdict
