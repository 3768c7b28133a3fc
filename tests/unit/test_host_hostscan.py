"""host/hostscan (gpus' view of the host's own processes) on a fake cgroup tree and a fake
/proc under tmp_path, read in process and by real forked readers; which host PIDs are shown."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pveclean.core.discovery import stall_problem
from pveclean.core.gpumap import full_name
from pveclean.core.records import GpuDevices
from pveclean.host import hostscan
from tests.helpers import DEVICES, NULL

NODE = f"/dev/null ({os.major(NULL)}:{os.minor(NULL)})"


def cgroups(root: Path, tree: dict[str, str]) -> Path:
    for rel, procs in tree.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        (root / rel / "cgroup.procs").write_text(procs)
    return root


def process(proc: Path, pid: int, comm: str = "dcgm-exporter", cmdline: bytes = b"",
            node: bool = True, maps: str = "", state: str = "S") -> Path:
    """A host process, holding /dev/null (the "GPU node") on fd 3 if `node`."""
    d = proc / str(pid)
    for sub in ("fd", "fdinfo", "ns"):
        (d / sub).mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) {state} 1 " + " ".join(["0"] * 17) + " 5 0 0\n")
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t0\t0\t0\t0\nNSpid:\t{pid}\n")
    (d / "cmdline").write_bytes(cmdline)
    (d / "maps").write_text(maps)
    (d / "mountinfo").write_text("25 1 0:5 / /dev rw - devtmpfs udev rw\n")
    os.symlink("mnt:[4026531840]", d / "ns" / "mnt")
    os.symlink("pipe:[77]", d / "fd" / "0")
    if node:
        os.symlink("/dev/null", d / "fd" / "3")
        (d / "fdinfo" / "3").write_text("pos:\t0\nflags:\t02\nmnt_id:\t25\n")
    return d


def test_host_pids_leave_out_the_containers_and_keep_plain_lxc(tmp_path: Path) -> None:
    root = cgroups(tmp_path, {"": "1\n", "init.scope": "2\n", "system.slice/a.service": "3\n",
                              "lxc": "4\n", "lxc/129/ns": "500\n", "lxc/plain/sub": "31\n",
                              "lxc.monitor/129": "40\n"})
    assert hostscan.host_pids(root) == {1: "/", 2: "/init.scope",
                                        3: "/system.slice/a.service", 4: "/lxc",
                                        31: "/lxc/plain/sub", 40: "/lxc.monitor/129"}


def test_host_pids_without_lxc_or_root_are_what_can_be_read(tmp_path: Path) -> None:
    cgroups(tmp_path, {"": "1\n", "user.slice": "9\n"})
    assert hostscan.host_pids(tmp_path) == {1: "/", 9: "/user.slice"}
    assert hostscan.host_pids(tmp_path / "gone") == {}


def test_a_share_names_its_holders_and_passes_over_the_rest(proc: Path) -> None:
    process(proc, 30, comm="nvidia-persiste", cmdline=b"/usr/bin/nvidia-persistenced\0--v\0")
    process(proc, 31, node=False)
    process(proc, 32, state="Z")  # a zombie holds nothing
    process(proc, 33, node=False, comm="python3",
            maps="7f0-7f1 rw-s 00000000 00:05 6 /dev/nvidia0\n")
    (proc / "33" / "map_files").mkdir()
    os.symlink("/dev/null", proc / "33" / "map_files" / "7f0-7f1")
    os.symlink("/gone/file", proc / "31" / "fd" / "7")  # its stat fails: not judged
    process(proc, 35, node=False)
    found, unjudged, clean = hostscan.w_host_share(
        [(30, "/system.slice/nvidia-persistenced.service"), (31, "/"), (32, "/"),
         (33, "/user.slice"), (34, "/"), (35, "/")], DEVICES, frozenset(), None)
    assert unjudged == ["host PID 31: fd 7 (/gone/file): statx failed (No such file or "
                        "directory); not judged"]
    assert [(p.host_pid, p.name, p.unit, list(map(str, p.devices))) for p in found] == [
        (30, "nvidia-persistenced", "nvidia-persistenced.service", [NODE]),
        (33, "python3", None, [f"/dev/nvidia0 (mmap {NODE.split(' (')[1]}"])]
    assert all(p.owner.kind == "host" and p.rdevs == {NULL} for p in found)
    assert clean == [35]  # 31 not judged whole, 32 a zombie, 34 gone: not known clean


def test_forked_readers_share_the_host_and_skip_a_wedged_process(proc: Path, tmp_path: Path
                                                                 ) -> None:
    pids = list(range(40, 50))
    for pid in pids:
        process(proc, pid)
    (proc / "44" / "maps").unlink()
    os.mkfifo(proc / "44" / "maps")  # nobody writes: reading it hangs
    root = cgroups(tmp_path / "cg", {"": "".join(f"{p}\n" for p in pids), "lxc": ""})
    devices = GpuDevices({NULL: "/dev/nvidia0"}, frozenset())
    t0 = time.monotonic()
    found, looked_at, problems = hostscan.scan_host_processes(
        root, devices, {49}, end=t0 + 10, readers=3, stall=0.3)
    assert time.monotonic() - t0 < 5
    assert looked_at == 9
    assert problems == [stall_problem(44, 0.3, "not looked at")]
    assert sorted(p.host_pid for p in found) == [40, 41, 42, 43, 45, 46, 47, 48]


def test_a_reader_given_up_on_names_its_share(proc: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for pid in (60, 61, 62):
        process(proc, pid)
    os.unlink(proc / "61" / "maps")
    os.mkfifo(proc / "61" / "maps")
    root = cgroups(tmp_path / "cg", {"": "60\n61\n62\n"})
    t0 = time.monotonic()
    found, looked_at, problems = hostscan.scan_host_processes(
        root, DEVICES, set(), end=t0 + 0.6, readers=1, stall=5.0)  # the end comes first
    assert time.monotonic() - t0 < 0.6 + 1.5
    assert (found, looked_at) == ([], 3)
    assert problems == [
        "reading the host's processes: did not finish in time (it was reading /proc/61)",
        "3 of the host's processes were not looked at; their holders are shown only as NVML "
        "lists them"]


@pytest.mark.parametrize(("comm", "cmdline", "name"), [
    ("nvidia-persiste", "/usr/bin/nvidia-persistenced --verbose", "nvidia-persistenced"),
    ("nvidia-persiste", "/usr/bin/other", "nvidia-persiste"),
    ("python3", "/usr/bin/python3.11 -m vllm", "python3"),
    ("dcgm-exporter12", "", "dcgm-exporter12"),
])
def test_full_name_continues_a_cut_comm_from_argv0(comm: str, cmdline: str, name: str) -> None:
    assert full_name(comm, tuple(cmdline.split())) == name


def test_host_pids_leave_out_only_proxmox_containers(tmp_path: Path) -> None:
    for rel, procs in {"": "1\n2\n", "system.slice/a.service": "10\n", "lxc": "",
                       "lxc/129/ns/system.slice/x.service": "20\n", "lxc/plain": "30\n",
                       "lxc.monitor/129": "40\n"}.items():
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
        (tmp_path / rel / "cgroup.procs").write_text(procs)
    assert hostscan.host_pids(tmp_path) == {1: "/", 2: "/", 10: "/system.slice/a.service",
                                        30: "/lxc/plain", 40: "/lxc.monitor/129"}


def test_a_host_of_a_hundred_processes_is_read_by_a_reader_per_core(proc: Path, tmp_path: Path
                                                                     ) -> None:
    """A forked reader costs 1-2 ms; a real host process 0.2-2 ms to read (fds, maps): a
    share of 50 pays for its reader, so ~100 processes are split between two cores."""
    proc.mkdir()
    pids = list(range(1000, 1120))  # gone (no /proc entries): each read is short
    root = cgroups(tmp_path / "cg", {"": "".join(f"{p}\n" for p in pids), "lxc": ""})
    with hostscan.HostScan(root, DEVICES, set(), stall=5.0) as scan:
        assert len(scan.shares) == min(os.cpu_count() or 1, hostscan.MAX_READERS, 2)
        assert sorted(p for share in scan.shares for p, _cg in share) == pids
        assert scan.result()[1] == len(pids)
