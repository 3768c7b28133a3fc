"""Discovery against what a container's root can do, on lab containers: holders whose main thread
exited, GPU nodes bind-mounted elsewhere, mounts that may ask a server never stated, cgroups 1,100
deep, and names the container chose that protect nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from pveclean.cleanup import RunOptions, clean
from pveclean.host import cgroupfs, devnodes, procfs, statx
from pveclean.host.configfile import load
from pveclean.host.prelude import NvmlWorker
from tests.harness.lxclab import Lab, Workload
from tests.helpers import run_json, start_in_ct, wait_for


def host_pid_of_ready(lab: Lab, w: Workload) -> int:
    """The host PID of a holder by its ready line (its PID inside the container): a zombie
    leader's cmdline is empty, so Workload.host_pids cannot see it."""
    ct_pid = int(w.ready_file.read_text().split()[0])
    for pid in lab.tree_pids(w.vmid or 0):
        st = procfs.read_status(pid)
        if st and len(st.nspid) >= 2 and st.nspid[1] == ct_pid:
            return pid
    raise AssertionError(f"no host PID for container PID {ct_pid}")


def state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rfind(")") + 2]


# ---- no hiding ----------------------------------------------------------------------------

def test_holder_whose_main_thread_exited_is_found_and_stopped(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/dev/nvidia0", "--thread-holds"])
    pid = host_pid_of_ready(lab, w)
    assert state(pid) == "Z" and not os.listdir(f"/proc/{pid}/fd")  # the hiding place
    assert lab.nvml is not None
    lab.nvml.set_process(0, pid, 4000)
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    assert rep["verdict"] == "clean"
    (h,) = rep["holders"]
    assert h["host_pid"] == pid and "host" in h["sources"] and "nvml" in h["sources"]
    assert h["gpu_memory_mib"] == {0: 4000} or h["gpu_memory_mib"] == {"0": 4000}
    # its parent, frozen while the run looked, reaps it once the container is thawed
    assert not lab.alive(pid) and wait_for(lambda: not Path(f"/proc/{pid}").exists(), 2)


def test_gpu_node_bind_mounted_at_another_path_is_found(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/opt/g"],
                    pre="touch /opt/g && mount --bind /dev/nvidia0 /opt/g && ")
    (pid,) = w.host_pids(lab)
    assert os.readlink(f"/proc/{pid}/fd/3") == "/opt/g"
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    (h,) = rep["holders"]
    assert h["host_pid"] == pid and "host" in h["sources"]
    assert h["devices"][0].startswith("/opt/g (")
    assert not lab.alive(pid)


def test_files_on_mounts_that_may_ask_a_server_are_never_stated(lab: Lab, vmid: int) -> None:
    """A mount whose file system may ask a server even under AT_STATX_DONT_SYNC (9p, gfs2,
    an unknown type: the mount IDs and devices read_risky finds in mountinfo) is never
    stat()ed; FUSE, NFS, CIFS and ceph are, with DONT_SYNC (see test_hang_bounds.py)."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/opt/g"],
                    pre="touch /opt/g && mount --bind /dev/nvidia0 /opt/g && ")
    (pid,) = w.host_pids(lab)
    devices = devnodes.gpu_devices([str(lab.root / "dev/nvidia*")])
    assert devnodes.device_fds(pid, devices)
    every = mounts_of(pid)
    real, real_statx = devnodes.read_risky, statx.statx
    stated: list[str] = []

    def spy(path: Any, *a: Any, **kw: Any) -> Any:
        stated.append(str(path))
        return real_statx(path, *a, **kw)

    try:  # the same fd, as if every mount of the process were 9p: no stat, no match
        devnodes.read_risky = lambda base: devnodes.Risky(  # type: ignore[assignment]
            frozenset(every), frozenset(every.values()))
        statx.statx = spy  # type: ignore[assignment]
        assert devnodes.device_fds(pid, devices) == []
        assert devnodes.device_maps(pid, devices) == []
        assert stated == []
    finally:
        devnodes.read_risky, statx.statx = real, real_statx  # type: ignore[assignment]


def mounts_of(pid: int) -> dict[int, tuple[int, int]]:
    """Mount ID -> (major, minor) of every mount the process sees."""
    out = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_bytes().split(b"\n"):
        if line:
            f = line.split(b" ")
            major, minor = f[2].split(b":")
            out[int(f[0])] = (int(major), int(minor))
    return out


def _deep_cgroup(lab: Lab, vmid: int, depth: int) -> Path:
    d = lab.cgroup(vmid) / "ns"
    for _ in range(depth):
        d = d / "d"
        os.mkdir(d)  # no Path.mkdir(parents=True): it recurses
    return d


def _remove_deep(top: Path) -> None:
    """rmdir the chain deepest first (the lab's tear-down walks recursively: it must not
    meet it); a just-killed process keeps its cgroup busy until it is reaped."""
    dirs = []
    d = top
    while d.is_dir():
        dirs.append(d)
        d = d / "d"
    for d in reversed(dirs):
        end = time.monotonic() + 10
        while True:
            try:
                os.rmdir(d)
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.05)


def test_holder_1100_cgroups_deep_is_found_and_stopped(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    leaf = _deep_cgroup(lab, vmid, 1100)
    try:
        (leaf / "cgroup.procs").write_text(str(pid))
        code, rep = run_json(lab, vmid)
        assert code == 0, rep
        assert rep["verdict"] == "clean"
        assert [h["host_pid"] for h in rep["holders"]] == [pid]
        assert not lab.alive(pid)
    finally:
        if lab.alive(pid):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        _remove_deep(lab.cgroup(vmid) / "ns" / "d")


def test_cgroup_walk_past_its_cap_is_residual_with_the_reason(
        lab: Lab, vmid: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    leaf = _deep_cgroup(lab, vmid, 60)
    try:
        (leaf / "cgroup.procs").write_text(str(pid))
        monkeypatch.setattr(cgroupfs, "MAX_CGROUPS", 40)
        cfg = load(lab.config_path)
        with NvmlWorker() as nvml:
            res = clean(vmid, cfg, nvml.warm(cfg, vmid), RunOptions(write_report=True))
        assert res.verdict == "residual"
        (h,) = res.report.as_dict()["holders"]
        assert "more than 40 cgroups" in h["protected"]
        assert lab.alive(pid)  # not seen, so not signalled: and the verdict says so
        assert res.path is not None and res.path.exists()
    finally:
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        _remove_deep(lab.cgroup(vmid) / "ns" / "d")


def test_a_name_the_container_chose_protects_nothing(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "nvidia-persistenced", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "nvidia-persiste"
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    (h,) = rep["holders"]
    assert "protected" not in h and h["outcome"] in ("terminated", "killed")
    assert not lab.alive(pid)


def test_host_process_keeps_its_protected_name(lab: Lab, vmid: int) -> None:
    """A host-namespace process in the tree is never signalled, and the report says which
    protected name it carries (names of host processes are the admin's)."""
    lab.create_ct(vmid, gpus=(0,))
    cg = lab.cgroup(vmid) / "ns" / "hostside"
    w = lab.run_on_host("nvidia-smi", hold=[str(lab.nodes["nvidia0"])], cgroup=cg)
    assert w.popen is not None
    pid = w.popen.pid  # (host_pids matches "ready-host-N" of other labs on this host too)
    _code, rep = run_json(lab, vmid)
    h = next(h for h in rep["holders"] if h["host_pid"] == pid)
    assert h["protected"] == "in the host's PID namespace, protected name 'nvidia-smi'"
    assert lab.alive(pid)
