"""The forked worker (host/worker.py): answers, errors, the deadline that kills and replaces it,
stall marks, the size bound, inherited fds, the prelude, and answers read past."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from pveclean.host import worker
from pveclean.host.worker import RemoteError, Worker, WorkerError


# ---- the worker on its own --------------------------------------------------------------
def _add(a: int, b: int) -> int:
    return a + b


def _sleep_forever() -> None:
    while True:
        time.sleep(1)


def _stall_on_second() -> None:
    worker.note(("pid", 1), 5.0)
    worker.note(("pid", 2), 0.2)
    _sleep_forever()


def _big(n: int) -> bytes:
    return b"x" * n


def _raises() -> None:
    raise ValueError("bad value")


def _fds() -> list[int]:
    return sorted(int(x) for x in os.listdir("/proc/self/fd"))


def test_worker_answers_and_reports_errors() -> None:
    with Worker() as w:
        assert w.call(_add, 2, 3, timeout=5, what="add") == 5
        with pytest.raises(RemoteError, match="ValueError: bad value"):
            w.call(_raises, timeout=5, what="raise")
        assert w.call(_add, 1, 1, timeout=5, what="again") == 2
        assert w.started == 1


def test_worker_is_killed_at_the_deadline_and_replaced() -> None:
    with Worker() as w:
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match="did not finish in time"):
            w.call(_sleep_forever, timeout=0.3, what="sleep")
        assert time.monotonic() - t0 < 0.3 + 0.3
        assert w.killed and w.pid is None
        assert w.call(_add, 1, 2, timeout=5, what="after") == 3  # a fresh worker
        assert w.started == 2


def test_a_stall_names_what_the_worker_was_doing() -> None:
    with Worker() as w:
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as err:
            w.call(_stall_on_second, timeout=10, what="scan")
        assert err.value.stalled and err.value.note == ("pid", 2)
        assert time.monotonic() - t0 < 0.2 + 0.3


def _marks_then_hangs() -> None:
    for pid in (1, 2, 3):
        worker.mark(pid)
        time.sleep(0.05 if pid < 3 else 60)


def _marks_quickly(n: int) -> int:
    for pid in range(n):
        worker.mark(pid)
        time.sleep(0.01)
    return n


def test_marks_pin_a_stall_to_what_the_worker_was_on_without_a_message_each() -> None:
    with Worker(marks=True) as w:
        assert w.call(_marks_quickly, 60, timeout=10, what="scan") == 60  # 0.6 s, 60 marks
        w.send(_marks_quickly, 60, timeout=10, what="scan")
        assert w.receive(10, "scan", stall=0.2) == 60  # each mark well inside the stall
        t0 = time.monotonic()
        w.send(_marks_then_hangs, timeout=10, what="scan")
        with pytest.raises(WorkerError) as err:
            w.receive(10, "scan", stall=0.3)
        assert err.value.stalled and err.value.note == ("pid", 3)
        assert time.monotonic() - t0 < 1.5
        assert w.call(_marks_quickly, 2, timeout=10, what="scan") == 2  # a fresh worker


def test_an_answer_over_the_size_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "MAX_ANSWER", 1000)
    with Worker() as w, pytest.raises(WorkerError, match="over the 1000 bound"):
        w.call(_big, 5000, timeout=5, what="big")


def test_worker_keeps_no_inherited_fd(tmp_path: Path) -> None:
    """Above all not the container lock's: a worker stuck in the kernel must not keep it."""
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    with Worker() as w:
        fds = w.call(_fds, timeout=5, what="fds")
        os.close(lock)  # our copy gone: the lock must be free although the worker lives
        other = os.open(tmp_path / "lock", os.O_RDWR)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the worker kept it
        os.close(other)
    assert len(fds) == 6, fds  # stdio (on /dev/null), two pipe ends, listdir's own fd


def _mark(path: str) -> None:
    with open(path, "a", encoding="ascii") as fh:
        fh.write(f"{os.getpid()}\n")


def _stall_in_init() -> None:
    worker.note(("nvml", "init"), 0.2)
    _sleep_forever()


def test_a_prelude_runs_in_the_first_worker_only(tmp_path: Path) -> None:
    """prelude.py's start-up work: once, in the first child, never again after a kill."""
    marks = tmp_path / "marks"
    w = Worker(lambda: _mark(str(marks))).start()
    try:
        first = w.pid
        assert w.call(_add, 1, 2, timeout=5, what="add") == 3  # after the prelude ran
        assert marks.read_text().split() == [str(first)]
        with pytest.raises(WorkerError):
            w.call(_sleep_forever, timeout=0.2, what="sleep")
        assert w.call(_add, 2, 2, timeout=5, what="again") == 4 and w.started == 2
        assert marks.read_text().split() == [str(first)]
    finally:
        w.close()


def test_a_submitted_answer_is_read_past_and_its_stall_bounds_the_next_call() -> None:
    with Worker() as w:
        w.submit(_add, 1, 1, timeout=5, what="warm")
        w.submit(_raises, timeout=5, what="warm")  # nobody waits for it: not raised
        assert w.call(_add, 2, 3, timeout=5, what="add") == 5
        w.submit(_stall_in_init, timeout=5, what="warm")
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as err:
            w.call(_add, 1, 2, timeout=10, what="memory")
        assert err.value.stalled and err.value.note == ("nvml", "init")
        assert time.monotonic() - t0 < 0.2 + 0.3  # its note's allowance, not the call's 10 s
        assert w.call(_add, 1, 2, timeout=5, what="after") == 3  # a fresh worker, no debt


def _nap_and_add(a: int, b: int) -> int:
    time.sleep(0.3)
    return a + b


