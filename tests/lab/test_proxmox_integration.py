"""pveclean against the lab's pct/pvesh stand-ins, which mirror the cited Proxmox functions:
config locks, hook environments, the API's config, snippets, reboots inside the guest and the
systemd drop-in."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from pveclean.host import configfile
from pveclean.proxmox import pveapi
from tests.harness.lxclab import Lab
from tests.helpers import HOOK, conf, other_hook, pveclean, wait_for


@contextmanager
def config_lock_held(lab: Lab, vmid: int, seconds: float) -> Iterator[None]:
    """Another task (a backup, a start...) holds the container's config lock for a while."""
    lockdir = lab.root / "run/lock/lxc"
    lockdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lockdir / f"pve-config-{vmid}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    timer = threading.Timer(seconds, os.close, (fd,))
    timer.start()
    try:
        yield
    finally:
        timer.join()


def pvesh(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(lab.root / "bin/pvesh"), *args, "--output-format", "json"],
                          capture_output=True, text=True, check=False, timeout=60)


def set_storage(lab: Lab, content: str, extra: str = "") -> None:
    (lab.root / "etc/pve/storage.cfg").write_text(
        f"dir: local\n\tpath {lab.root / 'var/lib/vz'}\n\tcontent {content}\n{extra}")


def recorder(lab: Lab, name: str = "record") -> Path:
    """A hookscript that logs phase, the lock state, and part of its environment."""
    log = lab.root / f"{name}.log"
    lockfile = lab.root / "run/lock/lxc/pve-config-{vmid}.lock"
    script = lab.snippets / name
    script.write_text(
        f"#!{sys.executable}\n"
        "import fcntl, os, sys\n"
        f"lock = {str(lockfile)!r}.format(vmid=sys.argv[1])\n"
        "fd = os.open(lock, os.O_RDWR | os.O_CREAT)\n"
        "try:\n"
        "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); held = 'free'\n"
        "except BlockingIOError:\n"
        "    held = 'held'\n"
        "env = os.environ\n"
        f"with open({str(log)!r}, 'a') as fh:\n"
        "    fh.write(f\"{sys.argv[2]} {held} path={env.get('PATH')} lc={env.get('LC_ALL')} "
        "foo={env.get('PVECLEAN_TEST_FOO', 'unset')}\\n\")\n")
    script.chmod(0o755)
    return log


def phases(log: Path) -> list[str]:
    return [ln.split()[0] for ln in log.read_text().splitlines()] if log.exists() else []


# ---- the stand-ins ------------------------------------------------------------------------
def test_contended_config_lock_prints_chatter_on_stderr_then_succeeds(lab: Lab,
                                                                      vmid: int) -> None:
    """PVE::Tools::lock_file_full: `trying to acquire lock...` then ` OK`, on stderr."""
    lab.create_ct(vmid, start=False)
    with config_lock_held(lab, vmid, 1.0):
        res = lab.pct("set", str(vmid), "--delete", "hookscript", check=False)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "trying to acquire lock...\n OK\n"
    res = lab.pct("set", str(vmid), "--delete", "hookscript")
    assert res.stderr == ""  # not contended: nothing said


def test_hooks_inherit_the_callers_environment_and_post_stop_holds_the_lock_via_vm_stop(
        lab: Lab, vmid: int) -> None:
    """run_command inherits the environment (LC_ALL=C; PATH forced by the CLI); post-stop runs
    under lxc-start (systemd's environment) and holds the lock only through vm_stop."""
    lab.create_ct(vmid, start=False)
    log = recorder(lab)
    lab.pct("set", str(vmid), "--hookscript", "local:snippets/record")
    env = {**os.environ, "PVECLEAN_TEST_FOO": "bar", "PATH": "/opt/admin/bin:/usr/bin:/bin"}
    for args in (["start"], ["stop"]):
        subprocess.run([str(lab.pct_path), *args, str(vmid)], env=env, check=True,
                       capture_output=True, timeout=60)
    lines = log.read_text().splitlines()
    assert phases(log) == ["pre-start", "post-start", "pre-stop", "post-stop"]  # all waited
    cli = "path=/sbin:/bin:/usr/sbin:/usr/bin lc=C foo=bar"
    assert lines[0] == f"pre-start held {cli}" and lines[2] == f"pre-stop held {cli}"
    assert lines[3].startswith("post-stop held path=/usr/local/sbin:") and "foo=unset" in lines[3]

    lab.pct("start", str(vmid))
    lab.pct("exec", str(vmid), "--", "/bin/poweroff")  # from inside: no vm_stop, no lock
    assert wait_for(lambda: len(phases(log)) == 7, 15)
    assert phases(log)[4:] == ["pre-start", "post-start", "post-stop"]
    assert log.read_text().splitlines()[6].startswith("post-stop free ")


