"""The parent's side of every read made in a forked worker, by one policy: a PID whose
reads stall is skipped, named, and the read asked again without it until its end; whatever
else keeps an answer away (the end, a dead worker, an exception there) is an Unread. One
run's reads over this transport (the scan's and NVML's) are host/runreads.Reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pveclean.core.discovery import doing, stall_problem
from pveclean.host import worker
from pveclean.host.worker import RemoteError, WorkerError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

UNBOUNDED_READ = 30.0  # s: a read's bound when the caller sets no end (tests, in-process use)


def _left(end: float | None) -> float:
    return UNBOUNDED_READ if end is None else max(end - time.monotonic(), 0.0)


def stalled_on(exc: WorkerError) -> int | None:
    """The PID a worker's stall is pinned to (its last note or mark), or None: the end
    passed, or the worker died."""
    n = exc.note
    if exc.stalled and n is not None and n[0] == "pid" and isinstance(n[1], int):
        return n[1]
    return None


class Unread(Exception):
    """A read that gave no answer: it `hung` (its end passed, the worker died or did not take
    the request: `doing` says what it was on), or it raised in the worker (a bug: said,
    never a traceback). str() is the problem as `gpus` names it."""

    def __init__(self, what: str, exc: WorkerError | RemoteError, resent: bool = False) -> None:
        self.what, self.exc, self.resent = what, exc, resent
        self.hung = isinstance(exc, WorkerError)
        self.doing = doing(exc.note) if isinstance(exc, WorkerError) else ""
        if not self.hung:
            message = f"{what} failed: {exc}"
        elif resent:  # asked again after a stall, and that could not be sent
            message = f"{what} did not finish in time"
        else:
            message = f"{exc} ({self.doing})"
        super().__init__(message)

    def __reduce__(self) -> tuple[type[Unread], tuple[str, WorkerError | RemoteError, bool]]:
        return type(self), (self.what, self.exc, self.resent)


@dataclass(frozen=True)
class _Asked:
    """One call asked of a worker: the function, its arguments and its end."""

    fn: Callable[..., object]
    args: tuple[object, ...]
    end: float | None
    what: str
    skipping: bool


class Reader:
    """Reads in one forked worker, by the one stall policy. A read asked with `skipping` gets
    the PIDs to skip and the stall bound as its last two arguments, fn(*args, skip, stall),
    and announces each PID before reading its files (worker.note or worker.mark). When the
    worker stalls on one PID past `stall` (a process wedged in the GPU driver blocks a read of
    its maps or cmdline; a hung FUSE or NFS mount), the PID joins `skip`, is named in
    `problems` with `consequence`, and the read is asked again without it, until its end
    (monotonic; None: UNBOUNDED_READ). Anything else that keeps the answer away raises Unread
    and loses the worker's other reads under way."""

    def __init__(self, wk: worker.Worker, stall: float, problems: list[str], consequence: str,
                 min_wait: float = 0.0) -> None:
        self.worker, self.stall, self.problems = wk, stall, problems
        self.consequence = consequence
        self.min_wait = min_wait  # s a receive() waits at least: an answer already there
        self.skip: set[int] = set()
        self._asked: list[_Asked] = []  # sent, not yet received; oldest first

    def send(self, fn: Callable[..., object], *args: object, end: float | None, what: str,
             skipping: bool = True) -> None:
        """Ask and go on (so that two workers work at once); receive() takes the answers,
        oldest first. Unread when the worker does not take the request."""
        asked = _Asked(fn, args, end, what, skipping)
        try:
            self._ask(asked)
        except WorkerError as exc:
            raise Unread(what, exc) from None
        self._asked.append(asked)

    def _ask(self, a: _Asked) -> None:
        extra = (frozenset(self.skip), self.stall) if a.skipping else ()
        self.worker.send(a.fn, *a.args, *extra, timeout=_left(a.end), what=a.what)

    def receive(self) -> Any:
        """The answer to the oldest send() not yet received, asked again without each PID that
        stalled; Unread when there is none by its end."""
        if not self._asked:
            raise RuntimeError("Reader.receive() without a send()")  # a bug of the caller
        a = self._asked[0]
        while True:
            try:
                value = self.worker.receive(max(_left(a.end), self.min_wait), a.what,
                                            stall=self.stall)
                self._asked.pop(0)
                return value
            except RemoteError as exc:  # the worker lives on: the others are still under way
                self._asked.pop(0)
                raise Unread(a.what, exc) from None
            except WorkerError as exc:  # the worker was killed: every read under way is lost
                pid = stalled_on(exc) if a.skipping else None
                if pid is None:
                    self._asked.clear()
                    raise Unread(a.what, exc) from None
                self.skip.add(pid)
                self.problems.append(stall_problem(pid, self.stall, self.consequence))
            try:
                for again in self._asked:
                    self._ask(again)
            except WorkerError as exc:
                self._asked.clear()
                raise Unread(a.what, exc, resent=True) from None

    def call(self, fn: Callable[..., T], *args: object, end: float | None, what: str,
             skipping: bool = True) -> T:
        """send() and receive(): the answer, or Unread."""
        self.send(fn, *args, end=end, what=what, skipping=skipping)
        value: T = self.receive()
        return value

    def forget(self) -> None:
        """Nobody will receive the reads under way: the worker reads past their answers."""
        self.worker.forget()
        self._asked.clear()

    def close(self) -> None:
        self.worker.close()
