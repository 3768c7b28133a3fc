"""Config trust on lab containers: a config that others own or can change is refused, and so are
programs it would make root run."""

from __future__ import annotations

import os

from tests.harness.lxclab import Lab


def test_config_not_owned_by_root_or_writable_is_refused(lab: Lab, vmid: int) -> None:
    cfg = lab.config_path
    cfg.chmod(0o664)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "writable by group or others" in r.stderr
    cfg.chmod(0o644)
    os.chown(cfg, 1000, 0)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "not owned by root" in r.stderr
    os.chown(cfg, 0, 0)


# ---- trust only root's files --------------------------------------------------------------

NOBODY = 65534


def test_loose_config_is_refused_whatever_it_says(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    lab.write_config(strict_permissions=False)
    os.chown(lab.config_path, NOBODY, NOBODY)
    lab.config_path.chmod(0o666)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "not owned by root" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    os.chown(lab.config_path, 0, 0)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "writable by group or others" in r.stderr, r.stderr
    assert lab.alive(pid)  # a config that is not root's controls nothing


def test_programs_the_config_makes_root_run_must_be_roots(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    pct = lab.root / "bin" / "pct"
    pct.chmod(0o777)  # anyone could put their code into what every hook runs as root
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "pct_command" in r.stderr, r.stderr
    pct.chmod(0o755)
    assert lab.nvml is not None
    lib_dir = lab.nvml.lib_path.parent
    lib_dir.chmod(0o777)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "nvml_library" in r.stderr and "directory" in r.stderr
    lib_dir.chmod(0o755)
    os.chown(lab.nvml.lib_path, NOBODY, 0)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "nvml_library" in r.stderr
    os.chown(lab.nvml.lib_path, 0, 0)
    assert lab.pveclean("ct", str(vmid)).returncode == 0


def test_config_in_a_directory_others_can_write_is_refused(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    shared = lab.root / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: anyone can create (or, after a reboot, recreate) it
    cfg = shared / "x.yaml"
    cfg.write_text(lab.config_path.read_text())
    cfg.chmod(0o644)
    r = lab.pveclean("ct", str(vmid), "--config", str(cfg))
    assert r.returncode == 2 and f"directory {shared} is writable" in r.stderr, r.stderr
