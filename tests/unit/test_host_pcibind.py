"""Handing a GPU's IOMMU group to vfio-pci and back, against a sysfs root the tests lay out
(tests/harness/qm.lay_out_pci) with the kernel's part played by helpers.KernelSim."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pveclean.host import pcibind
from pveclean.host.pcibind import BindError
from tests.harness import qm
from tests.helpers import KernelSim


@pytest.fixture
def fs(tmp_path: Path) -> KernelSim:
    qm.lay_out_pci(tmp_path, 2)
    return KernelSim(tmp_path / "sys/bus/pci")


GPU, AUDIO = "0000:18:00.0", "0000:18:00.1"


def test_the_whole_group_goes_to_vfio_and_comes_back(fs: KernelSim) -> None:
    h = pcibind.bind_group(fs, GPU)
    assert h.before == {GPU: "nvidia", AUDIO: "snd_hda_intel"}
    assert fs.driver(GPU) == fs.driver(AUDIO) == "vfio-pci"
    assert fs.driver("0000:19:00.0") == "nvidia"  # another GPU's group is not touched
    assert pcibind.give_back(fs, h) == []
    assert (fs.driver(GPU), fs.driver(AUDIO)) == ("nvidia", "snd_hda_intel")
    assert (fs.dev(GPU) / "driver_override").read_text().strip() == "(null)"


def test_a_failed_step_is_undone_and_said(fs: KernelSim) -> None:
    fs.fail.add((AUDIO, "unbind"))
    with pytest.raises(BindError, match=r"0000:18:00.1.*busy; undone"):
        pcibind.bind_group(fs, GPU)
    assert (fs.driver(GPU), fs.driver(AUDIO)) == ("nvidia", "snd_hda_intel")
    assert (fs.dev(GPU) / "driver_override").read_text().strip() == "(null)"


def test_a_failed_undo_is_said_too(fs: KernelSim) -> None:
    fs.fail |= {(AUDIO, "unbind"), (GPU, "bind")}  # the GPU cannot go back to nvidia
    with pytest.raises(BindError, match="undoing it failed too"):
        pcibind.bind_group(fs, GPU)


def test_a_bind_that_does_not_take_is_an_error(fs: KernelSim) -> None:
    orig = fs.write

    def stubborn(path: Path, text: str) -> None:  # the probe binds the old driver again
        orig(path, "" if path.name == "driver_override" else text)

    fs.write = stubborn  # type: ignore[method-assign]
    with pytest.raises(BindError, match="bound to nvidia, not vfio-pci"):
        pcibind.bind_group(fs, GPU)


def test_bridges_in_the_group_are_left_alone(fs: KernelSim) -> None:
    bridge = fs.dev("0000:00:01.0")
    (bridge / "pci_bus").mkdir(parents=True)
    group = fs.dev(GPU) / "iommu_group" / "devices"
    (group / "0000:00:01.0").symlink_to(bridge)
    h = pcibind.bind_group(fs, GPU)
    assert "0000:00:01.0" not in h.before


def test_no_iommu_group_is_one_clear_line(fs: KernelSim) -> None:
    os.unlink(fs.dev(GPU) / "iommu_group")
    with pytest.raises(BindError, match=r"no IOMMU group.*is the IOMMU on"):
        pcibind.bind_group(fs, GPU)
    assert fs.writes == []
