"""A VM's start with a GPU passed through, in the lab with the `qm` stand-in: every holder of
its GPU is named, a container's stopped only by policy and only for that GPU, a host
process never."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pveclean.proxmox.hookscript import stamp
from tests.harness import qm
from tests.harness.hangfs import HangFs
from tests.harness.lxclab import Lab
from tests.helpers import pveclean, reports

REPO = Path(__file__).resolve().parents[2]


def make_vm(lab: Lab, vmid: int, gpus: tuple[int, ...] = (0,)) -> int:
    """A VM passing the GPUs through, with pveclean's hookscript registered under the name
    `pveclean install --vm` gives it."""
    exe = Path(sys.executable).parent / "pveclean"
    text = stamp((REPO / "hookscripts/pveclean-hook").read_text(), str(exe),
                 str(lab.config_path))
    dest = lab.snippets / "pveclean-vm-hook"
    dest.write_text(text)
    dest.chmod(0o755)
    qm.create_vm(lab.root, vmid, gpus, "local:snippets/pveclean-vm-hook")
    return vmid


def vm_reports(lab: Lab, vmid: int) -> list[dict[str, Any]]:
    return [yaml.safe_load(f.read_text())
            for f in sorted(lab.report_dir.glob(f"{vmid}-pre-start-*.yaml"))]


def test_a_vm_start_is_refused_while_a_container_holds_its_gpu(vm_host: Lab, vmid: int,
                                                                vmid2: int) -> None:
    lab = vm_host
    lab.create_ct(vmid, gpus=(0, 1))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0", "/dev/nvidiactl"],
                      gpu_mib={0: 18000})
    (pid,) = w.host_pids(lab)
    make_vm(lab, vmid2)
    res = qm.run(lab.root, "start", str(vmid2))
    assert res.returncode != 0, res.stdout + res.stderr
    assert f"hookscript error for {vmid2} on pre-start" in res.stderr
    assert (f"refusing to start: GPU 0 ({qm.gpu_address(0)}) is held by CT {vmid}: "
            f"PID {pid} python3, 18000 MiB") in res.stdout, res.stdout
    assert f"`pveclean ct {vmid}`" in res.stdout
    assert lab.alive(pid)
    assert qm.run(lab.root, "status", str(vmid2)).stdout.strip() == "status: stopped"
    (rep,) = vm_reports(lab, vmid2)
    assert rep["kind"] == "vm" and rep["verdict"] == "refused"
    assert rep["plan"]["blockers"] and rep["plan"]["gpus"][0]["index"] == 0


def test_without_pveclean_the_start_hangs_in_the_driver(vm_host: Lab, vmid: int,
                                                        vmid2: int) -> None:
    """The stand-in's own check: what pveclean's guard is for. The driver's unbind of a GPU
    something holds does not fail, it waits (nv_pci_remove): `qm start` hangs under the VM's
    config lock, here bounded by the test's timeout. Passing only the audio function (same
    IOMMU group) hangs the same way."""
    lab = vm_host
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 1000})
    qm.create_vm(lab.root, vmid2, (0,), None)
    conf = lab.root / "etc/pve/qemu-server" / f"{vmid2}.conf"
    for host in (qm.gpu_address(0), qm.gpu_address(0)[:-1] + "1"):
        conf.write_text(f"name: vm{vmid2}\nhostpci0: {host},pcie=1\n")
        with pytest.raises(subprocess.TimeoutExpired) as hung:
            qm.run(lab.root, "start", str(vmid2), timeout=3)
        assert b"non-zero usage count" in (hung.value.stderr or b"")
        assert qm.run(lab.root, "status", str(vmid2)).stdout.strip() == "status: stopped"


def test_stop_containers_frees_only_that_gpu_and_the_vm_starts(vm_host: Lab, vmid: int,
                                                               vmid2: int) -> None:
    lab = vm_host
    lab.write_config(state_dir=str(lab.root / "state"), vm_gpu_policy="stop-containers",
                     pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"))
    lab.create_ct(vmid, gpus=(0, 1))
    on0 = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0", "/dev/nvidiactl"],
                        gpu_mib={0: 18000})
    on1 = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia1", "/dev/nvidiactl"],
                        gpu_mib={1: 9000})
    ctl = lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidiactl", "/dev/nvidia-uvm"])
    (p0,), (p1,), (pc,) = on0.host_pids(lab), on1.host_pids(lab), ctl.host_pids(lab)
    make_vm(lab, vmid2, (0,))
    res = qm.run(lab.root, "start", str(vmid2))
    assert res.returncode == 0, res.stdout + res.stderr
    assert qm.run(lab.root, "status", str(vmid2)).stdout.strip() == "status: running"
    assert not lab.alive(p0)
    assert lab.alive(p1) and lab.alive(pc)  # another GPU's holder, and no GPU's, live on
    assert "verified free" in res.stdout, res.stdout
    (ct_rep,) = reports(lab, vmid, "vm-start")
    assert [h["host_pid"] for h in ct_rep["holders"]] == [p0], [
        (h["host_pid"], h["outcome"], h["sources"], h["devices"]) for h in ct_rep["holders"]]
    assert ct_rep["verdict"] == "clean"
    (rep,) = vm_reports(lab, vmid2)
    assert rep["verdict"] == "stopped"
    assert rep["containers"][str(vmid)]["verdict"] == "clean"
    assert any(f"CT {vmid}'s config passes" in n for n in rep["plan"]["notes"])


def test_a_host_process_holding_the_gpu_refuses_in_both_policies_allowed_or_not(
        vm_host: Lab, vmid: int) -> None:
    """vm_gpu_allow_host cannot let a holder of the GPU's node stay: the driver's unbind
    waits for it (nv_pci_remove), a hang under the VM's config lock."""
    lab = vm_host
    w = lab.run_on_host("nvtop", hold=[str(lab.nodes["nvidia0"])], gpu_mib={0: 300})
    (pid,) = [p for p in w.host_pids(lab)]
    make_vm(lab, vmid, (0,))
    base = {"state_dir": str(lab.root / "state"), "pci_sysfs": str(lab.root / "sys/bus/pci"),
            "qemu_run_dir": str(lab.root / "run/qemu-server")}
    for policy in ("refuse", "stop-containers"):
        lab.write_config(**base, vm_gpu_policy=policy)
        res = lab.pveclean("vmhook", str(vmid), "pre-start")
        assert res.returncode == 75, (policy, res.stdout)
        assert f"held by a host process: PID {pid} nvtop" in res.stdout, res.stdout
        assert lab.alive(pid)
    lab.write_config(**base, vm_gpu_policy="stop-containers", vm_gpu_allow_host=["nvtop"])
    res = lab.pveclean("vmhook", str(vmid), "pre-start")
    assert res.returncode == 75, res.stdout
    assert "vm_gpu_allow_host lets pass only processes that do not hold the GPU" in res.stdout
    assert lab.alive(pid)


