"""core/pci: a PCI address read from each form the outside writes, compared as numbers, and
written back exactly as sysfs (and, for the metrics, NVML) name it."""

from __future__ import annotations

import pytest

from pveclean.core.pci import PciAddress, sysfs_order


def pci(text: str) -> PciAddress:
    addr = PciAddress.parse(text)
    assert addr is not None, text
    return addr


@pytest.mark.parametrize(("text", "sysfs", "nvml"), [
    ("0000:01:00.0", "0000:01:00.0", "00000000:01:00.0"),  # sysfs
    ("00000000:3B:00.1", "0000:3b:00.1", "00000000:3B:00.1"),  # NVML
    ("10000:e1:00.0", "10000:e1:00.0", "00010000:E1:00.0"),  # Intel VMD's wide domain
    ("01:00.0", "0000:01:00.0", "00000000:01:00.0"),  # hostpci without its domain
    (" 0001:0A:00 ", "0001:0a:00", "00000001:0A:00"),  # hostpci's whole device
])
def test_each_outside_form_reads_and_is_written_as_sysfs_names_it(text: str, sysfs: str,
                                                                  nvml: str) -> None:
    assert str(pci(text)) == sysfs
    assert pci(text).nvml == nvml


@pytest.mark.parametrize("text", ["", "odd", "1:00.0", "01:00.g", "zz:00.0", "0000:01:00.0.1",
                                  "abc:01:00.0"])
def test_text_that_is_no_address(text: str) -> None:
    assert PciAddress.parse(text) is None


def test_a_whole_device_covers_each_of_its_functions_and_a_function_itself() -> None:
    whole, gpu, audio = pci("01:00"), pci("0000:01:00.0"), pci("0000:01:00.1")
    assert whole.function is None and gpu.function == 0
    assert whole.covers(gpu) and whole.covers(audio) and whole.covers(whole)
    assert gpu.covers(gpu) and not gpu.covers(audio) and not gpu.covers(whole)
    assert not whole.covers(pci("0000:02:00.0")) and not whole.covers(pci("10000:01:00.0"))
    assert gpu.same_device(audio) and gpu.whole_device == whole
    assert pci("00000000:01:00.0") == gpu and hash(pci("01:00.0")) == hash(gpu)


def test_addresses_sort_as_their_sysfs_names() -> None:
    names = ["10000:01:00.0", "0000:1a:00.0", "0000:18:00.0", "ffff:00:00.0"]
    assert [str(a) for a in sorted(map(pci, names), key=sysfs_order)] == sorted(names)
