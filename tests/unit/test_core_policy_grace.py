"""Which chase rounds get SIGTERM and a grace: not one whose holders outnumber those the
round before signalled (they multiply when asked to stop)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pveclean.core import policy


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_grace_unless_the_holders_multiplied(new: int, signalled: int) -> None:
    assert policy.with_grace(new, signalled) is (new <= signalled)


def test_a_respawn_keeps_its_sigterm_a_storm_does_not() -> None:
    assert policy.with_grace(1, 1)  # a supervisor restarted its worker
    assert not policy.with_grace(2, 1)  # a holder answered SIGTERM with two children


def test_known_idle_is_what_discovery_saw_holding_nothing() -> None:
    from pveclean.core.records import HostView, ProcStatus
    from tests.unit.test_host_reads import holder

    def st(pid: int) -> ProcStatus:
        return ProcStatus(pid, "sh", "S", 1, 0, (pid, 2), 700 + pid)

    view = HostView({10: holder(10)}, {10: st(10), 11: st(11)}, {10: ".", 11: "."}, None)
    assert policy.known_idle(view) == {11: 711}
    assert policy.known_idle(None) is None
