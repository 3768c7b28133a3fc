"""core.gpumap: which process holds which GPU, the memory per owner, and the memory no process
accounts for (a leak past LEAK_SLACK_MIB)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.core import gpumap
from pveclean.core.gpumap import LEAK_SLACK_MIB, GpuProc, Nodes, Placed
from pveclean.core.owners import Owner, OwnerKind
from pveclean.core.records import GpuDevices, GpuMemory
from tests.gpumaps import pci


def _gpu(index: int = 0, used: int = 5000, reserved: int | None = 300,
         minor: int | None = 0) -> GpuMemory:
    return GpuMemory(index=index, uuid=f"GPU-{index}", name="H100", total_mib=81559,
                     reserved_mib=reserved, used_mib=used, minor=minor)


def _proc(pid: int, owner: str = "ct", memory: dict[int, int | None] | None = None,
          minors: set[int] | None = None, vmid: int | None = 129) -> Placed:
    p = GpuProc(host_pid=pid, name=f"p{pid}",
                owner=Owner(OwnerKind(owner), vmid if owner == "ct" else None),
                memory=memory or {})
    return Placed(p, Nodes(frozenset(minors or ())))


def _entry(g: GpuMemory, bus: str | None, procs: list[Placed]) -> dict[str, Any]:
    """gpu_use() as the --json document has it."""
    return gpumap.gpu_use(g, None if bus is None else pci(bus), procs).as_dict()


# ---- gpu_use ---------------------------------------------------------------------------
def test_accounted_memory_and_owners() -> None:
    procs = [_proc(10, memory={0: 1000}), _proc(11, memory={0: 3000}),
             _proc(20, owner="host", memory={0: 900}), _proc(30, memory={1: 500}),
             _proc(40, owner="unknown", minors={0})]  # holds /dev/nvidia0, no memory
    e = _entry(_gpu(used=4950), "0000:41:00.0", procs)
    assert [r["host_pid"] for r in e["processes"]] == [11, 10, 20, 40]  # most memory first
    assert [r["memory_mib"] for r in e["processes"]] == [3000, 1000, 900, None]
    assert e["by_owner_mib"] == {"CT 129": 4000, "host": 900, "unknown": 0}
    assert e["unaccounted_mib"] == 50 and e["leak_mib"] == 0  # within the slack
    assert (e["index"], e["pci_bus_id"], e["minor"], e["total_mib"]) == (
        0, "0000:41:00.0", 0, 81559)


def test_unaccounted_over_the_slack_is_a_leak() -> None:
    e = _entry(_gpu(used=1000 + LEAK_SLACK_MIB + 1), None,
                          [_proc(10, memory={0: 1000})])
    assert e["unaccounted_mib"] == LEAK_SLACK_MIB + 1 and e["leak_mib"] == LEAK_SLACK_MIB + 1


def test_exactly_the_slack_is_no_leak() -> None:
    e = _entry(_gpu(used=LEAK_SLACK_MIB), None, [])
    assert e["unaccounted_mib"] == LEAK_SLACK_MIB and e["leak_mib"] == 0
    assert e["processes"] == [] and e["by_owner_mib"] == {}


def test_no_per_process_memory_means_no_unaccounted_figure() -> None:
    """NVML without per-process memory (None) cannot say what is unaccounted: no leak."""
    e = _entry(_gpu(used=60000), None, [_proc(10, memory={0: None}),
                                                    _proc(11, memory={0: 100})])
    assert e["unaccounted_mib"] is None and e["leak_mib"] == 0
    assert [r["host_pid"] for r in e["processes"]] == [11, 10]  # unknown memory last


def test_without_reserved_memory_no_unaccounted_figure() -> None:
    e = _entry(_gpu(used=60000, reserved=None), None, [])
    assert e["unaccounted_mib"] is None and e["leak_mib"] == 0


def test_more_accounted_than_used_is_not_negative() -> None:
    e = _entry(_gpu(used=100), None, [_proc(10, memory={0: 500})])
    assert e["unaccounted_mib"] == 0


def test_a_gpu_without_a_minor_matches_by_memory_only() -> None:
    e = _entry(_gpu(minor=None), None, [_proc(10, minors={0}), _proc(11,
                                                                              memory={0: 5})])
    assert [r["host_pid"] for r in e["processes"]] == [11]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 100000), st.lists(st.integers(0, 20000), max_size=6))
def test_leak_is_unaccounted_past_the_slack(used: int, mibs: list[int]) -> None:
    procs = [_proc(i + 2, memory={0: m}) for i, m in enumerate(mibs)]
    e = _entry(_gpu(used=used), None, procs)
    assert e["unaccounted_mib"] == max(used - sum(mibs), 0)
    assert e["leak_mib"] == (e["unaccounted_mib"] if e["unaccounted_mib"] > LEAK_SLACK_MIB
                             else 0)
    assert sum(e["by_owner_mib"].values()) == sum(mibs)


# ---- nodes_of ---------------------------------------------------------------------------------
def test_minors_from_the_hosts_device_numbers() -> None:
    dev = gpumap.makedev
    devices = GpuDevices({dev(195, 0): "/dev/nvidia0", dev(195, 1): "/dev/nvidia1",
                          dev(195, 255): "/dev/nvidiactl", dev(508, 0): "/dev/nvidia-uvm"},
                         frozenset({195, 508}))
    held = {dev(195, 1), dev(195, 255), dev(508, 0), dev(195, 0),
            dev(195, 7),  # not in the registry: 195:N is nvidiaN anywhere
            dev(195, 254)}  # 254 and 255 are not GPUs
    assert gpumap.nodes_of(held, devices) == Nodes(frozenset({0, 1, 7}), True, frozenset())
    assert gpumap.nodes_of(set(), devices) == Nodes()


def test_minors_follow_the_registry_over_the_number() -> None:
    devices = GpuDevices({gpumap.makedev(195, 2): "/dev/nvidia5"}, frozenset())
    assert gpumap.nodes_of({gpumap.makedev(195, 2)}, devices).minors == {5}


def test_a_node_of_a_gpu_major_the_host_lacks_is_untied() -> None:
    devices = GpuDevices({}, frozenset({195, 508}))
    odd = gpumap.makedev(508, 9)
    assert gpumap.nodes_of({odd}, devices) == Nodes(frozenset(), False, frozenset({odd}))


# ---- names and labels ---------------------------------------------------------------------
@pytest.mark.parametrize(("comm", "argv", "name"), [
    ("nvidia-persiste", ("/usr/bin/nvidia-persistenced", "--user", "x"), "nvidia-persistenced"),
    ("nvidia-persiste", ("/opt/my dir/nvidia-persistenced",), "nvidia-persistenced"),
    ("python3", ("/usr/bin/python3.11", "-m", "x"), "python3"),  # not cut: comm as it is
    ("abcdefghijklmno", ("/opt/other-name",), "abcdefghijklmno"),  # argv0 does not continue it
    ("abcdefghijklmno", (), "abcdefghijklmno"),
    ("abcdefghijklmno", ("abcdefghijklmnopq",), "abcdefghijklmnopq"),
    ("ééééééé\udcc3", ("éééééééé-x",), "éééééééé-x"),  # 15 bytes, cut inside a character
    ("ééééééé", ("éééééééé-x",), "ééééééé"),  # 14 bytes: not cut
])
def test_full_name(comm: str, argv: tuple[str, ...], name: str) -> None:
    assert gpumap.full_name(comm, argv) == name


def test_owner_label() -> None:
    assert Owner(OwnerKind.CT, 129).label == "CT 129"
    assert Owner(OwnerKind.HOST).label == "host"
    assert Owner(OwnerKind.UNKNOWN).label == "unknown"


@pytest.mark.parametrize(("major", "minor"), [
    (0, 0), (195, 0), (195, 255), (508, 1), (1, 256), (4095, 0), (4096, 1), (259, 1 << 19),
    ((1 << 31) - 1, (1 << 31) - 1)])
def test_makedev_is_os_makedev(major: int, minor: int) -> None:
    assert gpumap.makedev(major, minor) == os.makedev(major, minor)
    assert (os.major(gpumap.makedev(major, minor)), os.minor(gpumap.makedev(major, minor))) == \
        (major, minor) == gpumap.major_minor(gpumap.makedev(major, minor))


def test_proc_as_dict_sorts_memory_by_gpu() -> None:
    p = _proc(5, memory={1: 10, 0: None})
    d = p.proc.as_dict()
    assert list(d["gpu_memory_mib"]) == [0, 1] and d["owner"] == "ct" and d["vmid"] == 129


def test_the_map_as_gpus_json_prints_it() -> None:
    """GpuMap.as_dict(): `pveclean gpus --json`'s document, its keys in their order."""
    from pveclean.core.gpumap import GpuMap, ScanStats, VfioGpu, VmConflict, VmName
    from pveclean.core.records import Source, SourceState

    ct = _proc(10, memory={0: 1000}, minors={0}).proc
    lost = GpuMemory(1, "GPU-1", "H100", 0, None, 0, minor=1, status="lost",
                     reason="GPU_IS_LOST")
    uses = (gpumap.gpu_use(_gpu(used=1000), pci("0000:41:00.0"), [Placed(ct, Nodes())]),
            gpumap.gpu_use(lost, None, []))
    other = GpuProc(20, "x", Owner(OwnerKind.HOST), cgroup="/", devices=("/dev/nvidiactl",))
    vms = (VmName(200, "trainer"),)
    m = GpuMap("pve1", 1700000000.25, uses, (other,),
               (VfioGpu(pci("0000:43:00.0"), "10de:2330", "vfio-pci", vms),),
               (VmConflict(0, pci("0000:41:00.0"), vms, (129,), 0, "refuse"),), {129: "lab"},
               ScanStats((129,), (130,), 400, 1, 0.25, 3), Source(SourceState.OK),
               Source(SourceState.PARTIAL, "partial: no PCI bus ids: x"), ("w",))
    d = m.as_dict()
    assert list(d) == ["pveclean_gpus", "host", "time", "gpus", "other_holders", "vfio",
                       "vm_conflicts", "containers", "scan", "sources", "warnings"]
    assert d["time"] == "2023-11-14T22:13:20.250+00:00"
    g0, g1 = d["gpus"]  # type: ignore[misc]
    assert list(g0) == ["index", "name", "uuid", "pci_bus_id", "minor", "total_mib",
                        "used_mib", "reserved_mib", "processes", "by_owner_mib",
                        "unaccounted_mib", "leak_mib", "status"]
    assert list(g1)[-1] == "reason" and g1["total_mib"] is None and g1["used_mib"] is None
    assert g0["processes"] == [{"host_pid": 10, "name": "p10", "owner": "ct", "vmid": 129,
                                "ct_pid": None, "unit": None, "cgroup": None, "devices": [],
                                "gpu_memory_mib": {0: 1000}, "memory_mib": 1000}]
    assert g0["by_owner_mib"] == {"CT 129": 1000}
    assert d["other_holders"] == [{"host_pid": 20, "name": "x", "owner": "host", "vmid": None,
                                   "ct_pid": None, "unit": None, "cgroup": "/",
                                   "devices": ["/dev/nvidiactl"], "gpu_memory_mib": {}}]
    assert d["vfio"] == [{"pci_bus_id": "0000:43:00.0", "device": "10de:2330",
                          "driver": "vfio-pci", "vms": [{"vmid": 200, "name": "trainer"}]}]
    assert d["vm_conflicts"] == [{"gpu": 0, "pci_bus_id": "0000:41:00.0",
                                  "vms": [{"vmid": 200, "name": "trainer"}],
                                  "containers": [129], "host_holders": 0,
                                  "next_vm_start": "refuse"}]
    assert d["containers"] == {"129": {"hostname": "lab"}}
    assert d["scan"] == {"containers_scanned": [129], "containers_skipped_no_gpu": [130],
                         "host_processes": 400, "host_holders": 1, "seconds": 0.25,
                         "host_processes_settled": 3}
    assert d["sources"] == {"host": "ok", "nvml": "partial: no PCI bus ids: x"}
