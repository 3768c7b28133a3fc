"""Helpers shared by test modules: running pveclean and the hookscript in the lab, reading
their JSON and reports, waiting, and what unit tests build: the fake cluster and sysfs, the
stand-in GPU node of fake /proc trees, a holder in a cgroup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pveclean.core import units
from pveclean.core.records import GpuDevices, Holder
from pveclean.host.pcibind import BindError, Sysfs
from tests.harness import pct as pct_harness
from tests.harness.lxclab import Lab, Workload

REPO = Path(__file__).resolve().parent.parent


GPU_LXC = [["lxc.cgroup2.devices.allow", "c 195:* rwm"],
           ["lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"]]


@dataclass
class Cluster:
    pve: Any  # fakepve.FakePve
    config: Path
    local: Path  # the path of storage 'local' (not shared)
    shared: Path  # the path of storage 'shared'
    tmp: Path


def write_config(tmp: Path, **api: object) -> Path:
    (tmp / "lxc").mkdir(exist_ok=True)
    data = {"report_dir": str(tmp / "reports"), "state_dir": str(tmp / "state"),
            "pve_config_dir": str(tmp / "lxc"), "syslog": False, "api": api}
    path = tmp / "pveclean.yaml"
    path.write_text(yaml.safe_dump(data))
    path.chmod(0o644)
    return path


HOOK = "local:snippets/pveclean-hook"

NULL = os.stat("/dev/null").st_rdev  # a character device every host has: the "GPU node"
DEVICES = GpuDevices({NULL: "/dev/nvidia0"}, frozenset())  # fake /proc trees hold it


def unit_holder(pid: int, cgroup: str, protected: str | None = None) -> Holder:
    """A GPU holder in `cgroup`, with the systemd unit read from it."""
    return Holder(host_pid=pid, starttime=1, ct_pid=pid, name="python3", exe=None, argv=(),
                  uid=0, user="root", state="S", ppid=1, cgroup=cgroup, protected=protected,
                  unit=units.unit_of(cgroup))


def pveclean(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    env = lab.env()
    env["PATH"] = f"{lab.root / 'bin'}:{env['PATH']}"
    return lab.pveclean(*args, env=env)


def conf(lab: Lab, vmid: int) -> dict[str, str]:
    text = (lab.root / "etc/pve/lxc" / f"{vmid}.conf").read_text()
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def other_hook(lab: Lab, vmid: int, name: str = "other.sh") -> Path:
    """Someone else's hookscript: logs every phase it runs in."""
    log = lab.root / f"{name}.log"
    script = lab.snippets / name
    script.write_text(f'#!/bin/sh\necho "$1 $2" >> {log}\nexit 0\n')
    script.chmod(0o755)
    lab.pct("set", str(vmid), "--hookscript", f"local:snippets/{name}")
    return log


# The Proxmox task each phase runs in when a test does not say (pct stop's for pre-stop).
PHASE_TASKS = {"pre-start": "vzstart", "post-start": "vzstart", "pre-stop": "vzstop"}


def hook(lab: Lab, vmid: int | str, phase: str, task: str | None = "default"
         ) -> subprocess.CompletedProcess[str]:
    """Run the installed hookscript the way Proxmox does: cleared env, closed stdin, as the
    child of a worker titled `task UPID:...` of `task` (see tests/harness/pct.py; None: no
    task, as by hand)."""
    kind = PHASE_TASKS.get(phase) if task == "default" else task
    script = lab.snippets / "pveclean-hook"
    argv = [str(script), str(vmid), phase]
    if kind is not None:
        argv = [pct_harness.task_title(str(vmid), kind), "-c", pct_harness.WORKER, *argv]
    r, w = os.pipe()
    os.close(w)
    try:
        return subprocess.run(argv, executable=sys.executable if kind is not None else None,
                              stdin=r, capture_output=True, text=True, timeout=60, check=False,
                              env={"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"})
    finally:
        os.close(r)


def reports(lab: Lab, vmid: int, phase: str) -> list[dict[str, Any]]:
    files = sorted(lab.report_dir.glob(f"{vmid}-{phase}-*.yaml"))
    return [yaml.safe_load(f.read_text()) for f in files]


