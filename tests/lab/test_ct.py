"""`pveclean ct VMID` in real containers."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

from pveclean.proxmox.pct import run_pct
from pveclean.proxmox.probe import parse_probe, probe_argv
from tests.harness.lxclab import MINIMAL_APPLETS, Lab
from tests.harness.scenarios import NCCL_MIB, TP_MIB, VLLM_MIB, seeds
from tests.helpers import run_json


def holder_by_pid(rep: dict[str, Any], pid: int) -> dict[str, Any]:
    return next(h for h in rep["holders"] if h["host_pid"] == pid)


def nvml_used(lab: Lab, gpu: int) -> int:
    assert lab.nvml is not None
    import subprocess
    import sys

    code = (
        "import ctypes,sys,pynvml; pynvml.nvmlLib=ctypes.CDLL(sys.argv[1]); pynvml.nvmlInit(); "
        f"print(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex({gpu})).used"
        " // 2**20)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(lab.nvml.lib_path)], env={},
                         capture_output=True, text=True, check=True).stdout
    return int(out)


def test_seeds_situation_is_cleaned_exactly(lab: Lab, vmid: int, vmid2: int) -> None:
    s = seeds(lab, vmid, other_vmid=vmid2)
    target_pids = [p for w in s.targets() for p in w.host_pids(lab)]
    assert s.nccl is not None
    (nccl,) = s.nccl.host_pids(lab)
    worker_pids = [w.host_pids(lab)[0] for w in s.workers]
    bystanders = [p for w in s.bystanders() for p in w.host_pids(lab)]
    assert len(target_pids) == 6 and len(bystanders) == 3
    used_before = nvml_used(lab, 0)
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    assert rep["verdict"] == "clean"
    assert not [p for p in target_pids if lab.alive(p)]
    assert all(lab.alive(p) for p in bystanders)
    # what stays on GPU 0: reserved + the other container's worker + the host daemon
    assert nvml_used(lab, 0) == used_before - TP_MIB - VLLM_MIB
    assert sorted(h["host_pid"] for h in rep["holders"]) == sorted(target_pids)
    h = holder_by_pid(rep, nccl)
    assert h["outcome"] == "killed" and h["name"] == "nccl-helper"
    # the probe runs alongside, never ahead of the stop: it sees what lives long enough
    assert set(h["sources"]) == {"host", "probe", "nvml"}
    assert [sig.split()[0] for sig in h["signals"]] == ["SIGTERM", "SIGKILL"]
    assert h["gpu_memory_mib"] == {"1": NCCL_MIB}
    assert any("mmap" in d for d in h["devices"])
    for pid in worker_pids:
        h = holder_by_pid(rep, pid)
        assert h["outcome"] == "terminated" and h["signals"][0].startswith("SIGTERM")
        assert {"host", "nvml"} <= set(h["sources"])
        assert h["ct_pid"] and h["ct_pid"] != pid
        assert "vllm.worker" in h["cmdline"]  # an argument of its own
    assert rep["summary"]["freed_mib"] == 4 * TP_MIB + VLLM_MIB + NCCL_MIB
    gpu0 = rep["gpus"][0]
    assert gpu0["used_before_mib"] - gpu0["used_after_mib"] == TP_MIB + VLLM_MIB
    assert rep["sources"].pop("freeze").startswith("frozen ")  # the tree held still
    assert rep["sources"] == {"host": "ok", "probe": "ok", "nvml": "ok"}
    # the other users of GPU 0 are reported, never signalled
    other_pids = {o["host_pid"] for o in rep["other_gpu_users"]}
    assert set(bystanders) - set(s.unrelated.host_pids(lab) if s.unrelated else []) <= other_pids
    files = sorted(lab.report_dir.glob(f"{vmid}-manual-*.yaml"))
    assert len(files) == 1
    on_disk = yaml.safe_load(files[0].read_text())
    assert on_disk["verdict"] == "clean" and len(on_disk["holders"]) == 6
    assert files[0].stat().st_mode & 0o777 == 0o600


def test_human_output_has_table_and_report_path(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "vllm-worker", hold=["/dev/nvidia0"], gpu_mib={0: 1000})
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"CT {vmid} manual: stopped 1 of 1 GPU holder(s) (1000 MiB freed)")
    assert "vllm-worker" in r.stdout and "terminated" in r.stdout
    assert lines[-1].startswith(f"report: {lab.report_dir}/{vmid}-manual-")


def test_dry_run_signals_nothing(lab: Lab, vmid: int) -> None:
    s = seeds(lab, vmid, host=False)
    pids = [p for w in s.targets() for p in w.host_pids(lab)]
    code, rep = run_json(lab, str(vmid), "--dry-run")
    assert code == 0 and rep["verdict"] == "dry-run"
    assert all(lab.alive(p) for p in pids)
    assert {h["outcome"] for h in rep["holders"]} == {"would-stop"}
    assert all(h["signals"] == [] for h in rep["holders"])


def test_unkillable_holder_is_residual_within_deadline(lab: Lab, vmid: int) -> None:
    lab.write_config(grace_seconds=0.5, deadline_seconds=3)
    lab.create_ct(vmid, gpus=(0, 1))
    ok = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 100})
    stuck = lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidia1"], gpu_mib={1: 200})
    (spid,) = stuck.host_pids(lab)
    (opid,) = ok.host_pids(lab)
    freezer = lab.make_unkillable([spid])
    t0 = time.monotonic()
    code, rep = run_json(lab, str(vmid))
    elapsed = time.monotonic() - t0
    assert code == 1 and rep["verdict"] == "residual"
    assert elapsed < 3 + 2.0  # deadline plus start-up
    h = holder_by_pid(rep, spid)
    assert h["outcome"] == "survived" and h["state"] == "D (frozen)"
    assert h["wchan"]  # the kernel function it waits in
    assert [s.split()[0] for s in h["signals"]] == ["SIGTERM", "SIGKILL"]
    assert holder_by_pid(rep, opid)["outcome"] == "terminated"
    assert lab.alive(spid)
    lab.thaw(freezer)  # the pending SIGKILL lands now
    end = time.monotonic() + 5
    while lab.alive(spid) and time.monotonic() < end:
        time.sleep(0.01)
    assert not lab.alive(spid)


def test_minimal_busybox_without_ps_fuser_readlink(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), applets=MINIMAL_APPLETS)
    rootfs_bin = lab.rootfs(vmid) / "bin"
    for tool in ("ps", "fuser", "readlink", "python3"):
        assert not (rootfs_bin / tool).exists()
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    # the probe needs only sh and ls: it sees the holder by its container PID
    probe = run_pct(str(lab.pct_path), probe_argv(vmid, ["/dev/nvidia*"]), timeout=30)
    assert probe.returncode == 0, probe
    parsed = parse_probe(probe.stdout)
    assert parsed.complete and not parsed.missing, probe.stdout
    ct_pid = next(int(x) for x in Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1]
                  .splitlines()[0].split()[1:2])
    assert parsed.holders.get(ct_pid) == ["/dev/nvidia0"], parsed
    code, rep = run_json(lab, str(vmid), "--dry-run")  # a dry run starts no probe
    assert code == 0 and [h["host_pid"] for h in rep["holders"]] == [pid]
    assert rep["sources"]["probe"].startswith("not run: a dry run"), rep["sources"]
    code, rep = run_json(lab, str(vmid))
    assert code == 0 and rep["verdict"] == "clean"
    assert not lab.alive(pid)


def test_holder_in_nested_pid_namespace_is_found(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], pidns=True, gpu_mib={0: 500})
    code, rep = run_json(lab, str(vmid))
    assert code == 0 and rep["verdict"] == "clean", rep
    inner = [h for h in rep["holders"] if h["name"] == "python3"]
    assert inner, rep["holders"]
    assert all(not lab.alive(p) for p in w.host_pids(lab))


def test_mapping_only_holder_is_found(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "cuda-helper", maps=["/dev/nvidia-uvm"])
    (pid,) = w.host_pids(lab)
    assert not [fd for fd in os.listdir(f"/proc/{pid}/fd")
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/nvidia")]
    code, rep = run_json(lab, str(vmid))
    assert code == 0 and holder_by_pid(rep, pid)["devices"] == ["/dev/nvidia-uvm (mmap 1:5)"]
    assert not lab.alive(pid)


def test_nvml_absent_still_cleans_and_says_so(lab: Lab, vmid: int) -> None:
    """The holders are stopped; their GPU memory, which no NVML answered for, is not judged
    (issue 38: never `clean`)."""
    lab.write_config(nvml_library=str(lab.root / "no-such-libnvidia-ml.so.1"))
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    code, rep = run_json(lab, str(vmid))
    assert code == 6 and rep["verdict"] == "not-judged"
    assert rep["sources"]["nvml"].startswith("unavailable")
    assert any("verified by rescanning only" in w for w in rep["warnings"])
    assert rep["gpus"] == []
    assert not any(lab.alive(p) for p in w.host_pids(lab))


def test_nvml_driver_not_loaded_is_reported(lab: Lab, vmid: int) -> None:
    assert lab.nvml is not None
    lab.nvml.init_error("DRIVER_NOT_LOADED")
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    code, rep = run_json(lab, str(vmid))
    assert code == 6 and "DriverNotLoaded" in rep["sources"]["nvml"]


def test_respawning_supervisor_is_chased_and_named(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    sup = lab.run_in_ct(vmid, "vllm", hold=["/dev/nvidia0"], respawn=2,
                        extra_args=["--child-name", "vllm-worker"])
    code, rep = run_json(lab, str(vmid))
    workers = [h for h in rep["holders"]]
    assert len(workers) == 3, rep["holders"]  # the first worker and two respawns
    assert [h.get("round", 0) for h in workers] == [0, 1, 2]
    assert all("vllm" in (h.get("respawned_by") or "vllm") for h in workers)
    assert any("respawned by: vllm" in w for w in rep["warnings"])
    assert code == 0 and rep["verdict"] == "clean"
    # the supervisor holds no GPU and is not signalled
    sup_pids = [p for p in sup.host_pids(lab) if lab.alive(p)]
    assert len(sup_pids) == 1


def test_stopped_container_leftover_in_cgroup_is_cleaned(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    lab.pct("stop", str(vmid))
    cg = lab.cgroup(vmid) / "ns"
    w = lab.run_on_host("python3", hold=[str(lab.nodes["nvidia0"])], pidns=True, cgroup=cg)
    pids = w.host_pids(lab)
    code, rep = run_json(lab, str(vmid))
    assert rep["container"]["running"] is False
    assert rep["sources"]["probe"] == "container not running"
    assert code == 0 and rep["verdict"] == "clean", rep
    assert not any(lab.alive(p) for p in pids if p != (w.popen.pid if w.popen else 0))


def test_stopped_container_with_nothing_left(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    code, rep = run_json(lab, str(vmid))
    assert code == 0 and rep["verdict"] == "nothing-to-do"


def test_host_process_in_container_cgroup_is_never_signalled(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    # a host-namespace process moved into the container's cgroup: not "in the container"
    w = lab.run_on_host("python3", hold=[str(lab.nodes["nvidia0"])],
                        cgroup=lab.cgroup(vmid) / "ns" / "intruder")
    (pid,) = w.host_pids(lab)
    code, rep = run_json(lab, str(vmid))
    assert lab.alive(pid) and code == 1
    assert holder_by_pid(rep, pid)["outcome"] == "protected"
    assert "host" in holder_by_pid(rep, pid)["protected"]


def test_bad_input_one_line_and_exit_codes(lab: Lab, vmid: int, tmp_path: Path) -> None:
    r = lab.pveclean("ct", "12a")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "invalid VMID" in r.stderr
    r = lab.pveclean("ct", "99")
    assert r.returncode == 2 and "100..999999999" in r.stderr
    r = lab.pveclean("ct", "999999990")
    assert r.returncode == 3 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("grace_seconds: soon\n")
    r = lab.pveclean("ct", "129", "--config", str(bad))
    assert r.returncode == 2 and "line 1" in r.stderr and "grace_seconds" in r.stderr


def test_pct_missing_still_cleans_from_host_view(lab: Lab, vmid: int) -> None:
    lab.write_config(pct_command="/nonexistent/pct")
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    code, rep = run_json(lab, str(vmid))
    assert "pct command not found" in rep["sources"]["probe"]
    assert rep["verdict"] == "clean" and not any(lab.alive(p) for p in w.host_pids(lab))
    assert code == 0


def test_unwritable_report_dir_cleans_and_exits_4(lab: Lab, vmid: int, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    lab.write_config(report_dir=str(blocker / "reports"))
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 4
    assert not any(lab.alive(p) for p in w.host_pids(lab))
    assert "cannot create report dir" in r.stderr
    assert "verdict: clean" in r.stderr  # the report itself is not lost


def test_endless_respawn_is_residual_once_rounds_are_spent(lab: Lab, vmid: int) -> None:
    lab.write_config(chase_rounds=1)
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "vllm", hold=["/dev/nvidia0"], respawn=5,
                  extra_args=["--child-name", "vllm-worker"])
    code, rep = run_json(lab, vmid)
    assert code == 1 and rep["verdict"] == "residual"
    last = rep["holders"][-1]
    assert last["outcome"] == "survived" and "after the last of 1 rounds" in last["signals"][0]
    assert last["respawned_by"].startswith("vllm (host PID")
    assert [h["outcome"] for h in rep["holders"][:2]] == ["terminated", "terminated"]


def test_holder_in_a_systemd_service_cgroup_is_found(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], cgroup="system.slice/vllm.service")
    (pid,) = w.host_pids(lab)
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean"
    assert holder_by_pid(rep, pid)["cgroup"] == f"/lxc/{vmid}/ns/system.slice/vllm.service"
    assert rep["container"]["init_pid"] == lab.init_pid(vmid)
