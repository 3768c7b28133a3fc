"""What a VM's hostpci lines take at its start, as qemu-server's PCI.pm decides it after the
pre-start hook (choose_hostpci_devices, prepare_pci_device, pci_dev_group_bind_to_vfio)."""

from __future__ import annotations

from pveclean.core.pci import PciAddress
from pveclean.core.vmdevices import (
    Choice,
    Host,
    Kind,
    Reservation,
    choose,
    group_endpoints,
    node_name,
    parse_hostpci,
    parse_mappings,
)


def pci(text: str) -> PciAddress:
    a = PciAddress.parse(text)
    assert a is not None
    return a


# two GPUs (display + audio each) and a VF-capable one
FUNCS = tuple(pci(a) for a in ("0000:01:00.0", "0000:01:00.1", "0000:02:00.0", "0000:02:00.1",
                               "0000:03:00.4"))
HOST = Host(FUNCS, frozenset({pci("0000:03:00.4")}))

MAPPING = """\
gpus
\tmap id=10de:2330,node=pve1,path=0000:01:00
\tmap id=10de:2330,node=pve1,path=0000:02:00
\tmap id=10de:2330,node=pve2,path=0000:05:00
\tmap id=10de:2330,path=0000:06:00
\tmap node=pve1,path=0000:07:00
audio
\tmap id=10de:22a3,node=pve1,path=0000:01:00.1
"""


def take(values: list[str], reservations: dict[str, Reservation] | None = None,
         vmid: int = 100, node: str = "pve1") -> Choice:
    maps = parse_mappings(MAPPING, node)
    lines = [parse_hostpci(i, v, maps) for i, v in enumerate(values)]
    return choose(lines, vmid, HOST, {pci(k): r for k, r in (reservations or {}).items()})


def names(addrs: list[PciAddress]) -> list[str]:
    return [str(a) for a in addrs]


def test_the_node_name_is_the_host_name_before_its_first_dot() -> None:
    assert node_name("pve1.example.com") == "pve1"
    assert node_name("pve1") == "pve1"


def test_a_map_without_node_or_id_is_invalid_not_every_node() -> None:
    maps = parse_mappings(MAPPING, "pve1")
    assert [[str(a) for a in alt] for alt in maps["gpus"]] == [["0000:01:00"], ["0000:02:00"]]
    assert "gpus" not in parse_mappings(MAPPING, "pve1.example.com")


def test_a_mapping_takes_its_first_free_alternative_only() -> None:
    got = take(["mapping=gpus,pcie=1"])
    assert names(got.unbound) == ["0000:01:00.0", "0000:01:00.1"]


def test_another_vms_reservation_moves_the_choice_to_the_next_alternative() -> None:
    got = take(["mapping=gpus"], {"0000:01:00.0": Reservation(200)})
    assert names(got.unbound) == ["0000:02:00.0", "0000:02:00.1"]
    assert got.notes == ["hostpci0: 0000:01:00.0 is reserved by VM 200 (running)"]


def test_a_start_in_progress_makes_the_choice_uncertain_and_says_so() -> None:
    got = take(["mapping=gpus"], {"0000:01:00.0": Reservation(200, starting=True)})
    assert names(got.unbound) == ["0000:02:00.0", "0000:02:00.1"]
    assert "if that start fails first, qemu-server takes it instead" in got.notes[0]


def test_an_earlier_line_of_the_same_vm_uses_an_alternative() -> None:
    got = take(["01:00", "mapping=gpus"])
    assert names(got.unbound) == ["0000:01:00.0", "0000:01:00.1", "0000:02:00.0",
                                  "0000:02:00.1"]


def test_no_free_alternative_fails_the_start_and_takes_nothing() -> None:
    got = take(["mapping=gpus"], {"0000:01:00.0": Reservation(200),
                                  "0000:02:00.1": Reservation(300)})
    assert got.unbound == [] and got.fails == "hostpci0: could not find a free device for " \
        "'hostpci0'"


def test_keep_vgpu_and_mdev_unbind_nothing_and_are_said() -> None:
    got = take(["01:00,driver=keep", "03:00.4,mdev=nvidia-42", "02:00.0,mdev=grid-x"])
    assert got.unbound == []
    assert [t.kind for t in got.lines] == [Kind.KEEP, Kind.VGPU, Kind.MDEV]
    assert all("not guarded" in n for n in got.dropped) and len(got.dropped) == 3


def test_a_value_qemu_server_drops_passes_nothing_and_the_rest_still_counts() -> None:
    got = take(["01:00.0,bogus=1", "0000:02:00.0"])
    assert names(got.unbound) == ["0000:02:00.0"]
    assert got.fails is None and "drops it" in got.dropped[0]
    assert take(["01:00.0;zz"]).dropped and take(["01:00.0;zz"]).unbound == []


def test_a_missing_device_or_mapping_fails_the_whole_start() -> None:
    assert take(["09:00.0", "01:00.0"]).fails == "hostpci0: no PCI device found for " \
        "'0000:09:00.0'"
    assert take(["mapping=nope"]).unbound == []
    assert take(["01:00.0", "01:00"]).fails is not None  # assigned more than once


def test_the_whole_iommu_group_is_unbound() -> None:
    groups = {pci("0000:01:00.1"): (pci("0000:01:00.0"), pci("0000:01:00.1"),
                                    pci("0000:02:00.0"))}
    got = take(["01:00.1"])  # only the audio function
    assert names(group_endpoints(got.unbound, groups)) == [
        "0000:01:00.0", "0000:01:00.1", "0000:02:00.0"]
