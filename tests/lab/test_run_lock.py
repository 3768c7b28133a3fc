"""The container lock on lab containers: a second run waits then says busy, concurrent runs
each write a whole report, and dry runs and status take no lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.harness.lxclab import Lab
from tests.helpers import ct_json


def test_dry_run_stuck_mid_run_never_blocks_a_cleanup(lab: Lab, vmid: int) -> None:
    """A dry run caught in the middle of its run (it has started its probe, so it is past
    where a lock would be taken) and held there: a cleanup meanwhile neither waits for it nor
    reports busy."""
    lab.write_config(grace_seconds=0.5, deadline_seconds=20)
    lab.create_ct(vmid, gpus=(0, 1))
    a = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 500})
    b = lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidia1"], ignore_term=True)
    pids = a.host_pids(lab) + b.host_pids(lab)
    lab.freeze(lab.cgroup(vmid) / "ns")  # the container's shell hangs: pct exec never returns
    dry = subprocess.Popen([str(Path(sys.executable).parent / "pveclean"), "ct", str(vmid),
                            "--dry-run", "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=lab.env(), text=True)
    children = Path(f"/proc/{dry.pid}/task/{dry.pid}/children")
    try:
        end = time.monotonic() + 20
        while not children.read_text().split() and time.monotonic() < end:
            time.sleep(0.005)  # until it has forked its probe (or its reader)
        os.kill(dry.pid, signal.SIGSTOP)  # held mid-run
        lab.freeze(lab.cgroup(vmid) / "ns", False)
        code, rep, took = ct_json(lab, str(vmid))
        assert dry.poll() is None, "the dry run was expected to be held mid-run"
    finally:
        lab.freeze(lab.cgroup(vmid) / "ns", False)
        os.kill(dry.pid, signal.SIGCONT)
        out, _err = dry.communicate(timeout=30)
    assert rep["verdict"] == "clean", rep["errors"]
    assert code == 0 and not any(lab.alive(p) for p in pids)
    assert took < 0.5 + 5  # it never waited for the dry run's lock: there is none
    assert json.loads(out)["verdict"] == "dry-run"


def test_status_and_dry_runs_take_no_lock(lab: Lab, vmid: int) -> None:
    from pveclean.host.lock import container_lock

    lab.write_config(lock_wait_seconds=0.2)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    with container_lock(str(lab.root / "state"), vmid, 1, "a cleanup"):
        code, rep, _took = ct_json(lab, str(vmid), "--dry-run")  # reads while a cleanup runs
    assert code == 0 and rep["verdict"] == "dry-run"
    assert [h["host_pid"] for h in rep["holders"]] == w.host_pids(lab)


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
