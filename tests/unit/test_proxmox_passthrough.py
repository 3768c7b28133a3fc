"""proxmox/passthrough: GPUs given to VMs, from hostpci lines, PCI resource mappings and a fake
sysfs."""

from __future__ import annotations

from pathlib import Path

import pytest

from pveclean.core.pci import PciAddress
from pveclean.proxmox import passthrough
from tests.helpers import fake_host_pci


def _ids(text: str) -> list[str]:
    return [str(a) for a in passthrough._pci_ids(text)]


@pytest.mark.parametrize(("text", "ids"), [
    ("0000:01:00.0", ["0000:01:00.0"]),
    ("01:00.1", ["0000:01:00.1"]),
    ("01:00", ["0000:01:00"]),
    ("0001:0A:00", ["0001:0a:00"]),  # lower-cased
    ("0000:01:00.0; 0000:02:00.0", ["0000:01:00.0", "0000:02:00.0"]),
    ("01:00.0;zz:00.0;02:00", ["0000:01:00.0", "0000:02:00"]),
    ("01:00.g", []),
    ("1:00.0", []),
    ("", []),
])
def test_pci_ids(text: str, ids: list[str]) -> None:
    """Each id as a record, written back as sysfs names it (a whole device: no function)."""
    assert _ids(text) == ids


def test_a_wide_pci_domain_is_kept() -> None:
    """A 5-digit PCI domain (Intel VMD: sysfs names 10000:e1:00.0) is kept whole, so the
    VM's GPU is not matched against 0000:e1:00.0, another device; an 8-digit one as NVML
    writes it is cut to what sysfs shows."""
    assert _ids("10000:e1:00.0") == ["10000:e1:00.0"]
    assert _ids("00010000:e1:00") == ["10000:e1:00"]
    assert _ids("00000000:e1:00.0") == ["0000:e1:00.0"]


MAPPINGS = """\
big
\tmap id=10de:2330,node=pve1,path=0000:41:00.0
\tmap id=10de:2330,node=pve2,path=0000:81:00.0
\tdescription two nodes
split
\tmap id=10de:2330,node=pve1,path=0000:42:00.0;0000:43:00.0
\tmap id=10de:2330,node=pve1,path=0000:44:00.0
noid
\tmap node=pve1,path=0000:46:00.0
badpath
\tmap id=10de:2330,node=pve1,path=41:00.0
nopath
\tmap id=10de:2330,node=pve1
anynode
\tmap path=0000:45:00.0
\tbogus line
"""


def test_read_pci_mappings_keeps_this_nodes_paths(tmp_path: Path) -> None:
    f = tmp_path / "pci.cfg"
    f.write_text(MAPPINGS)
    def read(node: str) -> dict[str, list[list[str]]]:
        got = passthrough.read_pci_mappings(f, node)
        return {name: [[str(a) for a in alt] for alt in alts] for name, alts in got.items()}
    # a map without node=, id= or a full path= is invalid (PVE::Mapping::PCI), not "every
    # node": the same reading as the VM hand-off's (vmdevices.parse_mappings)
    assert read("pve1") == {
        "big": [["0000:41:00.0"]],
        "split": [["0000:42:00.0", "0000:43:00.0"], ["0000:44:00.0"]],
    }
    assert read("pve2") == {"big": [["0000:81:00.0"]]}


def test_read_pci_mappings_of_a_missing_file(tmp_path: Path) -> None:
    assert passthrough.read_pci_mappings(tmp_path / "nope.cfg", "pve1") == {}


def _qemu(tmp_path: Path, files: dict[str, str]) -> Path:
    d = tmp_path / "qemu-server"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def test_vm_passthrough_reads_every_hostpci_form(tmp_path: Path) -> None:
    d = _qemu(tmp_path, {
        "200.conf": "name: trainer\nhostpci0: 0000:41:00,pcie=1,x-vga=1\n"
                    "hostpci1: host=42:00.0;43:00.0,rombar=0\n[snap]\nhostpci2: 50:00.0\n",
        "201.conf": "name: win\nhostpci0: mapping=big,pcie=1\n",
        "202.conf": "hostpci3: 44:00.0\nnet0: virtio\n",
        "template.conf": "hostpci0: 60:00.0\n",  # not a VMID
        "203.conf.tmp": "hostpci0: 61:00.0\n",
    })
    big = PciAddress.parse("0000:81:00.0")
    assert big is not None
    got = passthrough.vm_passthrough(d, {"big": [(big,)]})
    assert [(r.vmid, r.name, str(r.address)) for r in got] == [
        (200, "trainer", "0000:41:00"),
        (200, "trainer", "0000:42:00.0"),
        (200, "trainer", "0000:43:00.0"),
        (201, "win", "0000:81:00.0"),
        (202, "", "0000:44:00.0"),
    ]