def test_pct_exec_keeps_the_environment_with_the_cli_path(lab: Lab, vmid: int) -> None:
    """PVE::CLI::pct exec: `lxc-attach --keep-env` (PVE 8), PATH forced by the CLI."""
    lab.create_ct(vmid)
    env = {**os.environ, "PVECLEAN_TEST_FOO": "bar"}
    res = subprocess.run([str(lab.pct_path), "exec", str(vmid), "--", "/bin/sh", "-c",
                          'echo "$PATH $PVECLEAN_TEST_FOO"'], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    assert res.stdout == "/sbin:/bin:/usr/sbin:/usr/bin bar\n"


def test_api_config_merges_pending_unless_current(host: Lab, vmid: int) -> None:
    """PVE::AbstractConfig::load_current_config."""
    host.create_ct(vmid, start=False)
    path = host.root / "etc/pve/lxc" / f"{vmid}.conf"
    path.write_text(path.read_text() + "hookscript: local:snippets/old\n\n[pve:pending]\n"
                    "hookscript: local:snippets/new\nmemory: 1024\ndelete: arch\n")
    merged = json.loads(pvesh(host, "get", f"/nodes/labnode/lxc/{vmid}/config").stdout)
    assert merged["hookscript"] == "local:snippets/new" and merged["memory"] == 1024
    assert "arch" not in merged
    current = json.loads(pvesh(host, "get", f"/nodes/labnode/lxc/{vmid}/config",
                               "-current", "1").stdout)
    assert current["hookscript"] == "local:snippets/old" and current["memory"] == 512
    assert current["arch"] == "amd64"
    # pveclean reads the config in force
    cfg = configfile.load(host.config_path)
    api = pveapi.connect(cfg)
    env_path = os.environ["PATH"]
    os.environ["PATH"] = f"{host.root / 'bin'}:{env_path}"
    try:
        assert api.ct_config("labnode", vmid).hookscript == "local:snippets/old"
    finally:
        os.environ["PATH"] = env_path


def test_cluster_resources_status_lags_but_the_node_knows(host: Lab, vmid: int) -> None:
    """pvestatd's status is `unknown` until its first round; vm_status is live."""
    host.create_ct(vmid)
    res = json.loads(pvesh(host, "get", "/cluster/resources", "-type", "vm").stdout)
    assert [r["status"] for r in res if r["vmid"] == vmid] == ["unknown"]
    live = json.loads(pvesh(host, "get", f"/nodes/labnode/lxc/{vmid}/status/current").stdout)
    assert live["status"] == "running"


def test_content_dirs_and_snippets_listing(host: Lab, vmid: int) -> None:
    """PVE::Storage::Plugin::get_subdir; volume_list lists only the storage's content types."""
    host.create_ct(vmid, start=False)
    hooks = host.root / "var/lib/vz/hooks"
    hooks.mkdir()
    (hooks / "x.sh").write_text("#!/bin/sh\nexit 0\n")
    (hooks / "x.sh").chmod(0o755)
    listing = "/nodes/labnode/storage/local/content"
    set_storage(host, "iso,vztmpl,backup", "\tcontent-dirs snippets=hooks\n")
    assert json.loads(pvesh(host, "get", listing, "-content", "snippets").stdout) == []
    host.pct("set", str(vmid), "--hookscript", "local:snippets/x.sh")  # found in hooks/
    set_storage(host, "iso,vztmpl,backup,snippets", "\tcontent-dirs snippets=hooks\n")
    items = json.loads(pvesh(host, "get", listing, "-content", "snippets").stdout)
    assert [i["volid"] for i in items] == ["local:snippets/x.sh"]


def test_reboot_inside_the_guest_runs_no_hook_phase(lab: Lab, vmid: int) -> None:
    """lxc-pve-poststop-hook: TARGET=reboot -> reboot file, exit 1 before exec_hookscript;
    pve-container-stop-wrapper restarts the unit: lxc-start -F, no pre-start/post-start."""
    lab.create_ct(vmid, start=False)
    log = recorder(lab)
    lab.pct("set", str(vmid), "--hookscript", "local:snippets/record")
    lab.pct("start", str(vmid))
    init = lab.init_pid(vmid)
    lab.pct("exec", str(vmid), "--", "/bin/reboot")
    assert wait_for(lambda: lab.init_pid(vmid) not in (None, init), 15)
    assert lab.pct("status", str(vmid)).stdout == "status: running\n"
    time.sleep(0.5)
    assert phases(log) == ["pre-start", "post-start"]  # nothing for the reboot
    assert "reboot: restart requested, no hookscript" in (
        lab.root / "log" / f"poststop-{vmid}.log").read_text()
    assert not (lab.root / "lxc" / str(vmid) / "reboot").exists()  # the wrapper took it


# ---- pveclean against them ----------------------------------------------------------------
def test_install_chain_under_a_held_config_lock(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, gpus=(0,), start=False)
    log = other_hook(host, vmid)
    with config_lock_held(host, vmid, 1.5):
        res = pveclean(host, "install", str(vmid), "--enable-snippets", "--chain")
    assert res.returncode == 0, res.stderr
    assert "trying to acquire lock" not in res.stderr
    assert conf(host, vmid)["hookscript"] == HOOK
    record = host.root / "state/chain" / str(vmid)
    assert record.is_file()
    host.pct("start", str(vmid))
    assert phases_of(log) == ["pre-start", "post-start"]  # the chained script still runs
    with config_lock_held(host, vmid, 1.5):
        res = pveclean(host, "uninstall", str(vmid))
    assert res.returncode == 0, res.stderr
    assert conf(host, vmid)["hookscript"] == "local:snippets/other.sh"
    assert not record.exists()


def phases_of(log: Path) -> list[str]:
    return [ln.split()[1] for ln in log.read_text().splitlines()] if log.exists() else []


def test_gpu_lines_proxmox_accepts(host: Lab, vmid: int, vmid2: int) -> None:
    """`path` anywhere in devN:, `lxc.key = value` lines with a colon in the value."""
    host.create_ct(vmid, gpus=(), start=False,
                   extra=[("dev0", "mode=0666,path=/dev/nvidia0")])
    major = os.major(host.nodes["nvidia1"].stat().st_rdev)
    host.create_ct(vmid2, gpus=(), start=False)
    path = host.root / "etc/pve/lxc" / f"{vmid2}.conf"
    path.write_text(path.read_text() + f"lxc.cgroup2.devices.allow = c {major}:* rwm\n"
                    "lxc.mount.entry = /dev/nvidia1 dev/nvidia1 none bind,optional,"
                    "create=file\n")
    host.write_config(state_dir=str(host.root / "state"), devices=[
        str(host.root / "dev" / "nvidia*")])
    res = pveclean(host, "status", "--json")
    assert res.returncode == 0, res.stderr
    gpu = {e["vmid"]: e["gpu"] for e in json.loads(res.stdout)["containers"]}
    assert gpu[vmid] == ["dev0: mode=0666,path=/dev/nvidia0"]
    assert "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file" in gpu[
        vmid2]
    res = pveclean(host, "install", "--all-gpu", "--enable-snippets")
    assert res.returncode == 0, res.stderr
    assert conf(host, vmid)["hookscript"] == HOOK


def test_install_writes_where_content_dirs_points(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, gpus=(0,), start=False)
    set_storage(host, "iso,vztmpl,backup,snippets", "\tcontent-dirs snippets=hooks\n")
    res = pveclean(host, "install", str(vmid))
    assert res.returncode == 0, res.stderr
    assert (host.root / "var/lib/vz/hooks/pveclean-hook").is_file()
    assert not (host.snippets / "pveclean-hook").exists()
    res = host.pct("start", str(vmid))  # Proxmox finds it: the start works
    assert res.returncode == 0


def test_status_right_after_a_start_shows_holders(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, gpus=(0,))
    w = host.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 700})
    res = pveclean(host, "status", "--json")
    assert res.returncode == 0, res.stderr
    (e,) = [e for e in json.loads(res.stdout)["containers"] if e["vmid"] == vmid]
    assert e["status"] == "running"
    assert [h["host_pid"] for h in e["holders"]] == w.host_pids(host)


