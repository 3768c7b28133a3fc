"""NVML over one run (host/runreads.NvmlSession): what it says when NVML hangs, raises, or
answers with an error, and that a hung NVML is asked nothing more."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from pveclean.core.records import GpuStatus, NvmlProcesses
from pveclean.host import worker
from pveclean.host.clock import start_deadline
from pveclean.host.runreads import PROCESSES, NvmlSession
from pveclean.host.worker import Worker


def w_hangs(_timeout: float) -> None:
    worker.note(("nvml", "process query"), 0.1)
    time.sleep(60)


def w_raises(_timeout: float) -> None:
    raise ValueError("boom")


def w_answers(_timeout: float) -> tuple[object, str | None]:
    return ({7: {0: 5}}, {1: ("lost", "handle: GpuIsLost")}), None


def w_says_why(_timeout: float) -> tuple[None, str]:
    return None, "NVML process query failed: Unknown (Unknown Error)"


@pytest.fixture
def session() -> Iterator[NvmlSession]:
    with Worker() as wk:
        yield NvmlSession(wk, start_deadline(20), 0.3, True, 5.0)


def _ask(s: NvmlSession, fn: Callable[[float], object]) -> NvmlProcesses | None:
    return s.processes(s.send(fn, time.monotonic() + 5, PROCESSES))


def test_a_hung_nvml_is_said_and_asked_no_more(session: NvmlSession) -> None:
    assert _ask(session, w_hangs) is None
    assert session.error == "NVML process query did not answer (stalled; its reader was killed)"
    assert not session.send(w_answers, time.monotonic() + 5, PROCESSES)


def test_an_exception_in_nvml_s_worker_is_said_with_its_type(session: NvmlSession) -> None:
    assert _ask(session, w_raises) is None
    assert session.error == "NVML process query failed: ValueError: boom"


def test_an_answer_is_the_typed_record_and_an_error_it_carries_is_kept(
        session: NvmlSession) -> None:
    assert _ask(session, w_answers) == NvmlProcesses(
        {7: {0: 5}}, {1: (GpuStatus.LOST, "handle: GpuIsLost")})
    assert session.error is None
    assert _ask(session, w_says_why) is None
    assert session.error == "NVML process query failed: Unknown (Unknown Error)"
    assert _ask(session, w_answers) is not None  # an error answer: NVML is asked again


def test_nvml_off_is_disabled_and_never_asked() -> None:
    with Worker() as wk:
        s = NvmlSession(wk, start_deadline(20), 0.3, False, 5.0)
        assert s.error == "disabled" and not s.send(w_answers, time.monotonic() + 5, PROCESSES)
        assert wk.started == 0