def test_vm_passthrough_unknown_mapping_and_missing_dir(tmp_path: Path) -> None:
    d = _qemu(tmp_path, {"201.conf": "hostpci0: mapping=gone\n"})
    assert passthrough.vm_passthrough(d, {}) == []
    assert passthrough.vm_passthrough(tmp_path / "nope", {}) == []


def _pci(root: Path, addr: str, cls: str = "0x030200", driver: str | None = "vfio-pci",
         vendor: str = "0x10de", device: str = "0x2330") -> None:
    d = root / addr
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")
    (d / "device").write_text(device + "\n")
    if driver:
        target = root.parent / "drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        (d / "driver").symlink_to(target)


def test_vfio_gpus_lists_nvidia_display_devices_not_on_nvidia(tmp_path: Path) -> None:
    devices = tmp_path / "sys/devices"
    _pci(devices, "0000:41:00.0")  # by address prefix (whole device) of VM 200
    _pci(devices, "0000:41:00.1", cls="0x040300")  # its audio function: not a display
    _pci(devices, "0000:42:00.0", driver="nvidia")  # NVML's own
    _pci(devices, "0000:43:00.0", cls="0x030000", driver=None, device="0x1db6")
    _pci(devices, "0000:44:00.0", vendor="0x1002")  # AMD
    _pci(devices, "0000:46:00.0", driver="nouveau")
    qemu = _qemu(tmp_path, {"200.conf": "name: trainer\nhostpci0: 41:00\n",
                            "201.conf": "name: other\nhostpci0: 41:00.1\n",
                            "202.conf": "name: m\nhostpci0: mapping=g\n"})
    mapping = tmp_path / "pci.cfg"
    mapping.write_text(f"g\n\tmap id=10de:2330,node={passthrough.this_node()},path=0000:46:00.0\n")
    assert [v.as_dict() for v in passthrough.vfio_gpus(devices, qemu, mapping)] == [
        {"pci_bus_id": "0000:41:00.0", "device": "10de:2330", "driver": "vfio-pci",
         "vms": [{"vmid": 200, "name": "trainer"}]},
        {"pci_bus_id": "0000:43:00.0", "device": "10de:1db6", "driver": None, "vms": []},
        {"pci_bus_id": "0000:46:00.0", "device": "10de:2330", "driver": "nouveau",
         "vms": [{"vmid": 202, "name": "m"}]},
    ]


def test_vfio_gpus_reads_no_vm_config_when_every_gpu_is_on_nvidia(tmp_path: Path) -> None:
    devices = tmp_path / "sys/devices"
    _pci(devices, "0000:42:00.0", driver="nvidia")
    qemu = tmp_path / "qemu-server"
    qemu.mkdir()
    (qemu / "200.conf").mkdir()  # would fail to read as a file
    assert passthrough.vfio_gpus(devices, qemu, tmp_path / "pci.cfg") == []


def test_vfio_gpus_without_sysfs(tmp_path: Path) -> None:
    assert passthrough.vfio_gpus(tmp_path / "nope", tmp_path, tmp_path / "pci.cfg") == []


def test_a_device_with_unreadable_attributes_is_skipped(tmp_path: Path) -> None:
    devices = tmp_path / "sys/devices"
    (devices / "0000:41:00.0").mkdir(parents=True)  # no vendor, no class
    assert passthrough.vfio_gpus(devices, tmp_path, tmp_path / "pci.cfg") == []


def test_gpus_bound_to_vfio_are_shown_as_passed_to_their_vm(tmp_path: Path) -> None:
    pve = tmp_path / "etc/pve"
    sysfs = fake_host_pci(tmp_path, pve)
    got = passthrough.vfio_gpus(sysfs, pve / "qemu-server", pve / "mapping/pci.cfg")
    assert [v.as_dict() for v in got] == [
        {"pci_bus_id": "0000:41:00.0", "device": "10de:2330", "driver": "vfio-pci",
         "vms": [{"vmid": 200, "name": "trainer"}]},
        {"pci_bus_id": "0000:43:00.0", "device": "10de:2330", "driver": None, "vms": []},
        {"pci_bus_id": "0000:44:00.0", "device": "10de:2330", "driver": "vfio-pci",
         "vms": [{"vmid": 201, "name": "win"}, {"vmid": 202, "name": ""}]},
    ]


def test_hostpci_ids() -> None:
    assert _ids("01:00") == ["0000:01:00"]
    assert _ids("0000:01:00.0;0000:02:00.1") == ["0000:01:00.0", "0000:02:00.1"]
    assert _ids("garbage;;") == []
