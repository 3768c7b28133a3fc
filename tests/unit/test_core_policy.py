"""The stop policy: the chase loop's next step, on hand-built looks, exhaustively."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pveclean.core.policy import (
    POLL_INTERVAL,
    SETTLE,
    Decision,
    Look,
    Step,
    chase_late,
    look_at,
    next_step,
)
from pveclean.core.records import Holder, HostView, ProcIdentity

NOW, END = 100.0, 110.0
CLEAN = Look(live=0, new=0, nvml=0, protected=0)


def step(look: Look | None, used: int = 0, allowed: int = 3, expired: bool = False,
         now: float = NOW, end: float = END, since: float | None = None) -> Decision:
    return next_step(look, used, allowed, expired, now, end, since)


def test_a_rescan_that_did_not_finish_ends_unverified() -> None:
    assert step(None) == Decision(Step.LOST)


def test_new_holders_are_chased_while_rounds_and_time_are_left() -> None:
    look = Look(live=2, new=1, nvml=0, protected=0)
    assert step(look, used=0, allowed=3).step is Step.CHASE
    assert step(look, used=2, allowed=3).step is Step.CHASE
    assert step(look, used=3, allowed=3).step is Step.RESPAWNED
    assert step(look, used=0, allowed=0).step is Step.RESPAWNED
    assert step(look, used=0, allowed=3, expired=True).step is Step.RESPAWNED
    assert not step(look, used=3).verified


def test_survivors_end_the_loop_unverified() -> None:
    d = step(Look(live=1, new=0, nvml=3, protected=1), since=99.0)
    assert d == Decision(Step.SURVIVORS)


def test_a_clean_look_must_hold_for_settle_before_it_is_verified() -> None:
    first = step(CLEAN)
    assert first == Decision(Step.POLL, NOW, wait=POLL_INTERVAL)
    later = step(CLEAN, now=NOW + SETTLE / 2, since=first.clean_since)
    assert later.step is Step.POLL and later.clean_since == NOW
    held = step(CLEAN, now=NOW + 2 * SETTLE, since=NOW)
    assert held == Decision(Step.SETTLED, NOW, verified=True)


def test_little_time_left_settles_at_once() -> None:
    d = step(CLEAN, now=END - SETTLE / 2)
    assert d == Decision(Step.SETTLED, END - SETTLE / 2, verified=True)


def test_protected_holders_settle_but_never_verify() -> None:
    d = step(Look(live=0, new=0, nvml=0, protected=2), now=NOW + 1, since=NOW)
    assert d.step is Step.SETTLED and not d.verified


def test_nvml_still_listing_ours_keeps_polling_and_resets_the_clean_clock() -> None:
    d = step(Look(live=0, new=0, nvml=1, protected=0), since=NOW - 5)
    assert d == Decision(Step.POLL, None, wait=POLL_INTERVAL)
    assert step(Look(0, 0, 1, 0), now=END) == Decision(Step.TIME_UP)
    assert step(Look(0, 0, 1, 0), now=END - 0.005).wait == pytest.approx(0.005)


def test_a_clean_clock_started_at_zero_still_counts() -> None:
    assert step(CLEAN, now=SETTLE, since=0.0).step is Step.SETTLED


def test_late_probe_holders_are_chased_only_while_time_is_left() -> None:
    assert chase_late(1, expired=False)
    assert not chase_late(1, expired=True)
    assert not chase_late(0, expired=False)


def reference(look: Look | None, used: int, allowed: int, expired: bool, now: float,
              end: float, since: float | None) -> tuple[str, bool, float | None]:
    """The chase loop's decision as cleanup wrote it inline, for comparison."""
    if look is None:
        return "done", False, since
    if look.new and used < allowed and not expired:
        return "chase", False, since
    if look.new:
        return "done", False, since
    if not look.live and not look.nvml:
        since = now if since is None else since
        if now - since >= SETTLE or end - now < SETTLE:
            return "done", not look.protected, since
    else:
        since = None
        if look.live:
            return "done", False, since
    if end - now <= 0:
        return "done", False, since
    return "poll", False, since


looks = st.builds(lambda live, extra, nvml, prot: Look(live + extra, live, nvml, prot),
                  st.integers(0, 3), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2))


@given(st.one_of(st.none(), looks), st.integers(0, 4), st.integers(0, 4), st.booleans(),
       st.floats(0, 20), st.floats(0, 20), st.one_of(st.none(), st.floats(0, 20)))
def test_the_policy_decides_as_the_inline_loop_did(
        look: Look | None, used: int, allowed: int, expired: bool, now: float, end: float,
        since: float | None) -> None:
    d = next_step(look, used, allowed, expired, now, end, since)
    kind, verified, clean_since = reference(look, used, allowed, expired, now, end, since)
    moving = {Step.CHASE: "chase", Step.POLL: "poll"}
    assert moving.get(d.step, "done") == kind
    assert d.verified == verified
    if d.step not in (Step.CHASE, Step.RESPAWNED, Step.SURVIVORS, Step.LOST):
        assert d.clean_since == clean_since
    if d.step is Step.POLL:
        assert 0 <= d.wait <= POLL_INTERVAL and d.wait <= max(end - now, 0)


def test_a_fake_clock_run_settles_after_settle_and_times_out_on_nvml() -> None:
    now, since, steps = 0.0, None, 0
    while True:
        d = step(CLEAN, now=now, end=1.0, since=since)
        steps += 1
        if d.step is not Step.POLL:
            break
        now, since = now + d.wait, d.clean_since
    assert d.step is Step.SETTLED and d.verified and now >= SETTLE
    assert steps == 4  # clean at 0, 0.02, 0.04: held at 0.06
    now = 0.0
    while (d := step(Look(0, 0, 1, 0), now=now, end=0.1)).step is Step.POLL:
        now += d.wait
    assert d.step is Step.TIME_UP and now == pytest.approx(0.1)


def make(pid: int, protected: str | None = None) -> Holder:
    return Holder(host_pid=pid, starttime=pid, ct_pid=None, name="x", exe=None, argv=(),
                  uid=0, user="root", state="S", ppid=1, cgroup="/lxc/1", protected=protected)


def test_look_at_counts_a_rescan_and_names_the_new_holders() -> None:
    hs = {1: make(1), 2: make(2), 3: make(3, "the container's PID 1")}
    view = HostView(holders=hs, statuses={}, tree={}, init_pid=3)
    look, new = look_at((view, {7, 8}), {ProcIdentity(1, 1)})
    assert look == Look(live=2, new=1, nvml=2, protected=1)
    assert [h.host_pid for h in new] == [2]
    assert look_at(None, set()) == (None, [])
    same_pid_new_start = look_at((HostView({1: make(1)}, {}, {}, None), set()),
                                 {ProcIdentity(1, 99)})
    assert same_pid_new_start[0] == Look(1, 1, 0, 0)