def _meet(mine: str, theirs: str) -> bool:
    """Leave a mark, then wait (at most 10 s) for the other worker's: True only when both
    ran at once."""
    Path(mine).touch()
    end = time.monotonic() + 10
    while not Path(theirs).exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def test_two_workers_work_at_once_and_answers_come_in_order(tmp_path: Path) -> None:
    """send() and receive(): the run's NVML worker lists GPU processes while the scan's
    worker walks /proc (discover.Reads). Each answer goes to the send it belongs to."""
    a_mark, b_mark = str(tmp_path / "a"), str(tmp_path / "b")
    with Worker() as a, Worker() as b:
        a.send(_meet, a_mark, b_mark, timeout=15, what="a1")
        a.send(_add, 2, 2, timeout=15, what="a2")
        b.send(_meet, b_mark, a_mark, timeout=15, what="b")
        assert b.receive(15, "b") is True  # each saw the other's mark: both at work at once
        assert (a.receive(15, "a1"), a.receive(15, "a2")) == (True, 4)


def test_a_forgotten_answer_is_read_past() -> None:
    with Worker() as w:
        w.send(_nap_and_add, 1, 1, timeout=5, what="not needed")
        w.forget()
        assert w.call(_add, 5, 5, timeout=5, what="add") == 10
        with pytest.raises(RuntimeError, match="without a send"):
            w.receive(1, "nothing")  # a bug of the caller: not a hang, nothing killed
        assert w.started == 1 and not w.killed


# ---- errors cross the worker whole ---------------------------------------------------------
class _Unpicklable(Exception):
    """Holds a lock: it does not pickle, so it crosses as its name and text alone."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        import threading

        self.lock = threading.Lock()


class _NoUnpickle(Exception):
    """Pickles, but does not come back (its __init__ wants two arguments; args has one)."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a} {b}")


def _raise(exc: BaseException) -> None:
    raise exc


def _raise_unpicklable() -> None:
    raise _Unpicklable("cannot cross")


def _raise_no_unpickle() -> None:
    raise _NoUnpickle("half", "way")


def _report_error() -> None:
    from pveclean.host.reportfiles import ReportError

    raise ReportError("cannot write report in /x: No space left on device")


def _every_error() -> list[BaseException]:
    from pveclean.errors import ConfigError, ExitCode, PvecleanError
    from pveclean.host.lock import Busy
    from pveclean.host.nvml import NvmlUnavailable
    from pveclean.host.pcibind import BindError
    from pveclean.host.reads import Unread
    from pveclean.host.reportfiles import ReportError
    from pveclean.proxmox.pct import PctMissing

    hung = WorkerError("host scan", "stalled", ("pid", 42), stalled=True)
    remote = RemoteError("ValueError", "bad", ValueError("bad"))
    return [PvecleanError("no such container", ExitCode.USAGE), ConfigError("bad key"),
            ReportError("cannot write"), NvmlUnavailable("NVML init failed"),
            BindError("unbind failed"), hung, remote, RemoteError("X", "y"),
            Unread("host scan", hung), Unread("parents", remote),
            Unread("probe", hung, resent=True), Busy("held by PID 7"), PctMissing("pct")]


@pytest.mark.parametrize("exc", _every_error(), ids=lambda e: type(e).__name__)
def test_pveclean_s_errors_pickle_with_their_fields(exc: BaseException) -> None:
    import pickle

    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    fields = {k: v for k, v in vars(exc).items() if k != "exc"}
    assert {k: v for k, v in vars(back).items() if k != "exc"} == fields
    inner = getattr(exc, "exc", None)
    if inner is not None:
        assert type(back.exc) is type(inner) and str(back.exc) == str(inner)  # type: ignore[attr-defined]


def test_an_error_crosses_whole_and_is_the_cause() -> None:
    from pveclean.errors import ExitCode, PvecleanError

    with Worker() as w:
        with pytest.raises(RemoteError) as err:
            w.call(_raise, PvecleanError("gone", ExitCode.BUSY), timeout=5, what="raise")
        assert str(err.value) == "PvecleanError: gone"
        assert isinstance(err.value.exc, PvecleanError) and err.value.exc.exit_code == 5
        assert err.value.__cause__ is err.value.exc
        assert (err.value.type_name, err.value.text) == ("PvecleanError", "gone")


def test_an_error_that_cannot_cross_is_its_name_and_text() -> None:
    with Worker() as w:
        for fn, name, text in [(_raise_unpicklable, "_Unpicklable", "cannot cross"),
                               (_raise_no_unpickle, "_NoUnpickle", "half way")]:
            with pytest.raises(RemoteError) as err:
                w.call(fn, timeout=5, what="raise")
            assert str(err.value) == f"{name}: {text}" and err.value.exc is None
        assert w.started == 1  # the worker lives on


def test_an_expected_error_s_message_is_its_text_alone() -> None:
    from pveclean.host.reportfiles import ReportError

    with Worker() as w:
        with pytest.raises(RemoteError) as err:
            w.call(_report_error, timeout=5, what="report")
        assert err.value.message(ReportError) == ("cannot write report in /x: No space left "
                                                  "on device")
        with pytest.raises(RemoteError) as other:
            w.call(_raises, timeout=5, what="raise")
        assert other.value.message(ReportError) == "ValueError: bad value"


def test_a_hang_says_what_and_why_apart() -> None:
    with Worker() as w:
        with pytest.raises(WorkerError) as err:
            w.call(_sleep_forever, timeout=0.2, what="gpus")
        assert (err.value.what, err.value.why) == ("gpus", "did not finish in time")
        assert str(err.value) == "gpus: did not finish in time"
