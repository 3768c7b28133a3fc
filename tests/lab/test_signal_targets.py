"""Safety guarantees: identity before signals, PID reuse, bounded time, locking, config and
report security."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from pveclean.core.config import Config
from pveclean.core.records import Scope
from pveclean.host import pidfds
from pveclean.host.devnodes import gpu_devices
from pveclean.host.procfs import read_status
from pveclean.host.procscan import scan_host
from tests.harness.lxclab import Lab


def _scope(lab: Lab, vmid: int) -> Scope:
    return Scope(vmid, lab.cgroup(vmid), gpu_devices([str(lab.root / "dev/nvidia*")]),
                 frozenset(Config().protect))


def _spawn_with_pid(target: int) -> subprocess.Popen[bytes] | None:
    """Start a host process that gets PID `target` (real PID reuse via ns_last_pid)."""
    for _ in range(20):
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(target - 1))
        p = subprocess.Popen(["sleep", "30"])
        if p.pid == target:
            return p
        p.kill()
        p.wait()
    return None


def test_recycled_pid_is_never_signalled(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    scope = _scope(lab, vmid)
    holder = scan_host(scope).holders[pid]  # discovered while it held the GPU
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while read_status(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_status(pid) is None, "container init did not reap the holder"
    # start times count in clock ticks (10 ms): let two pass so the new owner of the PID has
    # a start time of its own, as any PID recycled after a real cleanup does
    time.sleep(3 / os.sysconf("SC_CLK_TCK"))
    intruder = _spawn_with_pid(pid)
    if intruder is None:
        pytest.skip("could not get the same PID back (busy host)")
    try:
        fd, why = pidfds.prove(holder, vmid, scope.devices)
        assert fd is None and "reused" in why
        assert intruder.poll() is None  # the new owner of the PID lives
    finally:
        intruder.kill()
        intruder.wait()


def test_process_leaving_the_tree_is_not_signalled(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    scope = _scope(lab, vmid)
    holder = scan_host(scope).holders[pid]
    elsewhere = lab.cgroup(vmid).parent.parent / f"pveclean-test-{vmid}"
    elsewhere.mkdir()
    try:
        (elsewhere / "cgroup.procs").write_text(str(pid))
        fd, why = pidfds.prove(holder, vmid, scope.devices)
        assert fd is None and "cgroup tree" in why
        assert lab.alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 5
        while elsewhere.exists() and time.monotonic() < end:
            try:
                elsewhere.rmdir()
            except OSError:
                time.sleep(0.05)


def test_holder_that_dropped_its_gpu_is_not_signalled(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    scope = _scope(lab, vmid)
    holder = scan_host(scope).holders[pid]
    # the same process and start time, but it holds none of these devices any more
    fd, why = pidfds.prove(holder, vmid, gpu_devices([]))
    assert fd is None and "no longer holds" in why
    assert lab.alive(pid)


def test_second_run_waits_then_reports_busy(lab: Lab, vmid: int, vmid2: int) -> None:
    lab.write_config(lock_wait_seconds=0.5)
    lab.create_ct(vmid, gpus=(0,), start=False)
    lab.create_ct(vmid2, gpus=(0,), start=False)
    from pveclean.host.lock import container_lock

    with container_lock(str(lab.root / "state"), vmid, 1, "test holder"):
        t0 = time.monotonic()
        r = lab.pveclean("ct", str(vmid), "--json")
        assert r.returncode == 5
        rep = json.loads(r.stdout)
        assert rep["verdict"] == "busy" and "test holder" in rep["errors"][0]
        assert time.monotonic() - t0 >= 0.5
        other = lab.pveclean("ct", str(vmid2), "--json")  # another container: not blocked
        assert other.returncode == 0, other.stderr
    files = sorted(lab.report_dir.glob(f"{vmid}-manual-*.yaml"))
    assert yaml.safe_load(files[-1].read_text())["verdict"] == "busy"


def test_concurrent_runs_all_write_complete_reports(lab: Lab, vmid: int) -> None:
    lab.write_config(lock_wait_seconds=20)
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    procs = [subprocess.Popen([sys.executable, "-m", "pveclean", "ct", str(vmid)],
                              env=lab.env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(4)]
    codes = [p.wait(60) for p in procs]
    assert codes.count(0) == 4
    files = sorted(lab.report_dir.glob(f"{vmid}-manual-*.yaml"))
    assert len(files) == 4
    verdicts = sorted(yaml.safe_load(f.read_text())["verdict"] for f in files)
    assert verdicts == ["clean", "nothing-to-do", "nothing-to-do", "nothing-to-do"]
    assert not list(lab.report_dir.glob(".tmp-*"))


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


def test_chained_hookscript_runs_as_proxmox_would(lab: Lab, vmid: int) -> None:
    """No owner or mode check (PVE::GuestHelpers::check_hookscript has none: NFS with
    root_squash, CIFS): a chained script that worked before install --chain still works."""
    from pveclean.proxmox import chain

    lab.create_ct(vmid, gpus=(0,), start=False)
    lab.install_hook(vmid)
    other = lab.snippets / "other-hook"
    other.write_text("#!/bin/sh\necho other ran $2\n")
    other.chmod(0o777)
    cfg = Config(state_dir=str(lab.root / "state"))
    chain.write_record(cfg, vmid, "local:snippets/other-hook", str(other))
    res = lab.pct("start", str(vmid))
    assert "other ran pre-start" in res.stdout and "other ran post-start" in res.stdout


def test_report_dir_and_files_are_private_and_pruned(lab: Lab, vmid: int) -> None:
    report_dir = lab.root / "private-reports"  # made by pveclean (an existing one keeps its mode)
    lab.write_config(keep_reports=3, report_dir=str(report_dir))
    lab.create_ct(vmid, gpus=(0,), start=False)
    for _ in range(5):
        assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert report_dir.stat().st_mode & 0o777 == 0o700
    files = sorted(report_dir.glob(f"{vmid}-*.yaml"))
    assert len(files) == 3
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    old = files[0]
    os.utime(old, (time.time() - 200 * 86400,) * 2)
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert not old.exists()


def test_secrets_in_command_lines_are_redacted(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], extra_args=[
        "--hf-token=hf_abcdef123", "--api-key", "sk-secret", "HF_TOKEN=hf_xyz",
        "--db", "postgres://me:pa55w0rd@db/x"])
    r = lab.pveclean("ct", str(vmid), "--json")
    out = r.stdout
    for secret in ("hf_abcdef123", "sk-secret", "hf_xyz", "pa55w0rd"):
        assert secret not in out
    rep = json.loads(out)
    cmd = rep["holders"][0]["cmdline"]
    assert "--hf-token=***" in cmd and "--api-key ***" in cmd and "HF_TOKEN=***" in cmd
    assert "postgres://me:***@db/x" in cmd
    text = next(lab.report_dir.glob(f"{vmid}-*.yaml")).read_text()
    assert "hf_abcdef123" not in text and "pa55w0rd" not in text
