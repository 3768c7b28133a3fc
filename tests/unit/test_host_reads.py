"""The one stall -> skip -> retry policy (host/reads.Reader) with real forked workers: reads
that stall on a chosen PID, the end passing, an exception in the worker; and the run's reads
(Reads) on a fake /proc where one process's file is a FIFO nobody writes, a read that hangs
as on a hung FUSE mount."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pveclean.core.discovery import stall_problem
from pveclean.core.records import GpuDevices, Holder, Scope
from pveclean.core.stopping import NotProven
from pveclean.host import worker
from pveclean.host.clock import start_deadline
from pveclean.host.reads import Reader, Unread, stalled_on
from pveclean.host.runreads import Reads
from pveclean.host.worker import Worker, WorkerError

STALL = 0.3


# ---- read in the worker: module-level, so that a request names them ------------------------
def read_pids(pids: list[int], wedged: list[int], skip: frozenset[int], stall: float | None
              ) -> list[int]:
    """Each PID announced before it is read; reading one in `wedged` never ends."""
    done = []
    for pid in pids:
        if pid in skip:
            continue
        worker.note(("pid", pid), stall)
        if pid in wedged:
            time.sleep(60)
        done.append(pid)
    return done


def mark_pids(pids: list[int], wedged: list[int], skip: frozenset[int], stall: float | None
              ) -> list[int]:
    """read_pids, announcing each PID by a mark (as gpus' host readers do)."""
    done = []
    for pid in pids:
        if pid in skip:
            continue
        worker.mark(pid)
        if pid in wedged:
            time.sleep(60)
        done.append(pid)
    return done


def plain(pids: list[int], wedged: list[int]) -> list[int]:
    """A read that takes no skip: each PID noted with the stall bound all the same."""
    return read_pids(pids, wedged, frozenset(), STALL)


def sleeps(*_skip_and_stall: object) -> None:
    time.sleep(60)  # no note: only the end bounds it


def raises(text: str) -> None:
    raise ValueError(text)


def echo(value: Any) -> Any:
    return value


# ---- the policy --------------------------------------------------------------------------
@pytest.fixture
def problems() -> list[str]:
    return []


@pytest.fixture
def reader(problems: list[str]) -> Iterator[Reader]:
    r = Reader(Worker(), STALL, problems, "not looked at")
    yield r
    r.close()


def test_a_stall_on_one_pid_skips_it_names_it_and_asks_again(reader: Reader,
                                                             problems: list[str]) -> None:
    t0 = time.monotonic()
    got = reader.call(read_pids, [1, 2, 3], [2], end=t0 + 10, what="reading")
    assert got == [1, 3]
    assert time.monotonic() - t0 < 10 / 2
    assert reader.skip == {2}
    assert problems == [stall_problem(2, STALL, "not looked at")]
    assert problems[0].startswith("PID 2: reading its /proc files did not finish within 0.3 s")
    assert reader.worker.started == 2 and len(reader.worker.killed) == 1


def test_each_wedged_pid_costs_one_retry(reader: Reader, problems: list[str]) -> None:
    got = reader.call(read_pids, [5, 6, 7, 8], [6, 8], end=time.monotonic() + 10, what="r")
    assert got == [5, 7]
    assert reader.skip == {6, 8} and len(problems) == 2
    assert reader.worker.started == 3


def test_a_skipped_pid_stays_skipped_for_the_next_read(reader: Reader,
                                                       problems: list[str]) -> None:
    reader.call(read_pids, [1, 2], [2], end=time.monotonic() + 10, what="first")
    assert reader.call(read_pids, [2, 3], [2], end=time.monotonic() + 10, what="then") == [3]
    assert len(problems) == 1 and reader.worker.started == 2  # no second stall


def test_a_stall_by_mark_is_pinned_to_its_pid_too(problems: list[str]) -> None:
    with Worker(marks=True) as wk:
        reader = Reader(wk, STALL, problems, "not looked at")
        got = reader.call(mark_pids, list(range(100, 200)), [150], end=time.monotonic() + 10,
                          what="marks")
    assert got == [p for p in range(100, 200) if p != 150]
    assert problems == [stall_problem(150, STALL, "not looked at")]


def test_the_end_passing_is_unread_with_what_it_was_doing(reader: Reader,
                                                          problems: list[str]) -> None:
    t0 = time.monotonic()
    with pytest.raises(Unread) as err:
        reader.call(sleeps, end=t0 + 0.4, what="reading the host's processes")
    assert time.monotonic() - t0 < 0.4 + 0.5
    assert err.value.hung and err.value.doing == "it was starting"
    assert str(err.value) == ("reading the host's processes: did not finish in time "
                              "(it was starting)")
    assert problems == [] and reader.skip == set()


def test_a_read_that_takes_no_skip_is_not_asked_again(reader: Reader,
                                                      problems: list[str]) -> None:
    with pytest.raises(Unread) as err:
        reader.call(plain, [1, 2], [2], end=time.monotonic() + 10, what="parents",
                    skipping=False)
    assert err.value.hung and err.value.doing == "it was reading /proc/2"
    assert str(err.value) == "parents: stalled (it was reading /proc/2)"
    assert problems == [] and reader.skip == set() and reader.worker.started == 1


def test_an_exception_in_the_worker_is_unread_and_the_worker_lives_on(reader: Reader) -> None:
    with pytest.raises(Unread) as err:
        reader.call(raises, "bad value", end=time.monotonic() + 5, what="identity check",
                    skipping=False)
    assert not err.value.hung
    assert str(err.value) == "identity check failed: ValueError: bad value"
    assert reader.call(echo, 7, end=time.monotonic() + 5, what="again", skipping=False) == 7
    assert reader.worker.started == 1


def test_a_retry_that_cannot_be_sent_did_not_finish_in_time(reader: Reader,
                                                            problems: list[str]) -> None:
    reader.send(read_pids, [1, 2], [2], end=time.monotonic() + 10, what="reading CT 129")
    wk = reader.worker

    def refuse(*_a: Any, what: str, **_k: Any) -> None:
        raise WorkerError(what, "the worker did not take the request in time")

    wk.send = refuse  # type: ignore[method-assign]  # the fresh worker takes nothing
    with pytest.raises(Unread) as err:
        reader.receive()
    assert str(err.value) == "reading CT 129 did not finish in time"
    assert problems == [stall_problem(2, STALL, "not looked at")]


def test_a_request_past_its_end_is_unread_at_once(reader: Reader) -> None:
    with pytest.raises(Unread) as err:
        reader.send(echo, 1, end=time.monotonic() - 1, what="late")
    assert err.value.hung
    assert str(err.value) == "late: the worker did not take the request in time (it was starting)"
    with pytest.raises(RuntimeError):
        reader.receive()  # nothing was sent


def test_two_reads_under_way_are_answered_in_order_across_a_retry(reader: Reader,
                                                                  problems: list[str]) -> None:
    end = time.monotonic() + 10
    reader.send(read_pids, [1, 2, 3], [2], end=end, what="first")
    reader.send(echo, "second", end=end, what="second", skipping=False)
    assert reader.receive() == [1, 3]
    assert reader.receive() == "second"  # asked again on the fresh worker
    assert len(problems) == 1


def test_forget_reads_past_the_answers_under_way(reader: Reader) -> None:
    reader.send(echo, "unwanted", end=time.monotonic() + 5, what="a", skipping=False)
    reader.forget()
    assert reader.call(echo, "wanted", end=time.monotonic() + 5, what="b",
                       skipping=False) == "wanted"


def test_stalled_on_only_a_stall_pinned_to_a_pid() -> None:
    assert stalled_on(WorkerError("x", "stalled", ("pid", 42), stalled=True)) == 42
    assert stalled_on(WorkerError("x", "stalled", ("nvml", "init"), stalled=True)) is None
    assert stalled_on(WorkerError("x", "did not finish in time", ("pid", 42))) is None


# ---- the run's reads on a fake /proc with a read that hangs --------------------------------
def fake_process(proc: Path, pid: int, starttime: int = 500, cgroup: str = "/lxc/129/ns"
                 ) -> Path:
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (python3) S 1 " + " ".join(["0"] * 17)
                            + f" {starttime} 0 0\n")
    (d / "status").write_text(f"Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t{pid}\t{pid - 90}\n")
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    return d


