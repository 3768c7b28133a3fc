"""ReadBudget (issue 39): a scan keeps its holders' strings as bound_holder cuts them until a
few MB are kept, every later holder's cut short, so 2,000 holders of any shape stay small
(the lab's whole run: 160 MB peak before, 57 MB with it)."""

from __future__ import annotations

import pickle

from pveclean.core import bounds
from pveclean.core.records import MORE, DeviceHow, DeviceUse, Holder


def long_holder(pid: int) -> Holder:
    h = Holder(host_pid=pid, starttime=1, ct_pid=pid, name="python3", exe="/e" * 1900,
               argv=tuple(c * 1000 for c in "abcdefgh"), uid=0, user="root", state="S",
               ppid=1, cgroup="/lxc/129/ns" + "/c" * 1900)
    h.devices = [bounds.cut_device(DeviceUse("/d" * 1900 + f"{i}", 195, 0, DeviceHow.FD))
                 for i in range(8)]
    return bounds.bound_holder(h)


def test_past_the_budget_each_holder_is_cut_short() -> None:
    budget = bounds.ReadBudget()
    kept = [budget.keep(long_holder(p)) for p in range(1, 2001)]
    first, last = kept[0], kept[-1]
    assert first.argv == long_holder(1).argv and first.exe == "/e" * 1900  # in full
    assert sum(len(a) for a in last.argv) <= bounds.ARGV_SHORT + 40
    assert last.argv == ("a" * (bounds.ARGV_SHORT - 1) + MORE, f"{MORE} 7 more not listed")
    assert last.exe is not None and len(last.exe) <= bounds.SHORT
    assert len(last.cgroup) <= bounds.SHORT and last.cgroup.startswith("/lxc/129/ns")
    assert all(len(str(d)) <= bounds.SHORT for d in last.devices)
    assert last.devices[0].number == (195, 0) and last.host_pid == 2000
    whole = sum(len(pickle.dumps(h)) for h in kept)
    assert whole < 8_000_000, whole  # each as bound_holder cuts it: 40.7 MB
