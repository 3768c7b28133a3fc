"""`make gpu-check`'s read-only hand-off view (tests/gpu/handoff_view.py) on a laid-out sysfs:
every NVIDIA GPU's group, drivers and persistence, and not one write."""

from __future__ import annotations

import os
from pathlib import Path

from tests.gpu.handoff_view import view
from tests.harness import qm


def test_the_view_reads_groups_drivers_and_persistence_and_writes_nothing(
        tmp_path: Path) -> None:
    bus = qm.lay_out_pci(tmp_path, 2)
    (bus / "devices/0000:19:00.0/nvidia").mkdir()
    stamps = {p: p.stat().st_mtime_ns for p in bus.rglob("*") if not p.is_symlink()}
    lines = view(bus / "devices", lambda a: "on" if a.bus == 0x18 else "off")
    assert lines == [
        "0000:18:00.0: driver nvidia, persistence on, vGPU no",
        "  group endpoint 0000:18:00.0: driver nvidia",
        "  group endpoint 0000:18:00.1: driver snd_hda_intel",
        "0000:19:00.0: driver nvidia, persistence off, vGPU yes",
        "  group endpoint 0000:19:00.0: driver nvidia",
        "  group endpoint 0000:19:00.1: driver snd_hda_intel",
    ]
    assert stamps == {p: p.stat().st_mtime_ns for p in bus.rglob("*") if not p.is_symlink()}
    assert os.listdir(bus / "devices/0000:18:00.0").count("driver_override") == 1
