"""What a VM's start takes, read from a laid-out host: the lab's sysfs (each GPU's display and
audio functions in one IOMMU group), a mapping file, qemu-server's reservations."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from pveclean.proxmox import vmtake
from tests.harness import qm

MAPPING = """\
gpus
\tmap id=10de:2330,node=pve1,path=0000:18:00
\tmap id=10de:2330,node=pve1,path=0000:19:00
"""


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    qm.lay_out_pci(tmp_path, 3)
    (tmp_path / "etc/pve/mapping").mkdir(parents=True)
    (tmp_path / "etc/pve/mapping/pci.cfg").write_text(MAPPING)
    (tmp_path / "run/qemu-server").mkdir(parents=True)
    real = os.uname()

    class Uname:
        nodename = "pve1.example.com"  # Proxmox matches node= against "pve1"

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    monkeypatch.setattr(vmtake.os, "uname", Uname)
    return tmp_path


def vm(root: Path, vmid: int, *hostpci: str, node: str | None = None) -> None:
    d = root / "etc/pve" / (f"nodes/{node}/qemu-server" if node else "qemu-server")
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{vmid}.conf").write_text("".join(f"hostpci{i}: {v}\n"
                                            for i, v in enumerate(hostpci)))


def take(root: Path, vmid: int, migrated_from: str | None = None) -> vmtake.VmTake:
    got = vmtake.w_vm_take(str(root / "etc/pve"), vmid, str(root / "sys/bus/pci"),
                           str(root / "run/qemu-server"), migrated_from)
    assert got is not None
    return got


def names(t: vmtake.VmTake) -> list[str]:
    return sorted(map(str, t.drivers))


def test_a_vm_passing_only_the_audio_function_takes_the_whole_group(host: Path) -> None:
    vm(host, 200, "0000:18:00.1")
    t = take(host, 200)
    assert names(t) == ["0000:18:00.0", "0000:18:00.1"] and t.nvidia
    assert [str(a) for a in t.groups] == ["0000:18:00.0"]
    assert t.drivers[min(t.drivers, key=str)] == "nvidia"


def test_a_mapping_on_a_node_with_a_domain_takes_one_alternative(host: Path) -> None:
    vm(host, 200, "mapping=gpus")
    assert names(take(host, 200)) == ["0000:18:00.0", "0000:18:00.1"]


def test_another_running_vms_reservation_moves_the_choice(host: Path) -> None:
    run = host / "run/qemu-server"
    (run / "300.pid").write_text(f"{os.getpid()}\n")
    (run / "pci-id-reservations").write_text(f"0000:18:00.0 300 pid:{os.getpid()}\n")
    vm(host, 200, "mapping=gpus")
    t = take(host, 200)
    assert names(t) == ["0000:19:00.0", "0000:19:00.1"]
    assert t.notes == ["hostpci0: 0000:18:00.0 is reserved by VM 300 (running)"]


def test_a_pid_reservation_counts_only_for_that_vms_qemu(host: Path) -> None:
    run = host / "run/qemu-server"
    (run / "pci-id-reservations").write_text(
        f"0000:18:00.0 300 pid:{os.getpid()}\n0000:19:00.0 301 time:{int(time.time()) + 60}\n")
    got = vmtake.reservations(run)  # VM 300 has no pidfile: a PID reused by another process
    assert {str(a): (r.vmid, r.starting) for a, r in got.items()} == {
        "0000:19:00.0": (301, True)}


def test_a_migrating_vms_config_is_read_in_the_source_nodes_directory(host: Path) -> None:
    vm(host, 200, "0000:1a:00.0", node="pve2")
    assert vmtake.w_vm_take(str(host / "etc/pve"), 200, str(host / "sys/bus/pci"),
                            str(host / "run/qemu-server")) is None
    assert names(take(host, 200, "pve2")) == ["0000:1a:00.0", "0000:1a:00.1"]


def test_driver_keep_is_said_and_takes_nothing(host: Path) -> None:
    vm(host, 200, "0000:18:00,driver=keep")
    t = take(host, 200)
    assert t.drivers == {} and t.groups == [] and t.nvidia  # vm_gpu_rebind moves nothing
    assert t.notes == ["hostpci0: driver=keep: the driver keeps 0000:18:00.0, 0000:18:00.1; "
                       "not guarded"]


def test_install_selects_only_vms_whose_start_unbinds_an_nvidia_function(host: Path) -> None:
    """`install --all-gpu-vms`: driver=keep, vGPU and mdev VMs are no passthrough that unbinds;
    a VM passing only the GPU's audio function takes the GPU's group."""
    root = host / "sys/bus/pci/devices"
    maps = vmtake.read_mappings(host / "etc/pve/mapping/pci.cfg", "pve1")
    assert vmtake.unbinds_nvidia([("hostpci0", "0000:18:00.1")], maps, root)
    assert vmtake.unbinds_nvidia([("hostpci0", "mapping=gpus")], maps, root)
    assert not vmtake.unbinds_nvidia([("hostpci0", "0000:18:00,driver=keep")], maps, root)
    assert not vmtake.unbinds_nvidia([("hostpci0", "0000:18:00.0,mdev=nvidia-42")], maps, root)
    assert not vmtake.unbinds_nvidia([("hostpci0", "0000:18:00.0,bogus=1")], maps, root)
