"""`pveclean doctor` end to end without root: a config dir, device nodes and a version file
under tmp_path, NVML unavailable (said as a warning, its checks skipped)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pveclean.commands import doctor
from pveclean.core.config import Config
from pveclean.errors import ExitCode, PvecleanError

CONF = """arch: amd64
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 508:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
"""


def cfg_for(tmp: Path) -> Config:
    (tmp / "lxc").mkdir()
    (tmp / "lxc" / "129.conf").write_text(CONF)
    (tmp / "lxc" / "130.conf").write_text("arch: amd64\n")
    dev = tmp / "dev"
    dev.mkdir()
    (tmp / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  "
                                 "Tue Oct  8 03:01:57 UTC 2024\n")
    return replace(Config(), pve_config_dir=str(tmp / "lxc"), devices=[str(dev / "nvidia*")],
                   nvidia_version_file=str(tmp / "version"), cgroup_root=str(tmp / "cg"),
                   lxc_path=str(tmp / "lxcpath"), nvml_library=str(tmp / "no-such-nvml.so"),
                   deadline_seconds=10.0)


def test_doctor_says_what_it_found_and_exits_1(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    out: list[str] = []
    assert doctor.run(cfg, [], True, out.append) == ExitCode.RESIDUAL
    got = json.loads(out[0])
    assert got["looked"] == ["129"]  # 130 grants no GPU
    assert [f["check"] for f in got["findings"]] == ["missing_node", "missing_node"]
    assert any("NVML" in w for w in got["warnings"])
    out.clear()
    assert doctor.run(cfg, ["129"], False, out.append) == ExitCode.RESIDUAL
    assert out[0].splitlines()[0].startswith("CT 129  missing_node: /dev/nvidia0 does not exist")
    assert out[0].splitlines()[-1] == "2 finding(s); looked at 129"


def test_a_container_that_is_not_here_exits_3_and_a_bad_vmid_2(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    with pytest.raises(PvecleanError) as exc:
        doctor.run(cfg, ["131"], False, print)
    assert exc.value.exit_code == ExitCode.ACCESS and "131" in str(exc.value)
    with pytest.raises(PvecleanError) as exc:
        doctor.run(cfg, ["12x"], False, print)
    assert exc.value.exit_code == ExitCode.USAGE


def test_nothing_found_exits_0(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    (tmp_path / "lxc" / "129.conf").write_text(
        "arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
        "lxc.hook.mount: /usr/share/lxc/hooks/nvidia\n")
    out: list[str] = []
    assert doctor.run(cfg, ["129"], False, out.append) == ExitCode.OK
    assert "nothing found; looked at 129" in out[0]
