"""Proxmox as its source behaves (issue 14): the lab's pct/pvesh stand-ins mirror the cited
Proxmox functions, and pveclean copes with what they do."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from pveclean.core import config
from pveclean.errors import PvecleanError
from pveclean.host import configfile
from pveclean.proxmox import chain, pveapi, pveconf
from tests.lab.lxclab import Lab
from tests.test_install import conf, other_hook, pveclean
from tests.test_install import host as host  # the fixture
from tests.test_pveapi import Cluster
from tests.test_pveapi import cluster as cluster  # the fixture

HOOK = "local:snippets/pveclean-hook"


def wait_for(pred: object, timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


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
    assert wait_for(lambda: len(phases(log)) == 7)
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
    assert wait_for(lambda: lab.init_pid(vmid) not in (None, init))
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


def test_https_this_node_is_the_local_machine(cluster: Cluster,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pveapi, "nodename", lambda: "pve2")
    api = pveapi.connect(configfile.load(cluster.config))
    assert api.local_node() == "pve2"  # not pve1, the node api.host is


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


# ---- chained scripts as Proxmox runs them -------------------------------------------------
@pytest.fixture
def chained(tmp_path: Path) -> tuple[config.Config, Path]:
    """A storage.cfg next to the configs, a chained script recorded for CT 100."""
    pve = tmp_path / "etc/pve"
    (pve / "lxc").mkdir(parents=True)
    vz = tmp_path / "vz"
    (vz / "snippets").mkdir(parents=True)
    (pve / "storage.cfg").write_text(f"dir: local\n\tpath {vz}\n\tcontent snippets\n")
    cfg = config.Config(pve_config_dir=str(pve / "lxc"), state_dir=str(tmp_path / "state"),
                        deadline_seconds=1)
    script = vz / "snippets/theirs.sh"
    chain.write_record(cfg, 100, "local:snippets/theirs.sh", str(script))
    return cfg, script


def test_chained_script_has_no_timeout_and_no_owner_check(
        chained: tuple[config.Config, Path], tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    cfg, script = chained
    out = tmp_path / "out"
    script.write_text(f"#!/bin/sh\nsleep 1.5\necho \"$1 $2\" > {out}\nexit 7\n")
    script.chmod(0o777)  # group/others may write: Proxmox runs it all the same
    os.chown(script, 1234, 1234)  # not root's (NFS root_squash)
    assert chain.run_chained(100, "pre-start", cfg) == 7  # not killed after 1 s
    assert out.read_text() == "100 pre-start\n"
    assert "exited 7" in capfd.readouterr().out


def test_chained_path_resolved_on_every_run(chained: tuple[config.Config, Path],
                                            tmp_path: Path) -> None:
    cfg, script = chained
    script.write_text("#!/bin/sh\nexit 0\n")  # where it was at install time
    script.chmod(0o755)
    moved = tmp_path / "vz/hooks/theirs.sh"
    moved.parent.mkdir()
    moved.write_text("#!/bin/sh\nexit 5\n")
    moved.chmod(0o755)
    storage = Path(cfg.pve_config_dir).parent / "storage.cfg"
    storage.write_text(storage.read_text() + "\tcontent-dirs snippets=hooks\n")
    assert chain.run_chained(100, "pre-start", cfg) == 5  # from where Proxmox looks now


@pytest.mark.parametrize("kind", ["missing", "not-executable", "eio"])
def test_bad_chained_script_is_one_line(chained: tuple[config.Config, Path], kind: str,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    cfg, script = chained
    if kind == "not-executable":
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o644)
    elif kind == "eio":
        script.write_text("#!/nonexistent/interpreter\n")  # exec fails with an OSError
        script.chmod(0o755)
    assert chain.run_chained(100, "pre-start", cfg) == 1
    assert chain.run_chained(100, "post-stop", cfg) == 0
    out = capfd.readouterr()
    lines = out.out.splitlines()
    assert len(lines) == 2 and all(ln.startswith("pveclean: CT 100 ") for ln in lines)
    assert "Traceback" not in out.out + out.err


def test_unreadable_storage_cfg_falls_back_to_the_recorded_path(
        chained: tuple[config.Config, Path]) -> None:
    cfg, script = chained
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    (Path(cfg.pve_config_dir).parent / "storage.cfg").unlink()
    assert chain.run_chained(100, "pre-start", cfg) == 3


def test_read_config_error_is_a_pveclean_error(tmp_path: Path) -> None:
    with pytest.raises(PvecleanError, match="does not exist on this node"):
        pveconf.read_config(str(tmp_path), 100)


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


def test_unit_phases_never_fail_the_unit_but_by_a_refusal(tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str],
                                                         ) -> None:
    from pveclean.commands import unit
    from pveclean.host.prelude import NvmlWorker
    from pveclean.proxmox import dropin

    (tmp_path / "lxc").mkdir()
    cfgfile = tmp_path / "pveclean.yaml"
    cfgfile.write_text(f"pve_config_dir: {tmp_path / 'lxc'}\nstate_dir: {tmp_path / 's'}\n"
                       f"report_dir: {tmp_path / 'r'}\nsyslog: false\n")
    cfgfile.chmod(0o644)
    for argv in (["-c", str(cfgfile), "100", "start-pre"],  # no such container
                 ["-c", str(cfgfile), "100", "stop-post"],
                 ["-c", str(cfgfile), "100", "bogus"],
                 ["-c", str(cfgfile), "abc", "start-pre"],
                 ["-c", str(tmp_path / "missing.yaml"), "100", "start-pre"]):
        with NvmlWorker() as nvml:
            assert unit.from_argv(argv, nvml) == 0, argv
    out = capfd.readouterr()
    assert "Traceback" not in out.out + out.err
    assert len(out.out.splitlines()) == 5
    with pytest.raises(PvecleanError, match="cannot go into a systemd unit"):
        dropin.dropin_text(100, "/opt/my pveclean/bin/pveclean", None)
    text = dropin.dropin_text(100, "/usr/sbin/pveclean", None)
    assert "ExecStartPre=/bin/sh -c '/usr/sbin/pveclean unit 100 start-pre;" in text


@pytest.mark.parametrize(("script", "expect_rc", "warned"), [
    (None, 0, True),  # pveclean gone (a removed package, a venv whose Python went away)
    ("#!/nonexistent/python3\n", 0, True),  # its interpreter gone
    ("#!/bin/sh\nexit 1\n", 0, True),  # a crash
    ("#!/bin/sh\nkill -9 $$\n", 0, True),  # killed (OOM)
    ("#!/bin/sh\nexit 0\n", 0, False),
    ("#!/bin/sh\nexit 75\n", 75, False),  # the refuse decision, and only it, fails the unit
])
def test_dropin_start_pre_fails_the_unit_only_on_a_refusal(
        tmp_path: Path, script: str | None, expect_rc: int, warned: bool) -> None:
    """The ExecStartPre= line as systemd runs it ($$ is a literal $), with a pveclean that is
    missing, broken, killed, fine or refusing."""
    from pveclean.proxmox import dropin

    exe = tmp_path / "pveclean"
    if script is not None:
        exe.write_text(script)
        exe.chmod(0o755)
    line = dropin.dropin_text(100, str(exe), None).split("ExecStartPre=", 1)[1].splitlines()[0]
    argv = shlex.split(line.replace("$$", "$"))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    assert res.returncode == expect_rc, res
    assert ("WARNING: CT 100 start-pre" in res.stdout) == warned, res.stdout
