"""/etc/pve parsing: container configs and their GPU lines, VMIDs, storage.cfg, snippets paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.core import config
from pveclean.errors import PvecleanError
from pveclean.proxmox import chain, pveconf


def test_hook_parser_sees_every_gpu_of_the_container(tmp_path: Path) -> None:
    from pveclean.commands.hook import _container_minors

    (tmp_path / "lxc").mkdir()
    (tmp_path / "lxc/100.conf").write_text(
        "dev0: /dev/nvidia0,gid=44\ndev1: mode=0666,path=/dev/nvidia1\n"
        "lxc.cgroup2.devices.allow = c 195:* rwm\n"
        "lxc.mount.entry = /dev/nvidia2 dev/nvidia2 none bind,optional,create=file\n")
    c = pveconf.read_config(str(tmp_path / "lxc"), 100)
    assert _container_minors(c) == {0, 1, 2}
    assert ("lxc.cgroup2.devices.allow", "c 195:* rwm") in c.lines
    assert len(c.gpu_lines()) == 4


def test_unreadable_storage_cfg_falls_back_to_the_recorded_path(
        chained: tuple[config.Config, Path]) -> None:
    cfg, script = chained
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    (Path(cfg.pve_config_dir).parent / "storage.cfg").unlink()
    assert chain.run_chained(100, "pre-start", cfg) == 3


def test_container_config_gpu_lines() -> None:
    text = (
        "arch: amd64\nhookscript: local:snippets/pveclean-hook\n"
        "dev0: /dev/nvidia0,gid=44\ndev1: path=/dev/nvidia-uvm,mode=0666\n"
        "dev2: /dev/dri/card0\n"
        "lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 508:* rwm\n"
        "lxc.cgroup2.devices.allow: c 226:* rwm\n"
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file\n"
        "[snap1]\ndev9: /dev/nvidia9\n"
    )
    cfg = pveconf.parse_config(text, 129)
    assert cfg.hookscript == "local:snippets/pveclean-hook"
    assert cfg.gpu_lines(frozenset({508})) == [
        "dev0: /dev/nvidia0,gid=44", "dev1: path=/dev/nvidia-uvm,mode=0666",
        "lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 508:* rwm",
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
    ]
    assert cfg.gpu_paths() == ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia1"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_container_config_parser_never_crashes(text: str) -> None:
    cfg = pveconf.parse_config(text, 100)
    cfg.gpu_lines()
    cfg.gpu_paths()


@pytest.mark.parametrize("bad", ["abc", "", "99", "1000000000", "-5", "0129", "12 3", "1e3"])
def test_bad_vmids(bad: str) -> None:
    with pytest.raises(PvecleanError) as exc:
        pveconf.parse_vmid(bad)
    assert exc.value.exit_code == 2
