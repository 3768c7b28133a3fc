"""A holder's strings are cut where they are read, in the scan's worker (issue 39): 2,000
holders with long argv, exe, cgroup and device paths took 139-144 MB (28-30 MB with short
strings), everything kept whole and sent whole to the parent; only the report was cut."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pveclean.core import bounds
from pveclean.core.records import DeviceHow, DeviceUse, ProcStatus, Scope
from pveclean.host import cgroupfs, procfs, procscan
from tests.helpers import DEVICES

LONG = "/x" * 6000  # 12,000 characters: past PATH_MAX, as a tenant's nested cgroups make it


def test_a_holder_is_bounded_as_it_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procfs, "exe", lambda pid: "/opt/" + "e" * 5000)
    monkeypatch.setattr(procfs, "argv", lambda pid: ("a" * 3000, "b" * 3000))
    monkeypatch.setattr(cgroupfs, "pid_cgroup", lambda pid: "/lxc/129/ns" + LONG)
    scope = Scope(129, Path("/sys/fs/cgroup/lxc/129"), DEVICES, frozenset())
    st = ProcStatus(4242, "python3", "S", 1, 0, (4242, 7), 99)
    h = procscan.make_holder(st, "ns" + LONG, scope)
    assert h.cgroup is not None and len(h.cgroup) == bounds.TEXT
    assert h.cgroup.startswith("/lxc/129/ns/x/x") and h.cgroup.endswith(bounds.MORE)
    assert h.exe is not None and len(h.exe) == bounds.TEXT
    assert h.argv == ("a" * 3000, "b" * 3000)  # already capped at read (8 KiB in all)
    assert h.name == "python3" and h.host_pid == 4242 and h.ct_pid == 7
    h.devices = [bounds.cut_device(DeviceUse("/dev/" + "d" * 5000, 195, 0, DeviceHow.FD))]
    assert len(str(h.devices[0])) <= bounds.DEVICE_CHARS and h.devices[0].number == (195, 0)
    assert len(pickle.dumps(h)) < 20_000  # what crosses to the parent, per holder
