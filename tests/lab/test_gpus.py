"""`pveclean gpus` on a lab host: every GPU and who uses it, attributed to its owner, and bounded
when host or container processes wedge."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pveclean.commands import gpulook
from pveclean.host import devnodes, hostscan, procscan
from tests.harness.lxclab import Lab, LabUnavailable, cgroup2_root
from tests.harness.scenarios import NCCL_MIB, OTHER_MIB, TP_MIB, VLLM_MIB, seeds
from tests.helpers import fake_host_pci

HOST_MIB = 300
LEAK_MIB = 1000
_REAL_SHARE = hostscan.w_host_share
_REAL_SCAN = procscan.w_scan
_WEDGED: set[int] = set()  # PIDs whose /proc reads hang in the tests' readers


def _wedge(pids: Any, skip: frozenset[int], stall: float | None, by_note: bool) -> None:
    from pveclean.host import worker

    for pid in pids:
        if pid in _WEDGED and pid not in skip:
            if by_note:  # as the real reads announce it (w_scan notes, w_host_share marks)
                worker.note(("pid", pid), stall)
            else:
                worker.mark(pid)
            time.sleep(60)


def _wedged_share(pids: Any, devices: Any, skip: frozenset[int], stall: float | None) -> Any:
    """w_host_share where reading a PID in _WEDGED hangs (a process wedged in the GPU driver:
    a read of its maps blocks). Module-level: a reader gets it by reference."""
    _wedge([p for p, _cg in pids], skip, stall, by_note=False)
    return _REAL_SHARE(pids, devices, skip, stall)


def _wedged_scan(scope: Any, skip: frozenset[int], stall: float | None) -> Any:
    """discover.w_scan, wedged as _wedged_share."""
    from pveclean.host import cgroupfs

    _wedge(list(cgroupfs.tree_pids(scope.cgroup_dir)), skip, stall, by_note=True)
    return _REAL_SCAN(scope, skip, stall)


def _never_answers(*_args: Any) -> Any:
    time.sleep(60)  # no note: the reader is given up on at the end, not as a stall


# ---- in real containers ------------------------------------------------------------------
@pytest.fixture
def host_slice() -> Iterator[Path]:
    """A cgroup of the host's own (outside lxc/) for a host daemon's unit; requested before
    `lab`, so it is removed after the lab has stopped what runs in it."""
    try:
        path = cgroup2_root() / f"pveclean-test-{os.getpid()}.slice"
    except LabUnavailable as exc:
        pytest.skip(str(exc))
    yield path
    for _ in range(100):
        procs = [p for d, _s, _f in os.walk(path) for p in
                 (Path(d, "cgroup.procs").read_text().split()
                  if Path(d, "cgroup.procs").exists() else [])]
        for p in procs:
            with contextlib.suppress(OSError):
                os.kill(int(p), signal.SIGKILL)
        if not procs:
            break
        time.sleep(0.05)
    for d, _s, _f in sorted(os.walk(path), key=lambda t: -len(t[0])):
        with contextlib.suppress(OSError):
            os.rmdir(d)


def gpus_json(lab: Lab, *args: str) -> dict[str, Any]:
    r = lab.pveclean("gpus", "--json", *args)
    assert r.returncode == 0, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def test_seeds_situation_at_a_glance(host_slice: Path, lab: Lab, vmid: int,
                                     vmid2: int) -> None:
    s = seeds(lab, vmid, other_vmid=vmid2, host=False)
    unit = "sglang-qwen.service"
    svc = lab.cgroup(vmid) / "ns/system.slice" / unit
    svc.mkdir(parents=True)
    workers = [w.host_pids(lab)[0] for w in s.workers]
    for pid in workers:
        (svc / "cgroup.procs").write_text(str(pid))
    daemon = lab.run_on_host("nvidia-persistenced", hold=[str(lab.nodes["nvidia0"])],
                             gpu_mib={0: HOST_MIB},
                             cgroup=host_slice / "nvidia-persistenced.service")
    (daemon_pid,) = daemon.host_pids(lab)
    # a container without GPU passthrough is not scanned; a process of it that NVML lists
    # (impossible through its devices cgroup, but NVML is the judge) is still attributed
    vmid3 = vmid2 + 1
    lab.create_ct(vmid3, gpus=())
    web = lab.run_in_ct(vmid3, "python3", hold=["/dev/null"])
    (web_pid,) = web.host_pids(lab)
    assert lab.nvml is not None
    lab.nvml.set_process(2, web_pid, 700)
    lab.nvml.leak(1, LEAK_MIB)
    pci = fake_host_pci(lab.root, lab.root / "etc/pve")
    data = gpus_json(lab, "--sysfs-pci", str(pci))

    assert vmid3 in data["scan"]["containers_skipped_no_gpu"]
    assert {vmid, vmid2} <= set(data["scan"]["containers_scanned"])
    assert data["containers"][str(vmid)]["hostname"] == f"lab{vmid}"
    g0, g1, g2, _g3 = data["gpus"]
    assert g0["pci_bus_id"] == "0000:18:00.0" and g0["uuid"].startswith("GPU-")
    mine = {p["host_pid"]: p for p in g0["processes"]}
    w0 = mine[workers[0]]
    assert (w0["owner"], w0["vmid"], w0["unit"], w0["memory_mib"]) == ("ct", vmid, unit, TP_MIB)
    assert w0["ct_pid"] and w0["ct_pid"] != workers[0]
    assert s.vllm is not None and s.other_ct is not None
    assert mine[s.vllm.host_pids(lab)[0]]["unit"] is None  # pct exec's ns/.lxc: no unit
    other = mine[s.other_ct.host_pids(lab)[0]]
    assert (other["owner"], other["vmid"], other["memory_mib"]) == ("ct", vmid2, OTHER_MIB)
    d = mine[daemon_pid]
    assert (d["owner"], d["unit"], d["name"], d["memory_mib"]) == \
        ("host", "nvidia-persistenced.service", "nvidia-persistenced", HOST_MIB)
    assert g0["by_owner_mib"][f"CT {vmid}"] == TP_MIB + VLLM_MIB
    assert g0["by_owner_mib"][f"CT {vmid2}"] == OTHER_MIB
    assert g0["by_owner_mib"]["host"] == HOST_MIB
    assert g0["leak_mib"] == 0 and g0["unaccounted_mib"] == 0
    # sorted by memory, largest first
    mibs = [p["memory_mib"] or 0 for p in g0["processes"]]
    assert mibs == sorted(mibs, reverse=True)
    assert g1["leak_mib"] == LEAK_MIB and g1["by_owner_mib"][f"CT {vmid}"] == TP_MIB + NCCL_MIB
    web_row = next(p for p in g2["processes"] if p["host_pid"] == web_pid)
    assert (web_row["owner"], web_row["vmid"], web_row["memory_mib"]) == ("ct", vmid3, 700)
    assert data["vfio"][0]["vms"] == [{"vmid": 200, "name": "trainer"}]

    text = lab.pveclean("gpus", "--sysfs-pci", str(pci)).stdout
    lines = text.splitlines()
    assert f"CT {vmid} lab{vmid}" in text and unit in text
    assert any(ln.split()[:2] == ["host", str(HOST_MIB)] and "nvidia-persistenced.service"
               in ln for ln in lines)
    assert any(ln.startswith("  LEAK: no process") and str(LEAK_MIB) in ln for ln in lines)
    assert "passed to VM 200 (trainer)" in text and "0000:43:00.0" in text
    assert f"by owner: CT {vmid} {TP_MIB + VLLM_MIB} MiB" in text


def test_watch_refreshes_and_ctrl_c_exits_0(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 100})
    r = lab.pveclean("gpus", "--watch", "0.5", "--count", "2")
    assert r.returncode == 0 and r.stdout.count("GPUs of ") == 2
    r = lab.pveclean("gpus", "--watch", "0.1")
    assert r.returncode == 2 and "0.5" in r.stderr  # bounded: at most twice a second
    exe = Path(sys.executable).parent / "pveclean"
    p = subprocess.Popen([str(exe), "gpus", "--watch", "1"], env=lab.env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    first = p.stdout.readline()
    assert first.startswith("GPUs of ")
    p.send_signal(signal.SIGINT)
    assert p.wait(10) == 0


def test_without_nvml_holders_still_show_from_device_nodes(lab: Lab, vmid: int) -> None:
    assert lab.nvml is not None
    lab.nvml.init_error("DRIVER_NOT_LOADED")
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    data = gpus_json(lab)
    assert data["gpus"] == [] and "DriverNotLoaded" in data["sources"]["nvml"]
    row = next(p for p in data["other_holders"] if p["host_pid"] == pid)
    assert (row["owner"], row["vmid"]) == ("ct", vmid)
    r = lab.pveclean("gpus")
    assert r.returncode == 0 and "warning: NVML unavailable" in r.stdout


def test_a_container_that_nests_its_cgroups_deep_cannot_break_the_view(lab: Lab,
                                                                        vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 256})
    (pid,) = w.host_pids(lab)
    deep = lab.cgroup(vmid) / "ns"
    try:
        for _ in range(1200):  # deeper than Python recurses
            deep = deep / "d"
            deep.mkdir()
        data = gpus_json(lab)  # the walk is iterative (issue 12): deep is only slower
        assert not any("RecursionError" in x for x in data["warnings"]), data["warnings"]
        row = next(p for p in data["gpus"][0]["processes"] if p["host_pid"] == pid)
        assert (row["owner"], row["vmid"], row["memory_mib"]) == ("ct", vmid, 256)
    finally:
        d = deep
        while d != lab.cgroup(vmid) / "ns":
            d.rmdir()
            d = d.parent


def _host_holders(lab: Lab) -> tuple[set[int], Path, Any]:
    a = lab.run_on_host("nvidia-persistenced", hold=[str(lab.nodes["nvidia0"])])
    b = lab.run_on_host("dcgm-exporter", hold=[str(lab.nodes["nvidiactl"])])
    devices = devnodes.gpu_devices([str(p) for p in lab.nodes.values()])
    return {*a.host_pids(lab), *b.host_pids(lab)}, Path(cgroup2_root()), devices


def test_forked_host_readers_find_what_one_reader_finds(lab: Lab) -> None:
    pids, root, devices = _host_holders(lab)
    seen = {}
    for n in (1, 3):
        found, looked_at, problems = hostscan.scan_host_processes(root, devices, set(), readers=n)
        assert problems == [] and looked_at > len(pids)
        seen[n] = {p.host_pid: sorted(map(str, p.devices)) for p in found if p.host_pid in pids}
    assert set(seen[1]) == pids
    assert seen[3] == seen[1]


def test_a_wedged_host_process_is_skipped_and_named_the_rest_shown(
        lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    pids, root, devices = _host_holders(lab)
    wedged, fine = sorted(pids)
    monkeypatch.setattr(hostscan, "w_host_share", _wedged_share)
    monkeypatch.setattr(sys.modules[__name__], "_WEDGED", {wedged})
    t0 = time.monotonic()
    found, _n, problems = hostscan.scan_host_processes(root, devices, set(), end=t0 + 8,
                                                   readers=2, stall=0.3)
    assert time.monotonic() - t0 < 4
    assert problems == [f"PID {wedged}: reading its /proc files did not finish within 0.3 s "
                        "(a file on a hung FUSE/NFS mount, or a process stuck in a driver "
                        "call); not looked at"]
    assert {p.host_pid for p in found} & pids == {fine}


def test_a_host_reader_that_never_answers_is_given_up_on_and_its_share_named(
        lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    _pids, root, devices = _host_holders(lab)
    monkeypatch.setattr(hostscan, "w_host_share", _never_answers)
    t0 = time.monotonic()
    found, looked_at, problems = hostscan.scan_host_processes(root, devices, set(),
                                                          end=t0 + 1.0, readers=2)
    assert time.monotonic() - t0 < 3
    assert found == []
    shares = [looked_at - looked_at // 2, looked_at // 2]  # every second process each
    assert problems == [
        "reading the host's processes: did not finish in time (it was starting)",
        f"{shares[0]} of the host's processes were not looked at; their holders are shown "
        "only as NVML lists them",
        "reading the host's processes: did not finish in time (it was starting)",
        f"{shares[1]} of the host's processes were not looked at; their holders are shown "
        "only as NVML lists them"]


def test_a_wedged_container_process_costs_the_view_only_that_process(
        lab: Lab, vmid: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from pveclean.host.configfile import load

    lab.write_config(deadline_seconds=5)
    lab.create_ct(vmid, gpus=(0,))
    a = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    b = lab.run_in_ct(vmid, "vllm-worker", hold=["/dev/nvidia0"])
    (wedged,), (fine,) = a.host_pids(lab), b.host_pids(lab)
    monkeypatch.setattr(gpulook, "w_scan", _wedged_scan)
    monkeypatch.setattr(sys.modules[__name__], "_WEDGED", {wedged})
    cfg = load(lab.env()["PVECLEAN_CONFIG"])
    t0 = time.monotonic()
    data = gpulook.collect(cfg, None, end=t0 + 4).as_dict()
    assert time.monotonic() - t0 < 4
    seen = {p["host_pid"] for p in data["other_holders"] if p.get("vmid") == vmid}
    assert fine in seen and wedged not in seen, data["other_holders"]
    assert any(w.startswith(f"PID {wedged}: reading its /proc files did not finish")
               for w in data["warnings"]), data["warnings"]


def test_a_hung_nvml_leaves_the_process_view(lab: Lab, vmid: int) -> None:
    """A wedged GPU's NVML that never answers: the holders are shown from their device
    nodes, NVML's part is said to be missing, within the deadline."""
    assert lab.nvml is not None
    lab.write_config(deadline_seconds=4)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 100})
    (pid,) = w.host_pids(lab)
    lab.nvml.hang(60)
    t0 = time.monotonic()
    data = gpus_json(lab)
    assert time.monotonic() - t0 < 4 + 1
    assert data["gpus"] == [] and "did not answer" in data["sources"]["nvml"], data["sources"]
    row = next(p for p in data["other_holders"] if p["host_pid"] == pid)
    assert (row["owner"], row["vmid"]) == ("ct", vmid)


def test_an_io_uring_holder_of_a_gpu_node_holds_that_gpu(lab: Lab, vmid: int) -> None:
    """A GPU node registered with io_uring as a fixed file (its fd closed) ties its holder to
    that GPU by the device number the scan found. Its label ("... (io_uring fixed file,
    195:0)") once matched no pattern of the map's: the holder was no GPU's, and a VM's start
    with that GPU went on."""
    from tests.helpers import start_in_ct

    assert lab.nvml is not None
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "uring_holder", ["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    data = gpus_json(lab)
    g0 = next(g for g in data["gpus"] if g["minor"] == 0)
    (p,) = [p for p in g0["processes"] if p["host_pid"] == pid]
    assert (p["owner"], p["vmid"]) == ("ct", vmid)
    assert any("io_uring fixed file" in d for d in p["devices"]), p
    assert pid not in [o["host_pid"] for o in data["other_holders"]]