def wait_for(pred: Any, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def run_json(lab: Lab, *args: str | int, env: dict[str, str] | None = None
             ) -> tuple[int, dict[str, Any]]:
    r = lab.pveclean("ct", *map(str, args), "--json", env=env)
    assert r.stdout.strip(), f"no JSON on stdout; stderr: {r.stderr}"
    return r.returncode, json.loads(r.stdout)


def ct_json(lab: Lab, *args: str) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    r = lab.pveclean("ct", *args, "--json")
    took = time.monotonic() - t0
    return r.returncode, json.loads(r.stdout), took


def start_in_ct(lab: Lab, vmid: int, name: str, flags: list[str], pre: str = "") -> Workload:
    """Like Lab.run_in_ct, with any holder flags and a shell prelude run before it."""
    tag, ready = lab.ct_holder(vmid, name, kind="x")
    argv = [f"/opt/lab/bin/{name}", *flags, "--ready", ready, "--exit-after", "900"]
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    lab.pct("exec", str(vmid), "--", "/bin/sh", "-c",
            f"{pre}{quoted} </dev/null >/dev/null 2>&1 &")
    w = Workload(vmid, tag, lab.rootfs(vmid) / ready.lstrip("/"))
    lab.workloads.append(w)
    lab._wait_ready(w, 1)
    return w


def _pci(root: Path, addr: str, cls: str, driver: str | None, vendor: str = "0x10de") -> None:
    d = root / "devices" / addr
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")
    (d / "device").write_text("0x2330\n")
    if driver:
        (root / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        (d / "driver").symlink_to(root / "drivers" / driver)


def fake_host_pci(tmp: Path, pve: Path) -> Path:
    """Five NVIDIA functions: two GPUs on vfio-pci (one by address, one by a resource
    mapping), one on the nvidia driver, one without a driver, and a GPU's audio function."""
    sysfs = tmp / "sys"
    _pci(sysfs, "0000:41:00.0", "0x030200", "vfio-pci")
    _pci(sysfs, "0000:41:00.1", "0x040300", "vfio-pci")  # audio of the same card: not a GPU
    _pci(sysfs, "0000:42:00.0", "0x030200", "nvidia")
    _pci(sysfs, "0000:43:00.0", "0x030000", None)
    _pci(sysfs, "0000:44:00.0", "0x030200", "vfio-pci")
    _pci(sysfs, "0000:45:00.0", "0x030000", "vfio-pci", vendor="0x1002")  # not NVIDIA
    (pve / "qemu-server").mkdir(parents=True, exist_ok=True)
    (pve / "qemu-server/200.conf").write_text(
        "name: trainer\nhostpci0: 0000:41:00,pcie=1,x-vga=1\n[snap]\nhostpci1: 43:00.0\n")
    (pve / "qemu-server/201.conf").write_text("name: win\nhostpci0: mapping=bigone,pcie=1\n")
    (pve / "qemu-server/202.conf").write_text("hostpci0: host=0000:44:00.0\n")
    (pve / "mapping").mkdir(exist_ok=True)
    (pve / "mapping/pci.cfg").write_text(
        f"bigone\n\tmap id=10de:2330,node={os.uname().nodename},path=0000:44:00.0\n"
        "\tmap id=10de:2330,node=othernode,path=0000:41:00.0\n")
    return sysfs / "devices"


DEFAULT = {"0x03": "nvidia", "0x04": "snd_hda_intel"}  # what the kernel binds without override


class KernelSim(Sysfs):
    """The kernel's part on a laid-out sysfs root: what a write to driver_override,
    driver/unbind, drivers_probe and drivers/<d>/bind does to a device's `driver` link;
    `fail`: (function, file) writes that fail with EBUSY, as an unbind of a held GPU does."""

    def __init__(self, root: Path, fail: set[tuple[str, str]] | None = None) -> None:
        super().__init__(root)
        self.fail = fail or set()  # (function, operation) that fails with EBUSY
        self.writes: list[tuple[str, str]] = []

    def _link(self, fn: str, driver: str | None) -> None:
        link = self.dev(fn) / "driver"
        if link.is_symlink():
            link.unlink()
        if driver:
            link.symlink_to(self.root / "drivers" / driver)

    def write(self, path: Path, text: str) -> None:
        rel = path.relative_to(self.root).parts
        fn = text.strip() if rel[-1] in ("unbind", "bind", "drivers_probe") else rel[1]
        op = rel[-1]
        self.writes.append((fn, op))
        if (fn, op) in self.fail:
            raise BindError(f"writing {text.strip()!r} to {path}: Device or resource busy")
        if op == "driver_override":
            (self.dev(fn) / "driver_override").write_text((text.strip() or "(null)") + "\n")
        elif op == "unbind":
            self._link(fn, None)
        elif op == "bind":
            self._link(fn, rel[-2])
        elif op == "drivers_probe":
            override = (self.dev(fn) / "driver_override").read_text().strip()
            cls = (self.dev(fn) / "class").read_text()[:4]
            self._link(fn, override if override != "(null)" else DEFAULT[cls])
