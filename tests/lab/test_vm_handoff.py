"""The GPU hand-off to a VM as NVIDIA's driver does it: nvidia-persistenced (the lab's
stand-in, tests/harness/persistenced.py) holds every GPU's node, so without pveclean a VM's
start hangs in the driver's unbind; with it, persistence goes off for the VM's GPU alone, the
start goes on, and post-stop turns it back on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import persistenced, qm
from tests.harness.lxclab import Lab
from tests.lab.test_vm_guard import make_vm


@pytest.fixture
def daemon(vm_host: Lab) -> Iterator[int]:
    """nvidia-persistenced's stand-in holding GPU 0 and 1 (persistence on for both): its
    PID."""
    lab = vm_host
    assert lab.nvml is not None
    for gpu in (0, 1):
        lab.nvml.set_persistence(gpu, True)
    link = lab.root / "hostbin" / "nvidia-persistenced"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(os.path.realpath(sys.executable))
    ready = lab.root / "persistenced.ready"
    proc = subprocess.Popen([str(link), persistenced.__file__, str(lab.nvml.state_path),
                             str(ready), str(lab.nodes["nvidia0"]), str(lab.nodes["nvidia1"])],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(200):
            if ready.exists():
                break
            time.sleep(0.05)
        assert ready.exists(), "the persistenced stand-in did not start"
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def holds(pid: int, node: Path) -> bool:
    rdev = node.stat().st_rdev
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}/fd/{fd}").st_rdev == rdev:
                return True
    return False


def test_without_pveclean_persistenced_hangs_the_start(vm_host: Lab, daemon: int,
                                                        vmid: int) -> None:
    lab = vm_host
    qm.create_vm(lab.root, vmid, (0,), None)
    with pytest.raises(subprocess.TimeoutExpired):
        qm.run(lab.root, "start", str(vmid), timeout=3)
    assert holds(daemon, lab.nodes["nvidia0"])


def test_persistence_goes_off_for_the_vms_gpu_alone_and_back_at_post_stop(
        vm_host: Lab, daemon: int, vmid: int) -> None:
    lab = vm_host
    assert lab.nvml is not None
    make_vm(lab, vmid, (0,))
    res = qm.run(lab.root, "start", str(vmid), timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "persistence mode is turned off for this GPU alone" in res.stdout, res.stdout
    assert "verified free" in res.stdout
    assert not lab.nvml.persistence_of(0) and lab.nvml.persistence_of(1)
    assert not holds(daemon, lab.nodes["nvidia0"]) and holds(daemon, lab.nodes["nvidia1"])
    assert (lab.root / "state" / f"persistence-{vmid}.yaml").is_file()
    res = qm.run(lab.root, "stop", str(vmid), timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert lab.nvml.persistence_of(0)
    for _ in range(40):
        if holds(daemon, lab.nodes["nvidia0"]):
            break
        time.sleep(0.05)
    assert holds(daemon, lab.nodes["nvidia0"])
    assert not (lab.root / "state" / f"persistence-{vmid}.yaml").exists()


def test_an_allowed_host_holder_of_the_gpu_still_refuses(vm_host: Lab, vmid: int) -> None:
    """vm_gpu_allow_host may not let a holder of the node stay: the start would hang."""
    lab = vm_host
    w = lab.run_on_host("nv-hostengine", hold=[str(lab.nodes["nvidia0"])])
    (pid,) = w.host_pids(lab)
    lab.write_config(state_dir=str(lab.root / "state"), pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"),
                     vm_gpu_allow_host=["nv-hostengine"])
    make_vm(lab, vmid, (0,))
    res = qm.run(lab.root, "start", str(vmid), timeout=60)
    assert res.returncode != 0 and "the start would hang" in res.stdout, res.stdout
    assert lab.alive(pid)


def test_the_vms_chained_hookscript_runs_in_every_phase(vm_host: Lab, vmid: int,
                                                        vmid2: int) -> None:
    """install --vm --chain keeps the VM's own hookscript: it runs in every phase, and one
    failing pre-start refuses the start before pveclean stops anything for it."""
    from pveclean.core.config import Config
    from pveclean.proxmox import chain

    lab = vm_host
    other = lab.snippets / "site-hook"
    other.write_text("#!/bin/sh\necho site ran $2\n[ \"$2\" != pre-start ] || exit ${FAIL:-0}\n")
    other.chmod(0o755)
    make_vm(lab, vmid, (0,))
    chain.write_record(Config(state_dir=str(lab.root / "state")), vmid,
                       "local:snippets/site-hook", str(other))
    res = qm.run(lab.root, "start", str(vmid), timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "site ran pre-start" in res.stdout and "site ran post-start" in res.stdout
    res = qm.run(lab.root, "stop", str(vmid), timeout=60)
    assert "site ran pre-stop" in res.stdout, res.stdout
    other.write_text("#!/bin/sh\necho site ran $2\n[ \"$2\" != pre-start ] || exit 3\n")
    lab.create_ct(vmid2, gpus=(0,))
    w = lab.run_in_ct(vmid2, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 500})
    lab.write_config(state_dir=str(lab.root / "state"), pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"),
                     vm_gpu_policy="stop-containers")
    res = qm.run(lab.root, "start", str(vmid), timeout=60)
    assert res.returncode != 0, res.stdout
    assert f"VM {vmid} pre-start: chained hookscript local:snippets/site-hook exited 3" \
        in res.stdout and "refusing to start: the chained hookscript failed" in res.stdout
    assert all(lab.alive(p) for p in w.host_pids(lab))  # nothing stopped for it


def test_a_backups_start_follows_vm_gpu_backup(vm_host: Lab, vmid: int, vmid2: int) -> None:
    """vzdump of a stopped VM starts it paused (enforce_vm_running_for_backup): the hook knows
    it by its task and applies vm_gpu_backup, not vm_gpu_policy."""
    lab = vm_host
    base = {"state_dir": str(lab.root / "state"), "pci_sysfs": str(lab.root / "sys/bus/pci"),
            "qemu_run_dir": str(lab.root / "run/qemu-server")}
    lab.create_ct(vmid2, gpus=(0,))
    w = lab.run_in_ct(vmid2, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 500})
    make_vm(lab, vmid, (0,))
    lab.write_config(**base, vm_gpu_policy="stop-containers")  # vm_gpu_backup: refuse
    res = qm.run(lab.root, "vzdump", str(vmid), timeout=60)
    assert res.returncode != 0, res.stdout
    assert "a backup's start (vzdump): vm_gpu_backup refuse applies" in res.stdout
    assert f"held by CT {vmid2}" in res.stdout and all(lab.alive(p) for p in w.host_pids(lab))
    lab.write_config(**base, vm_gpu_backup="stop-containers")
    res = qm.run(lab.root, "vzdump", str(vmid), timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"stopping CT {vmid2}'s holders of GPU 0" in res.stdout


def _mapping(lab: Lab, *gpus: int) -> None:
    node = os.uname().nodename.split(".", 1)[0]
    path = lab.root / "etc/pve/mapping/pci.cfg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("pool\n" + "".join(
        f"\tmap id=10de:2330,node={node},path={qm.gpu_address(g)[:-2]}\n" for g in gpus))


def test_a_mapping_is_a_pool_and_only_the_chosen_gpu_is_guarded(vm_host: Lab, vmid: int,
                                                                 vmid2: int) -> None:
    """choose_hostpci_devices takes the first free alternative: another VM on GPU 0 moves the
    start to GPU 1 (not a refusal), and a container computing on the alternative the VM will
    not get is left alone."""
    lab = vm_host
    _mapping(lab, 0, 1)
    lab.create_ct(vmid2 + 1, gpus=(1,))
    w = lab.run_in_ct(vmid2 + 1, "python3", hold=["/dev/nvidia1"], gpu_mib={1: 500})
    make_vm(lab, vmid2, (0,))
    conf = lab.root / "etc/pve/qemu-server" / f"{vmid2}.conf"
    conf.write_text(conf.read_text().replace(f"hostpci0: {qm.gpu_address(0)},pcie=1",
                                             "hostpci0: mapping=pool,pcie=1"))
    lab.write_config(state_dir=str(lab.root / "state"), pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"),
                     vm_gpu_policy="stop-containers")
    res = qm.run(lab.root, "start", str(vmid2), timeout=60)  # takes GPU 0: CT's GPU 1 free
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"checking who holds {qm.gpu_address(0)}" in res.stdout, res.stdout
    assert "stopping CT" not in res.stdout and all(lab.alive(p) for p in w.host_pids(lab))
    assert qm.run(lab.root, "stop", str(vmid2), timeout=60).returncode == 0
    qm.create_vm(lab.root, vmid, (0,), None)
    assert qm.run(lab.root, "start", str(vmid), timeout=60).returncode == 0  # VM on GPU 0
    lab.write_config(state_dir=str(lab.root / "state"), pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"))  # refuse
    res = qm.run(lab.root, "start", str(vmid2), timeout=60)  # GPU 1, held by the CT
    assert res.returncode != 0, res.stdout
    assert f"{qm.gpu_address(0)} is reserved by VM {vmid} (running)" in res.stdout, res.stdout
    assert f"GPU 1 ({qm.gpu_address(1)}) is held by CT {vmid2 + 1}" in res.stdout
    assert "in use by VM" not in res.stdout


def test_install_reads_a_pending_hostpci_the_next_start_applies(vm_host: Lab, vmid: int,
                                                                vmid2: int) -> None:
    """vm_start_nolock applies pending changes before pre-start: a GPU added as pending is
    guarded at the next start, so install --all-gpu-vms selects that VM; a driver=keep VM is
    no passthrough that unbinds and is left alone."""
    from tests.helpers import pveclean

    lab = vm_host
    d = lab.root / "etc/pve/qemu-server"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{vmid}.conf").write_text(f"name: pend\nmemory: 512\n\n[pve:pending]\n"
                                    f"hostpci0: {qm.gpu_address(0)},pcie=1\n")
    (d / f"{vmid2}.conf").write_text(f"name: keep\nhostpci0: {qm.gpu_address(1)},driver=keep\n")
    r = pveclean(lab, "install", "--all-gpu-vms", "--enable-snippets")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"VM {vmid}: hookscript local:snippets/pveclean-vm-hook" in r.stdout, r.stdout
    assert "hookscript" not in (d / f"{vmid2}.conf").read_text()


def test_a_migrations_target_start_is_guarded_from_the_source_nodes_config(
        vm_host: Lab, vmid: int, vmid2: int) -> None:
    """On the target, pre-start runs while the config is still in the source node's
    directory (PVE_MIGRATED_FROM): pveclean reads it there instead of checking nothing."""
    lab = vm_host
    lab.create_ct(vmid2, gpus=(0,))
    w = lab.run_in_ct(vmid2, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 500})
    make_vm(lab, vmid, (0,))
    here = lab.root / "etc/pve/qemu-server" / f"{vmid}.conf"
    src = lab.root / "etc/pve/nodes/pve2/qemu-server"
    src.mkdir(parents=True)
    here.rename(src / f"{vmid}.conf")
    res = qm.run(lab.root, "start", str(vmid), "--migratedfrom", "pve2", timeout=60)
    assert res.returncode != 0, res.stdout + res.stderr
    assert f"held by CT {vmid2}" in res.stdout, res.stdout
    assert all(lab.alive(p) for p in w.host_pids(lab))


def test_a_late_post_stop_leaves_persistence_off_for_a_gpu_another_vm_took(
        vm_host: Lab, daemon: int, vmid: int, vmid2: int) -> None:
    """post-stop from a late `qm cleanup`: VM B already started with the GPU; turning
    persistence back on would have the daemon open B's GPU. It stays off, recorded."""
    lab = vm_host
    assert lab.nvml is not None
    make_vm(lab, vmid, (0,))
    assert qm.run(lab.root, "start", str(vmid), timeout=60).returncode == 0
    assert not lab.nvml.persistence_of(0)
    assert qm.run(lab.root, "stop-late", str(vmid), timeout=60).returncode == 0
    qm.create_vm(lab.root, vmid2, (0,), None)
    res = qm.run(lab.root, "start", str(vmid2), timeout=60)
    assert res.returncode == 0, res.stderr
    qm.run(lab.root, "cleanup", str(vmid), timeout=60)
    assert not lab.nvml.persistence_of(0) and not holds(daemon, lab.nodes["nvidia0"])
    assert (lab.root / "state" / f"persistence-{vmid}.yaml").is_file()


def test_persistence_that_cannot_be_turned_off_refuses_the_start(
        vm_host: Lab, daemon: int, vmid: int) -> None:
    """NVML refuses the change (here NO_PERMISSION): the daemon keeps the node, the start
    would hang, so it is refused, and nothing is left recorded."""
    lab = vm_host
    assert lab.nvml is not None
    lab.nvml.gpu_error(0, "persistence", "NO_PERMISSION")
    make_vm(lab, vmid, (0,))
    res = qm.run(lab.root, "start", str(vmid), timeout=60)
    assert res.returncode != 0, res.stdout
    assert "persistence mode could not be turned off" in res.stdout, res.stdout
    assert holds(daemon, lab.nodes["nvidia0"])
    assert not (lab.root / "state" / f"persistence-{vmid}.yaml").exists()
