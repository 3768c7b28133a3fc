"""host/freezer.py on a fake cgroup directory: a freeze is written, waited for within its
bound and said when it does not settle; a cgroup frozen by someone else is left alone; the
record of a run that died is thawed by the next run; the guard thaws when its run dies."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pveclean.host import cgroupfs, freezer
from pveclean.host.freezer import Freezer


def fake_cgroup(tmp_path: Path, frozen: str = "0", settles: bool = False) -> Path:
    cg = tmp_path / "lxc" / "129"
    cg.mkdir(parents=True)
    (cg / "cgroup.freeze").write_text(f"{frozen}\n")
    (cg / "cgroup.events").write_text(f"populated 1\nfrozen {int(settles)}\n")
    return cg


def test_hold_release_and_what_it_says(tmp_path: Path) -> None:
    cg = fake_cgroup(tmp_path, settles=True)
    state = tmp_path / "state"
    with Freezer(cg, str(state), 129) as fz:
        fz.hold()
        fz.hold()  # idempotent: one freeze
        assert cgroupfs.freeze_file(cg) == "1" and fz.frozen
        assert freezer.record_path(str(state), 129).read_text().startswith(f"PID {os.getpid()}")
        fz.release()
        assert cgroupfs.freeze_file(cg) == "0"
        fz.set(True)
    assert cgroupfs.freeze_file(cg) == "0"  # the exit thaws
    assert not freezer.record_path(str(state), 129).exists()
    assert fz.holds == 2 and fz.unsettled == 0
    assert fz.summary().startswith("frozen 2 time(s)"), fz.summary()


def test_a_freeze_that_does_not_settle_is_said_and_the_run_goes_on(tmp_path: Path) -> None:
    cg = fake_cgroup(tmp_path, settles=False)  # a task in D state: "frozen 0" stays
    t0 = time.monotonic()
    with Freezer(cg, str(tmp_path / "state"), 129, wait=0.05) as fz:
        fz.hold()
    assert time.monotonic() - t0 < 1.0
    assert fz.unsettled == 1 and "not every task stopped within 0.05 s" in fz.summary()
    assert cgroupfs.freeze_file(cg) == "0"


def test_a_container_frozen_by_someone_else_is_left_as_it_is(tmp_path: Path) -> None:
    cg = fake_cgroup(tmp_path, frozen="1")
    with Freezer(cg, str(tmp_path / "state"), 129) as fz:
        fz.hold()
    assert cgroupfs.freeze_file(cg) == "1" and fz.holds == 0
    assert fz.summary() == "not used: the container was frozen already"


def test_no_freezer_no_freeze(tmp_path: Path) -> None:
    cg = tmp_path / "gone"
    with Freezer(cg, str(tmp_path / "state"), 129) as fz:
        fz.hold()
    assert fz.summary().startswith("unavailable: no cgroup.freeze")
    with Freezer(cg, str(tmp_path / "state"), 129, enabled=False, why="not used: dry run") as fz:
        fz.hold()
    assert fz.summary() == "not used: dry run"


def test_the_next_run_thaws_what_a_dead_run_left_frozen(tmp_path: Path) -> None:
    cg = fake_cgroup(tmp_path, frozen="1")
    state = str(tmp_path / "state")
    rec = freezer.record_path(state, 129)
    rec.parent.mkdir(parents=True)
    rec.write_text("PID 4242 at 2026-12-03 19:00:00\n")
    with Freezer(cg, state, 129) as fz:
        assert fz.enabled  # thawed first: then it is ours to freeze
    assert fz.warnings == ["an earlier run (PID 4242 at 2026-12-03 19:00:00) froze CT 129 "
                           "and did not end its run; thawed now"]
    assert cgroupfs.freeze_file(cg) == "0" and not rec.exists()


def test_the_guard_thaws_when_its_run_dies_frozen(tmp_path: Path) -> None:
    cg = fake_cgroup(tmp_path, settles=True)
    state = str(tmp_path / "state")
    pid = os.fork()
    if pid == 0:  # the run: freezes and dies without a word (as SIGKILL would end it)
        try:
            Freezer(cg, state, 129).__enter__().hold()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    end = time.monotonic() + 5
    while cgroupfs.freeze_file(cg) != "0" and time.monotonic() < end:
        time.sleep(0.01)
    assert cgroupfs.freeze_file(cg) == "0"
    assert not freezer.record_path(state, 129).exists()


def test_no_guard_when_fork_fails_is_said_and_the_freeze_still_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cg = fake_cgroup(tmp_path, settles=True)

    def no_fork(*_a: object) -> tuple[int, int]:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(freezer, "_guard", no_fork)
    with Freezer(cg, str(tmp_path / "state"), 129) as fz:
        fz.hold()
        assert cgroupfs.freeze_file(cg) == "1"
    assert cgroupfs.freeze_file(cg) == "0"
    assert fz.warnings and fz.warnings[0].startswith("no guard for the freeze")
