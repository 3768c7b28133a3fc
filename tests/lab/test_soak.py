"""A short soak (`make soak` runs 100 cycles): one cycle per fault, holders of every kind."""

from __future__ import annotations

from tests import soak
from tests.harness.lxclab import Lab


def test_short_soak_has_no_failures(lab: Lab, vmid: int) -> None:
    fig = soak.run(len(soak.FAULTS), lab=lab, vmid=vmid)
    assert fig.cycles == len(soak.FAULTS)
    assert set(fig.faults) == set(soak.FAULTS)
    assert fig.failures() == 0, "\n".join(fig.notes)
    assert fig.reports_on_stderr == 1  # the full report dir: said on stderr and in syslog
    assert fig.hook_runs == 4 * fig.cycles  # every phase of every cycle ran through the shim
    assert fig.longest_hook_s <= soak.DEADLINE + 1.5, fig.table()