def wedge(d: Path, name: str = "stat") -> None:
    """A FIFO nobody writes: opening it blocks, as a read on a hung mount does."""
    (d / name).unlink()
    os.mkfifo(d / name)


def scope_of(tmp_path: Path, pids: list[int]) -> Scope:
    ct = tmp_path / "cg" / "lxc" / "129"
    (ct / "ns").mkdir(parents=True)
    (ct / "cgroup.procs").write_text("")
    (ct / "ns" / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return Scope(129, ct, GpuDevices({os.stat("/dev/null").st_rdev: "/dev/nvidia0"},
                                     frozenset()), frozenset(), running=True)


def holder(pid: int, starttime: int = 500) -> Holder:
    return Holder(host_pid=pid, starttime=starttime, ct_pid=pid - 90, name="python3",
                  exe=None, argv=(), uid=0, user="root", state="S", ppid=1,
                  cgroup="/lxc/129/ns", sources={"nvml"})


@pytest.fixture
def reads() -> Iterator[Reads]:
    with Worker() as nvml, Reads(nvml, start_deadline(20), STALL, nvml_on=False,
                                 nvml_timeout=5) as r:
        yield r


def test_identities_skip_a_wedged_pid_and_check_the_rest(proc: Path, tmp_path: Path,
                                                         reads: Reads) -> None:
    for pid in (100, 101, 102):
        fake_process(proc, pid)
    wedge(proc / "101")
    fake_process(proc, 103, starttime=999)  # the PID now belongs to another process
    fake_process(proc, 104, cgroup="/system.slice/x.service")
    hs = [holder(100), holder(101), holder(102), holder(103), holder(104)]
    got = reads.identities(hs, scope_of(tmp_path, []), time.monotonic() + 10)
    assert [None if r is None else r.text for r in got] == [
        None, "reading its /proc files hung; not signalled", None,
        "PID was reused by another process; not signalled",
        "left the container's cgroup tree; not signalled"]
    assert [None if r is None else r.reason for r in got] == [
        None, NotProven.UNCHECKED, None, NotProven.REUSED, NotProven.LEFT_TREE]
    assert reads.problems == [stall_problem(101, STALL, "not scanned, not signalled")]


def test_identities_past_the_deadline_signal_nobody(proc: Path, tmp_path: Path,
                                                    reads: Reads) -> None:
    fake_process(proc, 100)
    got = reads.identities([holder(100)], scope_of(tmp_path, []), time.monotonic() - 1)
    assert [r and r.text for r in got] == [
        "identity check did not finish before the deadline; not signalled"]
    assert reads.problems == ["identity check did not finish before the deadline: "
                              "it was starting"]


def test_the_scan_skips_a_wedged_pid_and_sees_the_rest(proc: Path, tmp_path: Path,
                                                       reads: Reads) -> None:
    for pid in (200, 201, 202):
        fake_process(proc, pid)
    wedge(proc / "201", "status")
    got = reads.rescan(scope_of(tmp_path, [200, 201, 202]), set(), time.monotonic() + 10)
    assert got is not None
    view, nvml_pids = got
    assert sorted(view.statuses) == [200, 202] and set(view.tree) == {200, 201, 202}
    assert nvml_pids == set()
    assert reads.problems == [stall_problem(201, STALL, "not scanned, not signalled")]


def test_a_scan_past_the_deadline_is_none_with_its_reason(proc: Path, tmp_path: Path,
                                                          reads: Reads) -> None:
    assert reads.rescan(scope_of(tmp_path, []), set(), time.monotonic() - 1) is None
    (problem,) = reads.problems
    assert problem.startswith("verification scan did not finish within ")
    assert problem.endswith(" s of the run: it was starting")


def test_other_reads_say_what_they_did_not_finish(reads: Reads) -> None:
    assert reads.call(echo, 5, end=time.monotonic() + 5, what="parents") == 5
    assert reads.call(raises, "oops", end=time.monotonic() + 5, what="parents") is None
    assert reads.call(sleeps, end=time.monotonic() + 0.3, what="probe holders") is None
    assert reads.problems == ["parents failed: ValueError: oops",
                              "probe holders did not finish: it was starting"]
    assert len(reads.killed) == 1