def test_a_gpu_another_running_vm_has_refuses_the_start(vm_host: Lab, vmid: int,
                                                        vmid2: int) -> None:
    lab = vm_host
    qm.create_vm(lab.root, vmid, (1,), None)
    assert qm.run(lab.root, "start", str(vmid)).returncode == 0
    make_vm(lab, vmid2, (1,))
    res = lab.pveclean("vmhook", str(vmid2), "pre-start")
    assert res.returncode == 75
    assert f"in use by VM {vmid} (vfio-pci): `qm stop {vmid}`" in res.stdout, res.stdout


def test_install_vm_registers_the_vm_hook_and_a_start_runs_it(vm_host: Lab, vmid: int,
                                                                vmid2: int) -> None:
    """install --all-gpu-vms takes the VMs whose hostpci names an NVIDIA GPU of this node
    (through pvesh, as on a host); the registered script guards the start; uninstall --all
    takes it off again, containers' and VMs' alike."""
    lab = vm_host
    qm.create_vm(lab.root, vmid, (0,), None)
    other = lab.root / "etc/pve/qemu-server" / f"{vmid2}.conf"
    other.write_text("name: plain\nmemory: 512\n")  # no GPU: left alone
    r = pveclean(lab, "install", "--all-gpu-vms", "--enable-snippets")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"VM {vmid}: hookscript local:snippets/pveclean-vm-hook" in r.stdout, r.stdout
    assert "hookscript" not in other.read_text()
    script = lab.snippets / "pveclean-vm-hook"
    assert script.is_file() and str(lab.config_path) in script.read_text()
    lab.create_ct(vmid2 + 1, gpus=(0,))
    lab.run_in_ct(vmid2 + 1, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 500})
    res = qm.run(lab.root, "start", str(vmid))
    assert res.returncode != 0 and f"held by CT {vmid2 + 1}" in res.stdout, res.stdout
    r = pveclean(lab, "uninstall", "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"VM {vmid}: hookscript local:snippets/pveclean-vm-hook removed" in r.stdout
    assert "hookscript" not in (lab.root / "etc/pve/qemu-server" / f"{vmid}.conf").read_text()
    assert not script.exists()


def test_install_vm_by_id_and_its_usage_errors(vm_host: Lab, vmid: int) -> None:
    lab = vm_host
    qm.create_vm(lab.root, vmid, (1,), None)
    r = pveclean(lab, "install", "--vm", str(vmid), "--systemd", "--enable-snippets")
    assert r.returncode == 2 and "--systemd is for containers" in r.stdout + r.stderr
    r = pveclean(lab, "install", "--vm", str(vmid + 1), "--enable-snippets")
    assert r.returncode == 3 and f"VM {vmid + 1} does not exist" in r.stdout + r.stderr
    r = pveclean(lab, "install", "--vm", str(vmid), "--enable-snippets", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    conf = (lab.root / "etc/pve/qemu-server" / f"{vmid}.conf").read_text()
    assert "hookscript: local:snippets/pveclean-vm-hook" in conf
    r = pveclean(lab, "uninstall", "--vm", str(vmid))
    assert r.returncode == 0 and "hookscript" not in \
        (lab.root / "etc/pve/qemu-server" / f"{vmid}.conf").read_text()


def test_gpus_and_status_show_a_gpu_a_vm_passes_and_a_container_holds(
        vm_host: Lab, vmid: int, vmid2: int) -> None:
    lab = vm_host
    lab.create_ct(vmid, gpus=(0, 1))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia1"], gpu_mib={1: 700})
    qm.create_vm(lab.root, vmid2, (1,), None)
    (lab.root / "etc/pve/qemu-server" / f"{vmid2}.conf").write_text(
        f"name: trainer\nhostpci0: {qm.gpu_address(1)[:-2]},pcie=1\n")  # the whole device
    r = lab.pveclean("gpus", "--json")
    assert r.returncode == 0, r.stderr
    import json

    (c,) = json.loads(r.stdout)["vm_conflicts"]
    assert (c["gpu"], c["vms"], c["containers"], c["next_vm_start"]) == (
        1, [{"vmid": vmid2, "name": "trainer"}], [vmid], "refuse")
    shown = lab.pveclean("gpus").stdout
    assert (f"GPU 1 ({qm.gpu_address(1)}): passed to VM {vmid2} (trainer), held by CT {vmid}; "
            "at the VM's start pveclean's VM hook would refuse") in shown, shown
    st = pveclean(lab, "status")
    assert st.returncode == 0, st.stderr
    assert f"passed to VM {vmid2} (trainer), held by CT {vmid}" in st.stdout, st.stdout


def test_a_hung_pmxcfs_never_holds_a_vm_start(vm_host: Lab, vmid: int, hangfs: HangFs
                                              ) -> None:
    """The VM's config is read in a worker: a pmxcfs that stopped answering ends the
    pre-start within the deadline with one line and exit 0 (nothing decided, nothing
    signalled: the start is not pveclean's to fail)."""
    lab = vm_host
    deadline = 2
    lab.write_config(state_dir=str(lab.root / "state"), deadline_seconds=deadline,
                     pve_config_dir=str(hangfs.mountpoint / "lxc"),
                     pci_sysfs=str(lab.root / "sys/bus/pci"))
    hangfs.hang()
    t0 = time.monotonic()
    r = lab.pveclean("vmhook", str(vmid), "pre-start")
    took = time.monotonic() - t0
    assert r.returncode == 0 and took < deadline + 2, (took, r)
    assert "reading the VM's config" in r.stdout and "nothing done" in r.stdout, r.stdout
    assert len(r.stdout.splitlines()) == 1, r.stdout


def test_a_hung_nvml_refuses_a_vm_start_in_time_and_says_why(vm_host: Lab, vmid: int
                                                            ) -> None:
    """NVML that does not answer cannot say who holds the GPU (a wedged GPU): the start is
    refused, within the deadline, naming NVML."""
    lab = vm_host
    assert lab.nvml is not None
    deadline = 3
    lab.write_config(state_dir=str(lab.root / "state"), deadline_seconds=deadline,
                     pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"))
    make_vm(lab, vmid, (0,))
    lab.nvml.hang(60)
    try:
        t0 = time.monotonic()
        r = lab.pveclean("vmhook", str(vmid), "pre-start")
        took = time.monotonic() - t0
    finally:
        lab.nvml.hang(None)
    assert r.returncode == 75 and took < deadline + 2, (took, r.stdout)
    assert "NVML does not list it" in r.stdout, r.stdout


def test_a_report_dir_on_a_hung_mount_cannot_hold_a_vm_start(vm_host: Lab, vmid: int,
                                                            vmid2: int, hangfs: HangFs) -> None:
    """The VM's report is written in a worker: a hung report dir costs at most what is left
    of the deadline, and the decision (here a refusal) stands, said in the task log."""
    lab = vm_host
    deadline = 2
    lab.write_config(state_dir=str(lab.root / "state"), deadline_seconds=deadline,
                     report_dir=str(hangfs.mountpoint / "reports"),
                     pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"))
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 100})
    make_vm(lab, vmid2, (0,))
    hangfs.hang()
    t0 = time.monotonic()
    r = lab.pveclean("vmhook", str(vmid2), "pre-start")
    took = time.monotonic() - t0
    assert r.returncode == 75 and took < deadline + 2, (took, r.stdout)
    assert "refused; WARNING: report not written" in r.stdout, r.stdout
