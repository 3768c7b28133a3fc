"""The stop policy: the chase loop's next step, on hand-built looks, exhaustively."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pveclean.core.policy import (
    POLL_INTERVAL,
    SETTLE,
    Decision,
    Limits,
    Look,
    Step,
    Verifying,
    after,
    chase_late,
    decide,
    gets_grace,
    late_chase,
    look_at,
    next_step,
)
from pveclean.core.records import Deadline, Holder, HostView, ProcIdentity

NOW, END = 100.0, 110.0
CLEAN = Look(live=0, new=0, nvml=0, protected=0)


def step(look: Look | None, used: int = 0, allowed: int = 3, expired: bool = False,
         now: float = NOW, end: float = END, since: float | None = None) -> Decision:
    return next_step(look, Verifying(used, since), Limits(allowed, end), now, expired)


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
    d = next_step(look, Verifying(used, since), Limits(allowed, end), now, expired)
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


def test_a_clean_partial_look_is_settled_by_a_full_look() -> None:
    """Looks that skip known-idle processes settle only after one full look (SCM_RIGHTS)."""
    partial = Limits(3, END, partial_looks=True)
    d = next_step(CLEAN, Verifying(0, NOW - 1), partial, NOW, False)
    assert d == Decision(Step.FULL_LOOK, NOW - 1)
    at = after(Verifying(0, NOW - 1), d)
    assert at == Verifying(0, NOW - 1, full=True)
    assert next_step(CLEAN, at, partial, NOW, False) == Decision(Step.SETTLED, NOW - 1,
                                                                verified=True)
    # a protected holder still there: not verified, and no full look can change that
    prot = Look(live=0, new=0, nvml=0, protected=1)
    assert next_step(prot, Verifying(0, NOW - 1), partial, NOW, False).step is Step.SETTLED


def test_after_a_chase_the_loop_starts_over_with_one_more_round() -> None:
    at = Verifying(1, NOW, full=True)
    assert after(at, Decision(Step.CHASE)) == Verifying(2)
    assert after(at, Decision(Step.POLL, NOW, wait=0.02)) == Verifying(1, NOW)


def test_a_late_probe_round_is_decided_before_the_look_and_keeps_a_due_full_look() -> None:
    assert late_chase(pending=0, expired=False) is None
    assert late_chase(pending=2, expired=True) is None
    d = late_chase(pending=2, expired=False)
    assert d == Decision(Step.LATE_CHASE)
    assert after(Verifying(1, NOW, full=True), d) == Verifying(2, full=True)
    assert after(Verifying(0, NOW), d) == Verifying(1)
    assert gets_grace(Decision(Step.LATE_CHASE), new=9, signalled=1)
    assert not gets_grace(Decision(Step.CHASE), new=9, signalled=1)
    assert gets_grace(Decision(Step.CHASE), new=1, signalled=1)


def test_decide_walks_a_partial_run_to_its_settled_verdict_through_one_full_look() -> None:
    """The loop as stop_and_verify drives it: clean partial looks for SETTLE, then one full
    look; only then the verdict. A full look that finds NVML busy goes back to partial."""
    limits, at, now, seen = Limits(3, 1.0, partial_looks=True), Verifying(), 0.0, []
    while True:
        d, at = decide(CLEAN, at, limits, now, expired=False)
        seen.append(d.step)
        if d.step not in (Step.POLL, Step.FULL_LOOK):
            break
        now += d.wait
    assert seen == [Step.POLL] * 3 + [Step.FULL_LOOK, Step.SETTLED] and d.verified
    d, at = decide(Look(0, 0, 1, 0), Verifying(0, 0.0, full=True), limits, 0.1, False)
    assert d.step is Step.POLL and at == Verifying(0, None)


def test_a_deadline_hands_out_its_reserve() -> None:
    t = [10.0]
    dl = Deadline(5.0, lambda: t[0])
    kept = dl.keeping(0.5)
    assert (kept.start, kept.end, kept.work_end) == (10.0, 15.0, 14.5)
    assert dl.work_end == 15.0 and dl.reserve == 0.0  # the original keeps nothing back
    t[0] = 14.0
    assert kept.work_left() == pytest.approx(0.5) and kept.remaining() == pytest.approx(1.0)
    t[0] = 14.9
    assert kept.work_left() == 0.0 and not kept.expired()


@given(st.one_of(st.none(), looks), st.integers(0, 4), st.booleans(), st.booleans(),
       st.floats(0, 20), st.floats(0, 20), st.one_of(st.none(), st.floats(0, 20)))
def test_the_full_look_is_decided_where_the_inline_loop_took_it(
        look: Look | None, used: int, partial: bool, full: bool, now: float, end: float,
        since: float | None) -> None:
    """The old loop: `SETTLED and verified and quiet and not full` -> one more, full, look."""
    d = next_step(look, Verifying(used, since, full), Limits(3, end, partial), now, False)
    plain = next_step(look, Verifying(used, since), Limits(3, end), now, False)
    if plain.step is Step.SETTLED and plain.verified and partial and not full:
        assert d == Decision(Step.FULL_LOOK, plain.clean_since)
        assert after(Verifying(used, since, full), d) == Verifying(used, plain.clean_since, True)
    else:
        assert d == plain
