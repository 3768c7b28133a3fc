"""core/reset: `pveclean reset GPU` refuses, naming each, unless every holder is a container's
holder it may stop or a host service it knows; never under a VM, another node's guest, or
MIG instances; the GPU found by index, UUID or PCI id."""

from __future__ import annotations

from collections.abc import Iterable

from pveclean.core.gpumap import GpuHolding, GpuMap, GpuProc
from pveclean.core.reset import Decision, HostFacts, find, plan
from tests.gpumaps import gmap, pci, proc, row, use

LOCAL = HostFacts(local_cts=frozenset({129, 130}))
PERSISTENCED = row(900, "host", name="nvidia-persiste", unit="nvidia-persistenced.service")
DCGM = row(901, "host", name="nv-hostengine", unit="nvidia-dcgm.service")


def _map(*rows: GpuHolding, leak: int = 0, status: str = "ok",
         untied: Iterable[GpuProc] = ()) -> GpuMap:
    return gmap([use(0, "0000:01:00.0", rows, uuid="GPU-aaa", leak_mib=leak, status=status),
                 use(1, "0000:02:00.0", uuid="GPU-bbb")], untied=untied)


def test_found_by_index_uuid_and_pci_id() -> None:
    m = _map()
    for asked in ("0", "GPU-AAA", "0000:01:00.0", "00000000:01:00.0", "01:00"):
        g = find(m, asked)
        assert g is not None and g.index == 0, asked
    assert find(m, "7") is None and find(m, "GPU-zzz") is None


def test_container_holders_and_known_services_go() -> None:
    p = plan(_map(row(10, "ct", 129), row(11, "ct", 130), PERSISTENCED, DCGM), "0",
             LOCAL)
    assert p.decision is Decision.GO and p.blockers == []
    assert sorted(p.stop) == [129, 130] and p.stop[129][0] == {0}
    assert p.services == ["nvidia-persistenced.service", "nvidia-dcgm.service"]
    assert p.target is not None and p.target.driver_pci == "0000:01:00"


def test_each_other_holder_refuses_by_name() -> None:
    p = plan(_map(row(10, "ct", 129), row(20, "host", name="Xorg", unit="gdm.service"),
                  row(21, "unknown", name="ghost"),
                  row(22, "host", name="nv-hostengine", unit="my-own.service"),
                  row(23, "ct", 555)), "0", LOCAL)
    assert p.decision is Decision.REFUSE
    text = "\n".join(p.blockers)
    assert "PID 20 Xorg (gdm.service)" in text and "PID 21 ghost" in text
    assert "PID 22 nv-hostengine" in text  # a known name in an unknown unit: not ours
    assert "CT 555" in text and "not on this node" in text
    assert len(p.blockers) == 4


def test_never_under_a_vm_vfio_or_mig() -> None:
    vm = HostFacts(reservations={pci("0000:01:00"): 102}, running_vms=frozenset({102}),
                   local_cts=frozenset({129}))
    p = plan(_map(), "0", vm)
    assert p.decision is Decision.REFUSE and "VM 102 (running)" in p.blockers[0]
    v = plan(_map(), "0000:03:00.0", LOCAL, vfio=[pci("0000:03:00.0")])
    assert v.decision is Decision.REFUSE and "vfio-pci" in v.blockers[0]
    mig = HostFacts(local_cts=frozenset(), mig_enabled=True, mig_instances=2)
    assert "MIG mode with 2" in plan(_map(), "0", mig).blockers[0]
    no_instances = HostFacts(mig_enabled=True, mig_instances=0)
    assert plan(_map(), "0", no_instances).decision is Decision.GO
    unknown = HostFacts(mig_enabled=None)
    assert plan(_map(), "0", unknown).decision is Decision.REFUSE


def test_untied_holders_unreadable_gpus_and_unknown_gpus_refuse() -> None:
    m = _map(untied=[proc(30, "host", name="strange")])
    assert "PID 30 strange" in plan(m, "0", LOCAL).blockers[0]
    assert plan(_map(status="lost"), "0", LOCAL).decision is Decision.REFUSE
    assert plan(_map(), "9", LOCAL).decision is Decision.REFUSE


def test_a_leak_with_no_process_is_what_the_reset_is_for() -> None:
    p = plan(_map(leak=4000), "1", LOCAL)
    assert p.decision is Decision.GO
    p0 = plan(_map(leak=4000), "0", LOCAL)
    assert p0.decision is Decision.GO and "4000 MiB" in p0.notes[0]
    assert p0.as_dict()["gpu"] == {"index": 0, "pci_bus_id": "0000:01:00.0", "uuid": "GPU-aaa",
                                   "minor": 0}
