"""One GPU's reset through the driver's own tool (`nvidia-smi -r -i <PCI id>`), with its
host services stopped and its persistence mode off around it, and both given back on every
path: success, the tool's failure, its deadline, Ctrl-C and SIGTERM.

The order is NVIDIA's (NVSentinel's GPU reset): persistence mode off for that GPU alone
(with nvidia-persistenced running NVML hands the change to the daemon, which closes the
GPU's node), the services that hold the GPU stopped, the reset; then the services started
again and the mode turned back on (the daemon, running again, takes the change). While the
restore runs SIGINT and SIGTERM wait: a second Ctrl-C cannot leave a service stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

KILL_WAIT = 2.0  # s to wait for a killed tool; one wedged in the driver is left to it
OUTPUT_CAP = 4096


class Outcome(StrEnum):
    DONE = "reset"  # the tool said it reset the GPU
    FAILED = "failed"  # the tool failed (its output says why)
    TIMEOUT = "timeout"  # it did not finish within its deadline: killed
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM
    ABORTED = "aborted"  # a step before the reset failed: nothing reset


@dataclass(frozen=True)
class Step:
    """One thing done, for the report: what, whether it worked, and what was said."""

    what: str
    ok: bool
    detail: str = ""
    restore: bool = False  # a step that gives back what was changed

    def as_dict(self) -> dict[str, object]:
        return {"step": self.what, "ok": self.ok, "detail": self.detail}


@dataclass
class Ops:
    """How each step is done on the host (tests hand in their own).

    persistence(index) -> on, or None when NVML did not say; set_persistence(index, on) ->
    None, or why not; systemctl(verb, unit) -> None, or why not; reset(address, timeout)
    -> (Outcome, what the tool said)."""

    persistence: Callable[[int], bool | None]
    set_persistence: Callable[[int, bool], str | None]
    systemctl: Callable[[str, str], str | None]
    reset: Callable[[str, float], tuple[Outcome, str]]


@dataclass
class Result:
    outcome: Outcome
    steps: list[Step] = field(default_factory=list)

    @property
    def restored(self) -> bool:
        """Every service started again and the persistence mode given back."""
        return all(s.ok for s in self.steps if s.restore)


class _Interrupted(Exception):
    """SIGTERM during the reset, raised where the reset waits."""


@contextlib.contextmanager
def _term_interrupts() -> Iterator[None]:
    def on_term(_sig: int, _frame: object) -> None:
        raise _Interrupted

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def _signals_wait() -> Iterator[None]:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _prepare(ops: Ops, index: int, services: list[str], res: Result,
             undo: list[str]) -> bool:
    """Persistence off, then the services stopped; each noted in `undo` before it is tried
    (putting back what was not changed does no harm). False: a step failed."""
    was_on = ops.persistence(index)
    if was_on is None:
        res.steps.append(Step("persistence mode", False, "NVML did not say; not reset"))
        return False
    if was_on:
        undo.append("persistence")
        why = ops.set_persistence(index, False)
        res.steps.append(Step("persistence mode off", why is None, why or ""))
        if why is not None:
            return False
    for unit in services:
        undo.append(unit)
        why = ops.systemctl("stop", unit)
        res.steps.append(Step(f"stop {unit}", why is None, why or ""))
        if why is not None:
            return False
    return True


def _restore(ops: Ops, index: int, undo: list[str], res: Result) -> None:
    for unit in reversed([u for u in undo if u != "persistence"]):
        why = ops.systemctl("start", unit)
        res.steps.append(Step(f"restore: start {unit}", why is None, why or "", True))
    if "persistence" in undo:
        why = ops.set_persistence(index, True)
        res.steps.append(Step("restore: persistence mode on", why is None, why or "", True))


def guarded_reset(ops: Ops, index: int, address: str, services: list[str],
                  timeout: float) -> Result:
    """Reset GPU `index` (`address`: the PCI id the tool is given) with `services` stopped
    and persistence off around it; both restored on every path. A Ctrl-C is the outcome
    INTERRUPTED (the caller exits 130 once the report is written)."""
    res = Result(Outcome.ABORTED)
    undo: list[str] = []
    with _term_interrupts():
        try:
            try:
                if _prepare(ops, index, services, res, undo):
                    outcome, said = ops.reset(address, timeout)
                    res.outcome = outcome
                    res.steps.append(Step("reset", outcome is Outcome.DONE, said))
            except (KeyboardInterrupt, _Interrupted):
                res.outcome = Outcome.INTERRUPTED
                res.steps.append(Step("reset", False, "interrupted: Ctrl-C or SIGTERM"))
            finally:
                with _signals_wait():
                    _restore(ops, index, undo, res)
        except (KeyboardInterrupt, _Interrupted):  # one that waited for the restore
            res.outcome = Outcome.INTERRUPTED
    return res


# ---- the host's own steps ---------------------------------------------------------------
def run_tool(argv: list[str], timeout: float) -> tuple[Outcome, str]:
    """Run the reset tool in its own session, bounded by `timeout`; killed past it (a tool
    wedged in the driver is left after KILL_WAIT: the reset is then TIMEOUT)."""
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return Outcome.FAILED, f"{argv[0]}: {exc.strerror or exc}"
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(p)
        return Outcome.TIMEOUT, f"{' '.join(argv)} did not finish within {timeout:g} s: killed"
    except BaseException:
        _kill(p)
        raise
    said = out.decode("utf-8", "replace")[-OUTPUT_CAP:].strip()
    return (Outcome.DONE if p.returncode == 0 else Outcome.FAILED,
            said or f"exit status {p.returncode}")


def _kill(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(p.pid, signal.SIGKILL)
    end = time.monotonic() + KILL_WAIT
    while p.poll() is None and time.monotonic() < end:
        time.sleep(0.05)


def systemctl(command: str, verb: str, unit: str, timeout: float = 60.0) -> str | None:
    """`systemctl VERB UNIT`: None when it worked, else what it said."""
    outcome, said = run_tool([command, verb, unit], timeout)
    return None if outcome is Outcome.DONE else said
