"""`pveclean gpus` without a lab: which containers need a scan, VFIO and hostpci passthrough,
the rendered table, and which host PIDs are shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pveclean.commands import render
from pveclean.host import hostscan
from pveclean.proxmox import passthrough, pveconf
from tests.helpers import fake_host_pci


def _conf(text: str) -> pveconf.CtConfig:
    return pveconf.parse_config(text, 129)


@pytest.mark.parametrize(("text", "may"), [
    ("dev0: /dev/nvidia0,gid=44\n", True),
    ("lxc.cgroup2.devices.allow: c 195:* rwm\n", True),
    ("lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n", True),
    ("lxc.cgroup2.devices.allow: a\n", True),  # every device: it may open GPU nodes
    ("lxc.cgroup2.devices.allow: c *:* rwm\n", True),
    ("lxc.cgroup2.devices.allow: c 10:200 rwm\nhostname: web\n", False),
    ("hostname: web\nmemory: 512\n", False),
])
def test_which_containers_need_a_scan(text: str, may: bool) -> None:
    assert pveconf.may_use_gpus(_conf(text), frozenset()) is may


def test_gpus_bound_to_vfio_are_shown_as_passed_to_their_vm(tmp_path: Path) -> None:
    pve = tmp_path / "etc/pve"
    sysfs = fake_host_pci(tmp_path, pve)
    got = passthrough.vfio_gpus(sysfs, pve / "qemu-server", pve / "mapping/pci.cfg")
    assert got == [
        {"pci_bus_id": "0000:41:00.0", "device": "10de:2330", "driver": "vfio-pci",
         "vms": [{"vmid": 200, "name": "trainer"}]},
        {"pci_bus_id": "0000:43:00.0", "device": "10de:2330", "driver": None, "vms": []},
        {"pci_bus_id": "0000:44:00.0", "device": "10de:2330", "driver": "vfio-pci",
         "vms": [{"vmid": 201, "name": "win"}, {"vmid": 202, "name": ""}]},
    ]


def test_hostpci_ids() -> None:
    assert passthrough._pci_ids("01:00") == [("0000:01:00.", True)]
    assert passthrough._pci_ids("0000:01:00.0;0000:02:00.1") == [("0000:01:00.0", False),
                                                         ("0000:02:00.1", False)]
    assert passthrough._pci_ids("garbage;;") == []


def test_render_escapes_what_containers_control() -> None:
    proc = {"host_pid": 5, "name": "evil\x1b[2J", "owner": "ct", "vmid": 129, "ct_pid": 2,
            "unit": None, "cgroup": "/lxc/129/ns", "devices": ["/dev/nvidia0\n (195:0)"],
            "gpu_memory_mib": {0: 10}, "memory_mib": 10}
    data: dict[str, Any] = {
        "host": "h", "time": "2026-01-01T00:00:00.000+00:00",
        "gpus": [{"index": 0, "name": "G\x07", "uuid": "U", "pci_bus_id": None, "minor": 0,
                  "total_mib": 100, "used_mib": 10, "reserved_mib": 1, "processes": [proc],
                  "by_owner_mib": {"CT 129": 10}, "unaccounted_mib": 0, "leak_mib": 0}],
        "other_holders": [{**proc, "name": "x\r\x1b]0;t\x07"}], "vfio": [],
        "containers": {"129": {"hostname": "h\x1b[31m"}},
        "scan": {"containers_scanned": [129], "containers_skipped_no_gpu": [],
                 "host_processes": 1, "seconds": 0.01}, "sources": {"nvml": "ok"},
        "warnings": []}
    text = render.render_gpus(data)
    assert not any(c in text for c in "\x1b\x07\r")
    assert "evil\\x1b[2J" in text and "h\\x1b[31m" in text


def test_host_pids_leave_out_only_proxmox_containers(tmp_path: Path) -> None:
    for rel, procs in {"": "1\n2\n", "system.slice/a.service": "10\n", "lxc": "",
                       "lxc/129/ns/system.slice/x.service": "20\n", "lxc/plain": "30\n",
                       "lxc.monitor/129": "40\n"}.items():
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
        (tmp_path / rel / "cgroup.procs").write_text(procs)
    assert hostscan.host_pids(tmp_path) == {1: "/", 2: "/", 10: "/system.slice/a.service",
                                        30: "/lxc/plain", 40: "/lxc.monitor/129"}
