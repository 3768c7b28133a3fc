"""`pveclean reset GPU` in the lab: the fake NVML (persistence, a leak the reset frees, MIG),
stand-ins for nvidia-smi and systemctl, real LXC holders. Each refusal, the dry run, the
reset that stops a container's holders and the host's daemon and gives both persistence and
the daemon back, and the restore on the tool's failure, its deadline and a failed stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pveclean.host.cgroupfs import cgroup2_root
from tests.harness import nvsmi, qm
from tests.harness.kmsg import Kmsg
from tests.harness.lxclab import Lab, LabUnavailable
from tests.helpers import wait_for

LEAK = 4000


@pytest.fixture
def host_slice() -> Iterator[Path]:
    """A cgroup of the host's own for the persistence daemon's unit (removed after the lab)."""
    try:
        path = Path(cgroup2_root()) / f"pveclean-reset-test-{os.getpid()}.slice"
    except LabUnavailable as exc:
        pytest.skip(str(exc))
    yield path
    for d in [*sorted(path.rglob("*"), reverse=True), path]:
        if d.is_dir():
            with contextlib.suppress(OSError):
                d.rmdir()


@pytest.fixture
def rig(host_slice: Path, vm_host: Lab) -> Iterator[tuple[Lab, Path]]:
    lab = vm_host
    assert lab.nvml is not None
    tools = lab.root / "resettools"
    smi, systemctl = nvsmi.install(tools, lab.nvml.state_path, lab.root / "kmsg")
    Kmsg(lab.root / "kmsg")
    lab.write_config(state_dir=str(lab.root / "state"), pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"),
                     kmsg_path=str(lab.root / "kmsg"), reset_command=str(smi),
                     systemctl_command=str(systemctl), reset_timeout_seconds=2)
    lab.nvml.set_persistence(0, True)
    lab.nvml.leak(0, LEAK)
    yield lab, tools


def _daemon(lab: Lab, host_slice: Path, tools: Path) -> int:
    d = lab.run_on_host("nvidia-persistenced", hold=[str(lab.nodes["nvidia0"])],
                        cgroup=host_slice / "nvidia-persistenced.service")
    (pid,) = d.host_pids(lab)
    (tools / "units" / "nvidia-persistenced.service").write_text(f"{pid}\n")
    return pid


def _reports(lab: Lab) -> list[dict[str, Any]]:
    return [yaml.safe_load(f.read_text()) for f in sorted(lab.report_dir.glob("reset-gpu*"))]


def test_dry_run_then_reset_stops_the_holders_and_gives_everything_back(
        rig: tuple[Lab, Path], host_slice: Path, vmid: int) -> None:
    lab, tools = rig
    assert lab.nvml is not None
    lab.create_ct(vmid, gpus=(0, 1))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0", "/dev/nvidiactl"],
                      gpu_mib={0: 18000})
    other = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia1"], gpu_mib={1: 500})
    (pid,), (pid1,) = w.host_pids(lab), other.host_pids(lab)
    daemon = _daemon(lab, host_slice, tools)
    dry = lab.pveclean("reset", "0", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would stop CT {vmid}'s holders of GPU 0" in dry.stdout
    assert "would stop nvidia-persistenced.service" in dry.stdout
    assert lab.alive(pid) and lab.alive(daemon) and nvsmi.calls(tools) == []
    assert _reports(lab) == []
    res = lab.pveclean("reset", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not lab.alive(pid) and lab.alive(pid1)  # only GPU 0's holder
    calls = nvsmi.calls(tools)
    assert calls == ["systemctl stop nvidia-persistenced.service",
                     "nvidia-smi -r -i 00000000:18:00.0",
                     "systemctl start nvidia-persistenced.service"], calls
    assert lab.nvml.persistence_of(0) is True  # given back
    (rep,) = _reports(lab)
    assert rep["kind"] == "reset" and rep["outcome"] == "reset" and rep["restored"] is True
    assert rep["verify"] == [] and rep["containers"][0]["vmid"] == vmid
    assert 0 not in lab.nvml.leaks  # the reset freed the leak


@pytest.mark.parametrize("mode", ["fail", "hang"])
def test_a_failed_or_hung_tool_still_gives_everything_back(
        rig: tuple[Lab, Path], host_slice: Path, mode: str) -> None:
    lab, tools = rig
    assert lab.nvml is not None
    (tools / "nvsmi.mode").write_text(mode)
    _daemon(lab, host_slice, tools)
    res = lab.pveclean("reset", "0")
    assert res.returncode == 1, res.stdout + res.stderr
    assert nvsmi.calls(tools)[-1] == "systemctl start nvidia-persistenced.service"
    assert lab.nvml.persistence_of(0) is True
    (rep,) = _reports(lab)
    assert rep["outcome"] == ("failed" if mode == "fail" else "timeout")
    assert rep["restored"] is True and lab.nvml.leaks.get(0) == LEAK


def test_a_failed_service_stop_aborts_before_the_reset(rig: tuple[Lab, Path],
                                                      host_slice: Path) -> None:
    lab, tools = rig
    assert lab.nvml is not None
    (tools / "systemctl.fail").write_text("nvidia-persistenced.service")
    _daemon(lab, host_slice, tools)
    res = lab.pveclean("reset", "0")
    assert res.returncode == 1
    assert not any(c.startswith("nvidia-smi") for c in nvsmi.calls(tools))
    assert lab.nvml.persistence_of(0) is True and _reports(lab)[0]["outcome"] == "aborted"


def test_each_refusal_names_its_reason_and_changes_nothing(rig: tuple[Lab, Path],
                                                           vmid: int) -> None:
    lab, tools = rig
    assert lab.nvml is not None
    w = lab.run_on_host("nvtop", hold=[str(lab.nodes["nvidia0"])], gpu_mib={0: 300})
    (pid,) = w.host_pids(lab)
    res = lab.pveclean("reset", "0")
    assert res.returncode == 75 and f"host process PID {pid} nvtop" in res.stderr, res.stderr
    assert lab.alive(pid) and nvsmi.calls(tools) == []
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not lab.alive(pid))
    lab.nvml.set_mig(0, 2)
    res = lab.pveclean("reset", "0")
    assert res.returncode == 75 and "MIG mode with 2" in res.stderr, res.stderr
    lab.nvml.set_mig(0, None)
    qm.create_vm(lab.root, 102, (0,), None)
    started = qm.run(lab.root, "start", "102")
    assert started.returncode == 0, started.stdout + started.stderr
    res = lab.pveclean("reset", qm.gpu_address(0))
    assert res.returncode == 75 and "VM 102" in res.stderr, res.stderr
    assert nvsmi.calls(tools) == [] and lab.nvml.persistence_of(0) is True
    assert [r["outcome"] for r in _reports(lab)] == ["refused"] * 3


def test_a_hostile_container_cannot_fake_an_xid(rig: tuple[Lab, Path], vmid: int) -> None:
    """Xid-looking text in a container's process names and cmdlines, and in /dev/kmsg under
    the user facility (as the kernel records a write there), counts as no Xid."""
    lab, _tools = rig
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "NVRM: Xid (PCI:0", hold=["/dev/nvidia0"], gpu_mib={0: 100})
    k = Kmsg(lab.root / "kmsg")
    k.user("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=init, GPU has fallen off the bus.")
    k.user("<0>NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=init, DBE")
    out = lab.root / "prom"
    out.mkdir()
    res = lab.pveclean("metrics", "--textfile-dir", str(out))
    assert res.returncode == 0, res.stderr
    assert "pveclean_gpu_xid_total" not in (out / "pveclean_gpus.prom").read_text()
    k.xid(pci="0000:18:00", xid=48, pid="unknown", name="<unknown>", text="DBE")
    res = lab.pveclean("metrics", "--textfile-dir", str(out))
    text = (out / "pveclean_gpus.prom").read_text()
    assert ('pveclean_gpu_xid_total{node="' in text and 'gpu="0"' in text
            and 'xid="48",action="reset"} 1' in text), text


def test_ctrl_c_during_the_reset_gives_everything_back(rig: tuple[Lab, Path],
                                                      host_slice: Path) -> None:
    lab, tools = rig
    assert lab.nvml is not None
    (tools / "nvsmi.mode").write_text("hang")
    lab.write_config(state_dir=str(lab.root / "state"), pci_sysfs=str(lab.root / "sys/bus/pci"),
                     qemu_run_dir=str(lab.root / "run/qemu-server"),
                     kmsg_path=str(lab.root / "kmsg"), reset_command=str(tools / "nvidia-smi"),
                     systemctl_command=str(tools / "systemctl"), reset_timeout_seconds=60)
    _daemon(lab, host_slice, tools)
    exe = Path(sys.executable).parent / "pveclean"
    p = subprocess.Popen([str(exe), "reset", "0"], env=lab.env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: any(c.startswith("nvidia-smi") for c in nvsmi.calls(tools)), 30)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, out + err
    assert nvsmi.calls(tools)[-1] == "systemctl start nvidia-persistenced.service"
    assert lab.nvml.persistence_of(0) is True
    (rep,) = _reports(lab)
    assert rep["outcome"] == "interrupted" and rep["restored"] is True


def test_hooks_read_xids_warn_or_refuse_a_start_and_the_report_lists_them(
        rig: tuple[Lab, Path], vmid: int) -> None:
    lab, _tools = rig
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 100})
    (pid,) = w.host_pids(lab)
    Kmsg(lab.root / "kmsg").xid(pci="0000:18:00", xid=95, pid=pid, name="python3",
                                text="Uncontained ECC error")
    res = lab.pveclean("hook", str(vmid), "pre-stop")
    assert res.returncode == 0, res.stdout + res.stderr
    stop = [yaml.safe_load(f.read_text()) for f in lab.report_dir.glob(f"{vmid}-pre-stop-*")]
    assert any(f"Xid 95 (reset) on 0000:18:00, pid {pid} python3" in x
               for r in stop for x in r.get("warnings", [])), stop
    res = lab.pveclean("hook", str(vmid), "pre-start")
    assert res.returncode == 0 and "WARNING" in res.stdout and "Xid 95" in res.stdout
    assert "pveclean reset 0000:18:00 --dry-run" in res.stdout, res.stdout
    lab.write_config(state_dir=str(lab.root / "state"), kmsg_path=str(lab.root / "kmsg"),
                     pre_start_policy="refuse")
    res = lab.pveclean("hook", str(vmid), "pre-start")
    assert res.returncode == 75 and "refusing to start" in res.stdout, res.stdout


@pytest.mark.parametrize("mode", ["noop", "xid"])
def test_a_reset_that_leaves_its_leak_or_logs_an_xid_is_not_verified(rig: tuple[Lab, Path],
                                                                     mode: str) -> None:
    lab, tools = rig
    (tools / "nvsmi.mode").write_text(mode)
    res = lab.pveclean("reset", "0")
    assert res.returncode == 1, res.stdout + res.stderr
    (rep,) = _reports(lab)
    assert rep["outcome"] == "not-verified" and rep["restored"] is True
    want = "still allocated with no process" if mode == "noop" else "a new Xid after the reset"
    assert any(want in v for v in rep["verify"]), rep["verify"]


def test_the_real_kernel_records_a_user_write_under_the_user_facility(tmp_path: Path) -> None:
    """The contract the Xid reader rests on, checked against this host's kernel (root): what
    a process writes to /dev/kmsg, even with a `<0>` (kernel) prefix, is recorded under the
    user facility, and the reader counts none of it."""
    from pveclean.host import kmsg

    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
    except OSError as exc:
        pytest.skip(f"/dev/kmsg not writable here: {exc}")
    kmsg.read_xids("/dev/kmsg", str(tmp_path))  # the position: now
    tag = f"pveclean-test-{os.getpid()}"
    try:
        os.write(fd, f"<0>NVRM: Xid (PCI:0000:ff:00): 79, pid=1, name={tag}, test\n".encode())
        os.write(fd, f"NVRM: Xid (PCI:0000:ff:00): 48, pid=1, name={tag}, test\n".encode())
    finally:
        os.close(fd)
    recs, _lost = kmsg.read_records("/dev/kmsg", -1, 100_000)
    mine = [r for r in recs if tag in r.message]
    assert len(mine) == 2 and all(r.facility == 1 and not r.kernel for r in mine)
    log, new, why = kmsg.read_xids("/dev/kmsg", str(tmp_path))
    assert why is None and not [s for s in new if s.xid.name == tag]
    assert not any(p == "0000:ff:00" for p, _o, _x, _a in log.counts)
