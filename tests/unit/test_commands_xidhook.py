"""commands/xidhook and the report's Xids: every hook phase reads the kernel log; a
pre-start onto a GPU whose last Xid asks for a reset warns, or refuses under
pre_start_policy: refuse; the container's next report lists its Xids once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from pveclean.commands import xidhook
from pveclean.core.config import Config
from pveclean.host import kmsg, procfs
from tests.harness.kmsg import Kmsg


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Path]:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "comm").write_text("python3\n")
    (proc / "4242" / "cgroup").write_text("0::/lxc/129/ns/init.scope\n")
    for pci, minor in (("0000:01:00.0", 0), ("0000:02:00.0", 1)):
        d = proc / "driver" / "nvidia" / "gpus" / pci
        d.mkdir(parents=True)
        d.joinpath("information").write_text(f"Model: \t\t NVIDIA H100\nDevice Minor: \t {minor}\n")
    (tmp_path / "lxc").mkdir()
    (tmp_path / "lxc" / "129.conf").write_text(
        "arch: amd64\ndev0: /dev/nvidia1\ndev1: /dev/nvidiactl\n")
    old = procfs.PROC
    procfs.set_root(str(proc))
    yield tmp_path
    procfs.set_root(old)


def _cfg(host: Path, policy: str = "warn") -> Config:
    return dataclasses.replace(Config(), kmsg_path=str(host / "kmsg"),
                               state_dir=str(host / "state"), pve_config_dir=str(host / "lxc"),
                               pre_start_policy=policy)


def _run(host: Path, phase: str, policy: str = "warn") -> tuple[bool, list[str]]:
    said: list[str] = []
    return xidhook.before_phase(129, phase, _cfg(host, policy), said.append), said


def test_the_drivers_proc_maps_minors_to_pci_ids(host: Path) -> None:
    assert xidhook.minor_to_pci() == {0: "0000:01:00", 1: "0000:02:00"}


def test_a_reset_xid_on_the_containers_gpu_warns_or_refuses(host: Path) -> None:
    k = Kmsg(host / "kmsg")
    k.xid(pci="0000:02:00", xid=48, pid=4242, name="python3", text="DBE")
    assert _run(host, "post-stop") == (False, [])  # read, counted; only pre-start judges
    refuse, said = _run(host, "pre-start")
    assert not refuse and len(said) == 1 and "WARNING" in said[0]
    assert "Xid 48 (reset) on 0000:02:00" in said[0] and "pveclean reset" in said[0]
    refuse, said = _run(host, "pre-start", "refuse")
    assert refuse and "refusing to start" in said[0]


def test_another_gpus_xid_or_an_app_fault_says_nothing(host: Path) -> None:
    k = Kmsg(host / "kmsg")
    k.xid(pci="0000:01:00", xid=95, pid=4242)  # GPU 0: not the container's
    k.xid(pci="0000:02:00", xid=13, pid=4242)  # an application fault
    assert _run(host, "pre-start", "refuse") == (False, [])


def test_a_hostile_write_cannot_refuse_a_start(host: Path) -> None:
    k = Kmsg(host / "kmsg")
    k.user("NVRM: Xid (PCI:0000:02:00): 79, pid=1, name=x, GPU has fallen off the bus.")
    assert _run(host, "pre-start", "refuse") == (False, [])


def test_the_next_report_lists_the_containers_xids_once(host: Path) -> None:
    Kmsg(host / "kmsg").xid(pci="0000:02:00", xid=13, pid=4242, text="Graphics Exception")
    _run(host, "pre-stop")
    lines = kmsg.for_report(str(host / "state"), 129)
    assert lines == ["GPU fault: Xid 13 (app) on 0000:02:00, pid 4242 python3: "
                     "Graphics Exception"]
    assert kmsg.for_report(str(host / "state"), 129) == []
    assert kmsg.for_report(str(host / "state"), 130) == []