def test_no_missing_warning_when_the_storage_lacks_snippets(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, gpus=(0,), start=False)
    assert pveclean(host, "install", str(vmid), "--enable-snippets").returncode == 0
    set_storage(host, "iso,vztmpl,backup")  # the script still runs; the listing is []
    res = pveclean(host, "status")
    assert res.returncode == 0, res.stderr
    assert "missing on node" not in res.stdout


def test_ct_for_a_vm_or_a_container_on_another_node(lab: Lab) -> None:
    pve = lab.root / "etc/pve"
    (pve / "qemu-server").mkdir()
    (pve / "qemu-server/100.conf").write_text("memory: 4096\n")
    (pve / "nodes/pve2/lxc").mkdir(parents=True)
    (pve / "nodes/pve2/lxc/101.conf").write_text("arch: amd64\n")
    (pve / "nodes/pve2/qemu-server").mkdir(parents=True)
    (pve / "nodes/pve2/qemu-server/102.conf").write_text("memory: 4096\n")
    res = lab.pveclean("ct", "100")
    assert res.returncode == 2
    assert res.stderr.startswith("pveclean: VMID 100 is a virtual machine (QEMU), not a "
                                 "container")
    res = lab.pveclean("ct", "101")
    assert res.returncode == 3
    assert res.stderr == "pveclean: CT 101 is on node pve2: run 'pveclean ct 101' there\n"
    res = lab.pveclean("ct", "102")
    assert res.returncode == 2 and "(QEMU) on node pve2" in res.stderr
    res = lab.pveclean("ct", "103")
    assert res.returncode == 3 and "CT 103 does not exist on this node" in res.stderr


