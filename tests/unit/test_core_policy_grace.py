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
