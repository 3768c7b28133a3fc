"""The lab itself: real containers, Proxmox layout, fake GPUs, pct stand-in, fake NVML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.lxclab import Lab, is_proxmox_host

PYNVML_DUMP = r"""
import ctypes, json, sys, pynvml
pynvml.nvmlLib = ctypes.CDLL(sys.argv[1])
pynvml.nvmlInit()
out = {}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    running = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    procs = {p.pid: p.usedGpuMemory // 2**20 for p in running}
    out[i] = {"used": mem.used // 2**20, "procs": procs}
print(json.dumps(out))
"""


def nvml_dump(lab: Lab) -> dict[str, dict[str, object]]:
    assert lab.nvml is not None
    res = subprocess.run([sys.executable, "-c", PYNVML_DUMP, str(lab.nvml.lib_path)], env={},
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def test_refuses_a_proxmox_host(tmp_path: Path) -> None:
    assert not is_proxmox_host(tmp_path)
    (tmp_path / "etc/pve").mkdir(parents=True)
    assert is_proxmox_host(tmp_path)


def test_container_has_proxmox_layout_and_holder_is_seen_from_host(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid)
    init = lab.init_pid(vmid)
    assert init is not None
    assert Path(f"/proc/{init}/cgroup").read_text().strip().endswith(f"0::/lxc/{vmid}/ns")
    assert (lab.cgroup(vmid).parent.parent / "lxc.monitor" / str(vmid)).is_dir()
    w = lab.run_in_ct(vmid, "vllm-worker", hold=["/dev/nvidia2"])
    (pid,) = w.host_pids(lab)
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "vllm-worker"
    # started through pct exec: it lives in the nested cgroup that lxc-attach uses
    assert Path(f"/proc/{pid}/cgroup").read_text().strip().endswith(f"/lxc/{vmid}/ns/.lxc")
    assert pid in lab.tree_pids(vmid)
    nspid = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                 if ln.startswith("NSpid"))
    host, ct = (int(x) for x in nspid.split()[1:])
    assert host == pid and 1 < ct < pid
    rdevs = {os.stat(f"/proc/{pid}/fd/{fd}").st_rdev for fd in os.listdir(f"/proc/{pid}/fd")}
    assert os.stat(lab.nodes["nvidia2"]).st_rdev in rdevs
    # the node inside the container is the host's node, bind-mounted: same inode
    assert os.readlink(f"/proc/{pid}/fd/3") == "/dev/nvidia2"
    assert os.stat(f"/proc/{pid}/fd/3").st_ino == os.stat(lab.nodes["nvidia2"]).st_ino


def test_dev_style_passthrough_creates_nodes_with_same_number(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), style="dev")
    conf = lab.pct("config", str(vmid)).stdout
    assert "dev0: /dev/nvidia0,gid=44" in conf
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    st = os.stat(f"/proc/{pid}/fd/3")
    host = os.stat(lab.nodes["nvidia0"])
    assert st.st_rdev == host.st_rdev and st.st_ino != host.st_ino


def test_pct_standin_formats_and_errors(lab: Lab, vmid: int) -> None:
    assert lab.pct("list").stdout == ""  # no containers: no output at all
    lab.create_ct(vmid, start=False)
    assert lab.pct("status", str(vmid)).stdout == "status: stopped\n"
    res = lab.pct("exec", str(vmid), "--", "/bin/true", check=False)
    assert res.returncode != 0 and f"container '{vmid}' not running!" in res.stderr
    lab.pct("start", str(vmid))
    assert lab.pct("status", str(vmid)).stdout == "status: running\n"
    verbose = lab.pct("status", str(vmid), "--verbose").stdout.splitlines()
    assert verbose == sorted(verbose) and "status: running" in verbose
    lines = lab.pct("list").stdout.splitlines()
    assert lines[0].split() == ["VMID", "Status", "Lock", "Name"]
    assert lines[1].split()[:2] == [str(vmid), "running"]
    conf = lab.pct("config", str(vmid)).stdout.splitlines()
    plain = [ln for ln in conf if not ln.startswith("lxc.")]
    assert plain == sorted(plain) and conf[-1].startswith("lxc.")
    res = lab.pct("exec", str(vmid), "--", "/bin/sh", "-c", "exit 7", check=False)
    assert res.returncode == 7
    missing = lab.pct("status", "999999998", check=False)
    assert missing.returncode != 0
    assert "Configuration file 'nodes/" in missing.stderr and "does not exist" in missing.stderr


def test_pct_runs_hook_phases_like_proxmox(lab: Lab, vmid: int, tmp_path: Path) -> None:
    lab.create_ct(vmid, start=False)
    log = tmp_path / "phases.log"
    script = lab.snippets / "record"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$2 path=$PATH lc=$LC_ALL home=${{HOME:-unset}} stdin=$(cat | wc -c)" >> {log}\n'
        'echo "hook says $2"\n'
        '[ "$2" = pre-start ] && [ -e ' + str(tmp_path / "refuse") + " ] && exit 3\n"
        "exit 0\n"
    )
    script.chmod(0o755)
    lab.pct("set", str(vmid), "--hookscript", "local:snippets/record")
    (tmp_path / "refuse").touch()
    res = lab.pct("start", str(vmid), check=False)
    assert res.returncode != 0
    assert f"hookscript error for {vmid} on pre-start" in res.stderr
    assert lab.pct("status", str(vmid)).stdout == "status: stopped\n"
    (tmp_path / "refuse").unlink()
    res = lab.pct("start", str(vmid))
    assert "hook says pre-start" in res.stdout and "hook says post-start" in res.stdout
    res = lab.pct("stop", str(vmid))
    assert "hook says pre-stop" in res.stdout and "post-stop" not in res.stdout
    end = time.monotonic() + 5
    while "post-stop" not in log.read_text() and time.monotonic() < end:
        time.sleep(0.02)
    phases = [ln.split()[0] for ln in log.read_text().splitlines()]
    assert phases == ["pre-start", "pre-start", "post-start", "pre-stop", "post-stop"]
    home = os.environ.get("HOME", "unset")  # inherited (PVE::Tools::run_command)
    for ln in log.read_text().splitlines()[:4]:
        assert f"path=/sbin:/bin:/usr/sbin:/usr/bin lc=C home={home} stdin=0" in ln
    # post-stop runs under lxc-start in the unit: systemd's PATH, not the CLI's
    assert "post-stop path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin lc=C" in (
        log.read_text().splitlines()[4])


def test_pct_set_waits_for_the_config_lock(lab: Lab, vmid: int) -> None:
    import fcntl

    lab.create_ct(vmid, start=False)
    lockdir = lab.root / "run/lock/lxc"
    lockdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lockdir / f"pve-config-{vmid}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        t0 = time.monotonic()
        res = lab.pct("set", str(vmid), "--delete", "hookscript", check=False)
        assert res.returncode != 0 and "got timeout" in res.stderr
        assert time.monotonic() - t0 >= 9
    finally:
        os.close(fd)


def test_fake_nvml_through_real_pynvml(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid)
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 4096, 1: 1024})
    (pid,) = w.host_pids(lab)
    dump = nvml_dump(lab)
    assert dump["0"]["procs"] == {str(pid): 4096}
    assert dump["1"]["procs"] == {str(pid): 1024}
    # v1 `used` includes the 512 MiB reserved by the driver
    assert dump["0"]["used"] == 4096 + 512 and dump["2"]["used"] == 512
    os.kill(pid, 9)
    end = time.monotonic() + 5
    while lab.alive(pid) and time.monotonic() < end:
        time.sleep(0.01)
    dump = nvml_dump(lab)
    assert dump["0"]["procs"] == {} and dump["0"]["used"] == 512


def test_holders_can_be_frozen_and_nested(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid)
    w = lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidia1"], cgroup="stuck")
    (pid,) = w.host_pids(lab)
    lab.freeze(lab.cgroup(vmid) / "ns" / "stuck")
    end = time.monotonic() + 5
    while "frozen 1" not in (lab.cgroup(vmid) / "ns/stuck/cgroup.events").read_text():
        assert time.monotonic() < end
        time.sleep(0.01)
    os.kill(pid, 15)
    time.sleep(0.2)
    assert lab.alive(pid)  # frozen: SIGTERM cannot act
    lab.freeze(lab.cgroup(vmid) / "ns" / "stuck", False)
    n = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia3"], pidns=True)
    pids = n.host_pids(lab)
    levels = [Path(f"/proc/{p}/status").read_text().split("NSpid:")[1].split("\n")[0].split()
              for p in pids]
    assert any(len(lv) == 3 and lv[-1] == "2" for lv in levels)