# ---- every start and stop: the systemd drop-in --------------------------------------------
def test_systemd_dropin_cleans_up_on_a_reboot_inside_the_guest(host: Lab, vmid: int) -> None:
    units = host.root / "etc/systemd/system"
    host.write_config(state_dir=str(host.root / "state"), systemd_dir=str(units))
    host.create_ct(vmid, gpus=(0,))
    res = pveclean(host, "install", str(vmid), "--enable-snippets", "--systemd")
    assert res.returncode == 0, res.stderr
    dropin = units / f"pve-container@{vmid}.service.d/pveclean.conf"
    text = dropin.read_text()
    exe = Path(sys.executable).parent / "pveclean"
    assert f"ExecStartPre=/bin/sh -c '{exe} unit -c {host.config_path} {vmid} start-pre;" in text
    assert f"ExecStopPost=-{exe} unit -c {host.config_path} {vmid} stop-post\n" in text
    res = pveclean(host, "install", str(vmid), "--systemd")  # idempotent
    assert res.returncode == 0 and "nothing to change" in res.stdout, res.stdout
    assert dropin.read_text() == text

    # A GPU holder outside the container's PID namespace, in its cgroup: the guest's own
    # reboot leaves it behind (stuck), and no hookscript phase runs on that reboot.
    w = host.run_on_host("python3", hold=[str(host.nodes["nvidia0"])], pidns=True,
                         cgroup=host.cgroup(vmid) / "ns", gpu_mib={0: 700})
    left = [p for p in w.host_pids(host) if w.popen is None or p != w.popen.pid]
    assert left
    init = host.init_pid(vmid)
    host.pct("exec", str(vmid), "--", "/bin/reboot")
    assert wait_for(lambda: host.init_pid(vmid) not in (None, init), 30)
    assert not any(host.alive(p) for p in left)
    log = (host.root / "lxc" / str(vmid) / "unit.log").read_text()
    assert f"unit -c {host.config_path} {vmid} stop-post -> 0" in log
    assert any(f"unit -c {host.config_path} {vmid} start-pre;" in ln and ln.endswith("-> 0")
               for ln in log.splitlines()), log
    reps = sorted(host.report_dir.glob(f"{vmid}-*.yaml"))
    assert reps, "the drop-in's cleanup wrote no report"
    # its reports say what ran them: their phases are the hookscript's it stands in for
    via = {yaml.safe_load(p.read_text()).get("via") for p in reps}
    assert via <= {f"systemd drop-in (pve-container@{vmid}.service ExecStartPre=)",
                   f"systemd drop-in (pve-container@{vmid}.service ExecStopPost=)"}, via
    assert None not in via
    assert host.pct("status", str(vmid)).stdout == "status: running\n"

    res = pveclean(host, "uninstall", str(vmid))
    assert res.returncode == 0, res.stderr
    assert not dropin.exists() and not dropin.parent.exists()
    assert "hookscript" not in conf(host, vmid)


def test_without_the_dropin_a_reboot_inside_the_guest_fails_silently(lab: Lab,
                                                                     vmid: int) -> None:
    """What the drop-in is for: the same stuck holder makes the unit's restart fail, and no
    hookscript phase ran to say why."""
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_on_host("python3", hold=[str(lab.nodes["nvidia0"])], pidns=True,
                        cgroup=lab.cgroup(vmid) / "ns")
    left = [p for p in w.host_pids(lab) if w.popen is None or p != w.popen.pid]
    lab.pct("exec", str(vmid), "--", "/bin/reboot")
    unit_state = lab.root / "run/pve-lab" / f"unit-{vmid}.state"
    assert wait_for(lambda: unit_state.read_text().strip() == "inactive", 30)
    assert lab.pct("status", str(vmid)).stdout == "status: stopped\n"
    assert all(lab.alive(p) for p in left)
    assert "Failed creating cgroups" in (lab.root / "lxc" / str(vmid) / "unit.log").read_text()
