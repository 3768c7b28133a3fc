"""Units' cgroup trees are walked within the run's time (issue 39): 10 units with 10,000
empty child cgroups each made `--stop-units` run 9.2-9.8 s against a 6 s deadline (each
unit's tree walked after the deadline check, unbounded) while the report said 5.6 s."""

from __future__ import annotations

import time
from pathlib import Path

from pveclean.host import cgroupfs
from pveclean.proxmox import guestunits
from tests.unit.test_proxmox_guestunits import _cgroups, _fake_pct, unit_holder


def wide(tmp_path: Path, n: int) -> Path:
    root = _cgroups(tmp_path, {"lxc/129/ns/system.slice/a.service": "77\n"})
    unit = root / "lxc/129/ns/system.slice/a.service"
    for i in range(n):
        (unit / f"c{i}").mkdir()
        (unit / f"c{i}" / "cgroup.procs").write_text("")
    return root


def test_a_walk_lists_no_cgroup_after_its_end(tmp_path: Path) -> None:
    root = wide(tmp_path, 300)
    unit = root / "lxc/129/ns/system.slice/a.service"
    whole = cgroupfs.tree_pids(unit)
    assert whole.truncated is None and whole == {77: "."}
    late = cgroupfs.tree_pids(unit, until=time.monotonic() - 1)
    assert late.truncated is not None and "ran out of time after 63 cgroups" in late.truncated
    assert guestunits.processes_in(root, "/lxc/129/ns/system.slice/a.service") == 1
    # a tree not walked whole is not known: never counted as empty ("stopped")
    assert guestunits.processes_in(root, "/lxc/129/ns/system.slice/a.service",
                                   time.monotonic() - 1) is None


def test_stop_units_judges_within_its_timeout(tmp_path: Path) -> None:
    root = wide(tmp_path, 200)
    pct = _fake_pct(tmp_path, "sleep 0.3")  # systemctl takes the whole timeout
    t0 = time.monotonic()
    out = guestunits.stop_units(129, [unit_holder(10, "/lxc/129/ns/system.slice/a.service")],
                                None, root, pct, 0.3)
    assert time.monotonic() - t0 < 1.0
    (u,) = out.units
    assert u.processes_left is None and u.action in ("timed out", "unverified"), u


def test_hints_walk_within_the_end_they_are_given(tmp_path: Path) -> None:
    root = wide(tmp_path, 200)
    hs = [unit_holder(1, "/lxc/129/ns/system.slice/a.service")]
    assert guestunits.hints(129, hs, root, False, set()) != []  # still active, 1 process
    assert guestunits.hints(129, hs, root, False, set(), until=time.monotonic() - 1) == []
