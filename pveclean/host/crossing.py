"""What a forked worker's call ends in when it gives no answer (see worker.py): WorkerError
when the worker did not answer, RemoteError when the function raised there, and how such an
exception crosses the pipe whole. Both pickle with their fields, as psutil's exceptions do.
"""

from __future__ import annotations

import pickle

Note = tuple[str, object]  # what a worker says it is on: ("pid", 4242), ("nvml", "init")


class WorkerError(Exception):
    """The worker did not answer: it hung (past the deadline or stalled) or died. `what`: the
    call's name; `why`: what became of it ("stalled", "did not finish in time", ...)."""

    def __init__(self, what: str, why: str, note: Note | None = None,
                 stalled: bool = False) -> None:
        super().__init__(f"{what}: {why}")
        self.what, self.why = what, why
        self.note = note  # the last note: what it was doing
        self.stalled = stalled  # stuck past a note's allowance, not the call's deadline

    def __reduce__(self) -> tuple[type[WorkerError], tuple[str, str, Note | None, bool]]:
        return type(self), (self.what, self.why, self.note, self.stalled)


class RemoteError(Exception):
    """The called function raised in the worker: `exc` the exception itself (None when it
    could not cross), `type_name` its type's name, `text` its message; str() is
    `Type: text`. See worker.py's docstring."""

    def __init__(self, type_name: str, text: str, exc: BaseException | None = None) -> None:
        super().__init__(f"{type_name}: {text}")
        self.type_name, self.text, self.exc = type_name, text, exc

    def __reduce__(self) -> tuple[type[RemoteError], tuple[str, str, BaseException | None]]:
        return type(self), (self.type_name, self.text, self.exc)

    def message(self, *expected: type[BaseException]) -> str:
        """The error as the admin reads it: the text alone when the worker raised one of the
        `expected` types (its message is written for the admin), else `Type: text`."""
        return self.text if isinstance(self.exc, expected) else str(self)


def crossing(exc: BaseException) -> bytes | None:
    """The exception pickled, when it comes back whole from its pickle; else None."""
    try:
        body = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(body)
    except Exception:
        return None
    return body


def arrived(type_name: str, text: str, body: bytes | None) -> RemoteError:
    """The parent's RemoteError for an ERROR message (an exception that does not unpickle
    here, its module not importable say, arrives as its name and text)."""
    exc: BaseException | None = None
    if body is not None:
        try:
            exc = pickle.loads(body)
        except Exception:
            exc = None
    return RemoteError(type_name, text, exc if isinstance(exc, BaseException) else None)
