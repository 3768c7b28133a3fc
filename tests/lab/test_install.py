"""`pveclean install` / `uninstall` on a lab host: real containers, pvesh and pct stand-ins,
proxmoxer's local backend."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from tests.harness.lxclab import Lab
from tests.helpers import HOOK, conf, other_hook, pveclean

ENABLE_HINT = "pvesm set local --content iso,vztmpl,backup,snippets"


def test_install_without_snippets_content_registers_a_working_hook(host: Lab,
                                                                    vmid: int) -> None:
    """PVE::GuestHelpers::check_hookscript checks the volume's path, type, -f and -x, never the
    storage's content list: the hook runs; install says how to make it show in the GUI."""
    host.create_ct(vmid, gpus=(0,))
    w = host.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 1000})
    res = pveclean(host, "install", str(vmid))
    assert res.returncode == 0, res.stderr
    assert ENABLE_HINT in res.stdout and "runs anyway" in res.stdout
    assert "snippets" not in (host.root / "etc/pve/storage.cfg").read_text()
    script = host.snippets / "pveclean-hook"
    st = script.stat()
    assert stat.S_IMODE(st.st_mode) == 0o755 and (st.st_uid, st.st_gid) == (0, 0)
    text = script.read_text()
    assert f'PVECLEAN_BIN="{Path(sys.executable).parent / "pveclean"}"' in text
    assert f'PVECLEAN_CONFIG_FILE="{host.config_path}"' in text
    assert conf(host, vmid)["hookscript"] == HOOK
    res = pveclean(host, "install", str(vmid), "--enable-snippets")
    assert res.returncode == 0, res.stderr
    assert "content iso,vztmpl,backup,snippets" in (host.root / "etc/pve/storage.cfg").read_text()

    # Proxmox now runs it: pct stop calls the registered hook, which stops the holder.
    out = host.pct("stop", str(vmid)).stdout
    assert f"pveclean: CT {vmid} pre-stop: stopped 1 GPU holders (1000 MiB freed)" in out
    assert not any(host.alive(p) for p in w.host_pids(host))


def test_second_install_changes_nothing(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, gpus=(0,), start=False)
    assert pveclean(host, "install", str(vmid), "--enable-snippets").returncode == 0
    script = host.snippets / "pveclean-hook"
    before = (script.stat().st_mtime_ns, (host.root / "etc/pve/lxc" / f"{vmid}.conf").read_text())
    res = pveclean(host, "install", str(vmid))
    assert res.returncode == 0, res.stderr
    assert f"CT {vmid} (labnode): unchanged, hookscript is {HOOK}" in res.stdout
    assert "nothing to change" in res.stdout
    after = (script.stat().st_mtime_ns, (host.root / "etc/pve/lxc" / f"{vmid}.conf").read_text())
    assert after == before


def test_other_hookscript_is_refused_then_chained_then_restored(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, gpus=(0,), start=False)
    log = other_hook(host, vmid)
    res = pveclean(host, "install", str(vmid), "--enable-snippets")
    assert res.returncode == 2
    assert (f"CT {vmid} already has hookscript local:snippets/other.sh; not replacing it: "
            "rerun with --chain") in res.stderr
    assert conf(host, vmid)["hookscript"] == "local:snippets/other.sh"
    assert not (host.snippets / "pveclean-hook").exists()  # a refused plan changes nothing

    res = pveclean(host, "install", str(vmid), "--enable-snippets", "--chain", "--dry-run")
    assert res.returncode == 0 and "chain local:snippets/other.sh" in res.stdout
    assert "dry run: 3 change(s) planned, nothing changed" in res.stdout
    assert conf(host, vmid)["hookscript"] == "local:snippets/other.sh"
    assert not (host.snippets / "pveclean-hook").exists()

    res = pveclean(host, "install", str(vmid), "--enable-snippets", "--chain")
    assert res.returncode == 0, res.stderr
    assert conf(host, vmid)["hookscript"] == HOOK
    record = host.root / "state/chain" / str(vmid)
    assert record.read_text() == f"local:snippets/other.sh\n{host.snippets / 'other.sh'}\n"
    host.pct("start", str(vmid))
    host.pct("stop", str(vmid))
    phases = [ln.split()[1] for ln in log.read_text().splitlines()]
    assert phases[:3] == ["pre-start", "post-start", "pre-stop"]  # post-stop comes via LXC

    res = pveclean(host, "uninstall", str(vmid))
    assert res.returncode == 0, res.stderr
    assert f"CT {vmid}: hookscript local:snippets/other.sh restored" in res.stdout
    assert conf(host, vmid)["hookscript"] == "local:snippets/other.sh"
    assert not record.exists()
    res = pveclean(host, "uninstall", str(vmid))
    assert res.returncode == 0 and "not pveclean's" in res.stdout
    assert "nothing to change" in res.stdout


def test_all_gpu_and_uninstall_all(host: Lab, vmid: int, vmid2: int) -> None:
    host.create_ct(vmid, gpus=(1,), style="dev", start=False)
    host.create_ct(vmid2, gpus=(), start=False)
    res = pveclean(host, "install", "--all-gpu", "--enable-snippets")
    assert res.returncode == 0, res.stderr
    assert conf(host, vmid)["hookscript"] == HOOK and "hookscript" not in conf(host, vmid2)
    res = pveclean(host, "uninstall", "--all")
    assert res.returncode == 0, res.stderr
    assert "hookscript" not in conf(host, vmid)
    assert not (host.snippets / "pveclean-hook").exists()


def test_locked_container_and_bad_input(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, gpus=(0,), start=False, extra=[("lock", "backup")])
    res = pveclean(host, "install", str(vmid), "--enable-snippets")
    assert res.returncode == 3 and f"CT {vmid} is locked (backup)" in res.stderr
    assert "hookscript" not in conf(host, vmid)
    for args, needle in ((["install"], "give guest IDs, --all or --all-gpu-vms"),
                         (["install", "12"], "invalid VMID 12"),
                         (["install", "999999998"], "CT 999999998 does not exist"),
                         (["install", str(vmid), "--storage", "nope"], "'nope' does not exist")):
        res = pveclean(host, *args)
        assert res.returncode in (2, 3) and needle in res.stderr, (args, res.stderr)
        assert all(ln.startswith("pveclean: ") for ln in res.stderr.splitlines()), res.stderr


def test_uninstall_of_a_destroyed_container_removes_its_dropin(host: Lab, vmid: int) -> None:
    """`pct destroy` leaves /etc/systemd/system/pve-container@N.service.d behind: a later
    container with that VMID would run pveclean's checks. uninstall N removes it."""
    units = host.root / "systemd"
    host.write_config(state_dir=str(host.root / "state"), systemd_dir=str(units))
    host.create_ct(vmid, gpus=(0,), start=False)
    assert pveclean(host, "install", str(vmid), "--enable-snippets", "--systemd").returncode == 0
    dropin = units / f"pve-container@{vmid}.service.d/pveclean.conf"
    assert dropin.is_file()
    (host.root / "etc/pve/lxc" / f"{vmid}.conf").unlink()  # destroy_lxc_container's end
    res = pveclean(host, "uninstall", str(vmid))
    assert res.returncode == 0, res.stderr
    assert f"CT {vmid} no longer exists: removing what pveclean left for it" in res.stdout
    assert not dropin.exists()
    again = pveclean(host, "uninstall", str(vmid))
    assert again.returncode == 3 and "pveclean left nothing for it" in again.stderr
