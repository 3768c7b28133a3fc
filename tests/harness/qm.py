#!/usr/bin/env python3
"""A `qm` stand-in for the lab: VMs with PCI passthrough, as far as pveclean's VM guard uses
them. Stdlib only; the hook machinery is pct.py's (PVE::GuestHelpers is shared).

Each behaviour names the qemu-server function it mirrors (src/PVE/QemuServer.pm,
src/PVE/QemuServer/PCI.pm, src/PVE/CLI/qm.pm):
- config in <lab>/etc/pve/qemu-server/<vmid>.conf; the config lock is
  <lab>/run/lock/qemu-server/lock-<vmid>.conf (PVE::QemuConfig::config_file_lock, whose
  messages name /var/lock/qemu-server/lock-<vmid>.conf), 10 s;
- `start`: vm_start takes the lock, vm_start_nolock runs the pre-start hook with
  $stop_on_error (a failure aborts the start: "hookscript error for <vmid> on pre-start:
  ..."), then chooses each line's device (choose_hostpci_devices: a mapping's first free
  alternative; `mdev=` and `driver=keep` unbind nothing), reserves each hostpci device
  (PCI.pm's reserve_pci_usage: another live VM's reservation dies "PCI device '<id>'
  already in use by VMID '<vmid>'"), binds it to vfio-pci (prepare_pci_device ->
  SysFSTools::pci_dev_group_bind_to_vfio: any function of the GPU's IOMMU group; the unbind
  from nvidia is NVIDIA's nv_pci_remove, which does not fail while a process holds the GPU's
  /dev/nvidiaN but waits, polling every 500 ms, until nothing does: the start hangs there,
  the config lock held, with no timeout), starts QEMU (a sleeping process, its pid in
  <lab>/run/qemu-server/<vmid>.pid, the reservation turned to `pid:<pid>`), then post-start;
- `stop`: _do_vm_stop runs pre-stop under the lock, ends QEMU, and vm_stop_cleanup drops the
  reservations and runs post-stop;
- `status`: `status: running|stopped` (qm status).
- `start VMID --migratedfrom NODE`: a live migration's target start (the config still in
  <lab>/etc/pve/nodes/NODE/qemu-server, PVE_MIGRATED_FROM set for the hook);
- `vzdump`: a backup of a stopped VM, started paused in a `vzdump` task;
- `stop-late` and `cleanup`: a stop whose vm_stop_cleanup and post-stop come later, from the
  `qm cleanup` qmeventd forks (qemu-server < 9.1.13, a shutdown inside the guest).
Usage: qm.py --lab DIR <subcommand> VMID [--migratedfrom NODE]
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pct  # the shared hook machinery, as PVE::GuestHelpers is


class VmLab(pct.Lab):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.confdir = root / "etc/pve/qemu-server"
        self.lockdir = root / "run/lock/qemu-server"
        self.qemu_run = root / "run/qemu-server"
        self.devices_dir = root / "dev"

    def lock_file(self, vmid: str) -> Path:
        """PVE::QemuConfig::config_file_lock: /var/lock/qemu-server/lock-<vmid>.conf."""
        return self.lockdir / f"lock-{vmid}.conf"

    def lock_shown(self, vmid: str) -> str:
        return f"/var/lock/qemu-server/lock-{vmid}.conf"

    def pidfile(self, vmid: str) -> Path:
        return self.qemu_run / f"{vmid}.pid"

    def qemu_pid(self, vmid: str) -> int | None:
        """PVE::QemuServer::Helpers::check_running: the pidfile's process, alive."""
        try:
            pid = int(self.pidfile(vmid).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None

    def hostpci(self, vmid: str) -> list[tuple[int, list[list[str]], dict[str, str]]]:
        """Each hostpciN line as PCI.pm's parse_hostpci reads it: its index, its alternatives
        (`host=` or the bare first value: one; `mapping=`: each of this node's `map` entries
        in the order of /etc/pve/mapping/pci.cfg, PVE::Mapping::PCI::find_on_current_node
        with PVE::INotify::nodename, the host name before its first dot), each a list of ids
        (`;`-separated, the 0000 domain added), and its other properties."""
        out = []
        for key, value in self.read_conf(vmid):
            m = re.fullmatch(r"hostpci(\d+)", key)
            if not m:
                continue
            opts = value.split(",")
            props = dict(o.split("=", 1) for o in opts if "=" in o)
            host = next((o for o in opts if "=" not in o), props.get("host"))
            alts = ([host.split(";")] if host else
                    self.mapping(props.get("mapping", "")))
            alts = [[i.strip().lower() if i.count(":") == 2 else f"0000:{i.strip().lower()}"
                     for i in alt if i.strip()] for alt in alts]
            out.append((int(m.group(1)), alts, props))
        return sorted(out)

    def mapping(self, name: str) -> list[list[str]]:
        node = os.uname().nodename.split(".", 1)[0]
        out, cur = [], None
        with contextlib.suppress(OSError):
            for line in (self.root / "etc/pve/mapping/pci.cfg").read_text().splitlines():
                if line and not line[0].isspace():
                    cur = line.strip()
                    continue
                words = line.split(None, 1)
                if cur == name and len(words) == 2 and words[0] == "map":
                    props = dict(kv.split("=", 1) for kv in words[1].split(",") if "=" in kv)
                    if props.get("node") == node and "path" in props:
                        out.append(props["path"].split(";"))
        if not out:
            raise pct.PctError(f"PCI device mapping not found for '{name}'")
        return out


RESERVATIONS = "pci-id-reservations"


def _reservations(lab: VmLab) -> dict[str, tuple[str, str]]:
    path = lab.qemu_run / RESERVATIONS
    out: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                out[parts[0]] = (parts[1], parts[2])
    return out


def _write_reservations(lab: VmLab, res: dict[str, tuple[str, str]]) -> None:
    lab.qemu_run.mkdir(parents=True, exist_ok=True)
    tmp = lab.qemu_run / (RESERVATIONS + ".tmp")
    tmp.write_text("".join(f"{k} {v} {w}\n" for k, (v, w) in sorted(res.items())))
    os.replace(tmp, lab.qemu_run / RESERVATIONS)


def _live(entry: tuple[str, str], lab: VmLab | None = None) -> bool:
    """reserve_pci_usage's test: a `time:` window still open, or a `pid:` that is the VM's
    running QEMU (Helpers::vm_running_locally: its pidfile names that PID, alive)."""
    kind, _, value = entry[1].partition(":")
    if kind == "time":
        return int(value) > time.time()
    if lab is not None and lab.qemu_pid(entry[0]) != int(value):
        return False
    return Path(f"/proc/{value}").exists() and not _zombie(int(value))


def reserve(lab: VmLab, vmid: str, ids: list[str], how: str) -> None:
    """PCI.pm's reserve_pci_usage: a live reservation of another VM dies."""
    res = _reservations(lab)
    for pci in ids:
        held = res.get(pci)
        if held is not None and held[0] != vmid and _live(held, lab):
            if held[1].startswith("time:"):
                raise pct.PctError(f"PCI device '{pci}' is currently reserved for use by "
                                   f"VMID '{held[0]}'")
            raise pct.PctError(f"PCI device '{pci}' already in use by VMID '{held[0]}'")
    for pci in ids:
        res[pci] = (vmid, how)
    _write_reservations(lab, res)


def _holders_of(node: Path) -> list[int]:
    """Processes with an fd on the node (its device number, under its name: the lab's fake
    nodes borrow the numbers of real devices other programs may have open): what keeps the
    driver busy."""
    try:
        rdev = node.stat().st_rdev
    except OSError:
        return []
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    name = os.path.basename(os.readlink(f"/proc/{pid}/fd/{fd}"))
                    if (st.st_rdev == rdev and (st.st_mode & 0o170000) == 0o020000
                            and name == node.name):
                        out.append(int(pid))
                        break
    return out


START_TIMEOUT = 30  # config_aware_timeout's floor
UNBIND_POLL = 0.5  # nv_pci_remove's wait for the usage count: os_delay(500)


def prepare_devices(lab: VmLab, vmid: str, ids: list[str]) -> None:
    """prepare_pci_device: the group's unbind from nvidia (nv_pci_remove) waits while a
    process holds the GPU, for ever (the lab's GPU N is PCI 0000:(0x18+N):00.x, display and
    audio in one IOMMU group, as lay_out_pci has it): a test bounds it with its timeout."""
    for pci in ids:
        m = re.fullmatch(r"0000:([0-9a-f]{2}):00(?:\.[0-7])?", pci)
        if not m:
            continue
        node = lab.devices_dir / f"nvidia{int(m.group(1), 16) - 0x18}"
        said = False
        while _holders_of(node):
            if not said:  # the kernel's log line, on the stand-in's stderr
                print(f"NVRM: Attempting to remove device {pci} with non-zero usage count!",
                      file=sys.stderr, flush=True)
                said = True
            time.sleep(UNBIND_POLL)


def choose(lab: VmLab, vmid: str) -> tuple[list[str], list[str]]:
    """choose_hostpci_devices, then what vm_start_nolock reserves and prepare_pci_device
    unbinds: (ids to reserve, ids to unbind). A line with several alternatives takes the
    first no earlier line uses and no other VM has reserved live; `mdev=` is neither
    reserved nor unbound, `driver=keep` reserved but not unbound."""
    res = _reservations(lab)
    used: set[str] = set()
    reserve_ids: list[str] = []
    unbind: list[str] = []
    for index, alts, props in lab.hostpci(vmid):
        if "mdev" in props:
            continue
        free = [a for a in alts if not used.intersection(a) and not any(
            i in res and res[i][0] != vmid and _live(res[i], lab) for i in a)]
        if len(alts) > 1 and not free:
            raise pct.PctError(f"could not find a free device for 'hostpci{index}'")
        ids = alts[0] if len(alts) == 1 else free[0]
        used.update(ids)
        reserve_ids += ids
        if props.get("driver") != "keep":
            unbind += ids
    return reserve_ids, unbind


def cmd_start(lab: VmLab, vmid: str, task: str = "qmstart") -> None:
    fd = lab.lock(vmid)
    try:
        if lab.qemu_pid(vmid):
            raise pct.PctError(f"VM {vmid} already running")
        pct.hook_phase(lab, vmid, "pre-start", fatal=True, task=task)
        ids, unbind = choose(lab, vmid)
        # vm_start_nolock reserves for $start_timeout (config_aware_timeout: 30 s for a small
        # VM), reserve_pci_usage writes `time:` now + timeout + 5
        reserve(lab, vmid, ids, f"time:{int(time.time()) + START_TIMEOUT + 5}")
        prepare_devices(lab, vmid, unbind)
        proc = subprocess.Popen(["sleep", "100000"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        lab.qemu_run.mkdir(parents=True, exist_ok=True)
        lab.pidfile(vmid).write_text(f"{proc.pid}\n")
        reserve(lab, vmid, ids, f"pid:{proc.pid}")
        pct.hook_phase(lab, vmid, "post-start", fatal=False, task="qmstart")
    finally:
        os.close(fd)


def cmd_stop(lab: VmLab, vmid: str, late: bool = False) -> None:
    """_do_vm_stop; with `late` (qemu-server < 9.1.13, a shutdown from inside the guest),
    vm_stop_cleanup and post-stop are left to `qm cleanup`, which qmeventd forks later."""
    fd = lab.lock(vmid)
    try:
        pid = lab.qemu_pid(vmid)
        if pid is None:
            return
        pct.hook_phase(lab, vmid, "pre-stop", fatal=False, task="qmstop")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            if not Path(f"/proc/{pid}").exists() or _zombie(pid):
                break
            time.sleep(0.01)
        if not late:
            _cleanup(lab, vmid, "qmstop")
    finally:
        os.close(fd)


def _cleanup(lab: VmLab, vmid: str, task: str) -> None:
    """vm_stop_cleanup: the pidfile, the VM's reservations (cleanup_pci_devices), post-stop."""
    with contextlib.suppress(OSError):
        lab.pidfile(vmid).unlink()
    res = {k: v for k, v in _reservations(lab).items() if v[0] != vmid}
    _write_reservations(lab, res)
    pct.hook_phase(lab, vmid, "post-stop", fatal=False, task=task)


def cmd_cleanup(lab: VmLab, vmid: str) -> None:
    """`qm cleanup VMID` as qmeventd forks it after the QEMU process ended."""
    fd = lab.lock(vmid)
    try:
        _cleanup(lab, vmid, "qmcleanup")
    finally:
        os.close(fd)


def cmd_stop_late(lab: VmLab, vmid: str) -> None:
    cmd_stop(lab, vmid, late=True)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def cmd_status(lab: VmLab, vmid: str) -> None:
    print(f"status: {'running' if lab.qemu_pid(vmid) else 'stopped'}")


def cmd_vzdump(lab: VmLab, vmid: str) -> None:
    """vzdump of a stopped VM (VZDump::QemuServer::enforce_vm_running_for_backup): vm_start
    with `paused`, in the vzdump task; every hook phase of a start runs, devices are bound."""
    if lab.qemu_pid(vmid):
        return
    cmd_start(lab, vmid, task="vzdump")


COMMANDS = {"start": cmd_start, "stop": cmd_stop, "status": cmd_status, "vzdump": cmd_vzdump,
            "stop-late": cmd_stop_late, "cleanup": cmd_cleanup}


# ---- for the tests: a lab's VMs -----------------------------------------------------------
QM_PY = Path(__file__).resolve()
GPU_BUS = 0x18  # the fake NVML's bus of GPU 0 (fakenvml.c: nvmlDeviceGetPciInfo_v3)


def gpu_address(gpu: int) -> str:
    return f"0000:{GPU_BUS + gpu:02x}:00.0"


def lay_out_pci(root: Path, gpus: int) -> Path:
    """<root>/sys/bus/pci as the kernel shows the lab's GPUs: per GPU an NVIDIA display
    function on the nvidia driver and its HDMI audio function on snd_hda_intel, the two in one
    IOMMU group. Returns the bus directory (the config's pci_sysfs)."""
    bus = root / "sys/bus/pci"
    for drv in ("nvidia", "snd_hda_intel", "vfio-pci"):
        (bus / "drivers" / drv).mkdir(parents=True, exist_ok=True)
    for gpu in range(gpus):
        group = root / "sys/kernel/iommu_groups" / str(gpu) / "devices"
        group.mkdir(parents=True, exist_ok=True)
        for fn, (cls, dev, drv) in enumerate((("0x030200", "0x2330", "nvidia"),
                                              ("0x040300", "0x22a3", "snd_hda_intel"))):
            addr = gpu_address(gpu)[:-1] + str(fn)
            d = bus / "devices" / addr
            d.mkdir(parents=True, exist_ok=True)
            for name, value in (("vendor", "0x10de"), ("class", cls), ("device", dev),
                                ("driver_override", "(null)")):
                (d / name).write_text(value + "\n")
            for link, target in ((d / "driver", bus / "drivers" / drv),
                                 (d / "iommu_group", group.parent), (group / addr, d)):
                with contextlib.suppress(FileExistsError):
                    link.symlink_to(target)
    return bus


def create_vm(lab_root: Path, vmid: int, gpus: tuple[int, ...], hookscript: str | None
              ) -> Path:
    """etc/pve/qemu-server/<vmid>.conf passing the GPUs through (hostpciN: <address>,pcie=1)."""
    conf = lab_root / "etc/pve/qemu-server" / f"{vmid}.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"name: vm{vmid}", "memory: 1024", "machine: q35"]
    lines += [f"hostpci{i}: {gpu_address(g)},pcie=1" for i, g in enumerate(gpus)]
    if hookscript:
        lines.append(f"hookscript: {hookscript}")
    conf.write_text("".join(line + "\n" for line in lines))
    return conf


def run(lab_root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(QM_PY), "--lab", str(lab_root), *args],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def stop_all(lab_root: Path) -> None:
    """Tear-down: every VM's QEMU stand-in ends."""
    for pidfile in (lab_root / "run/qemu-server").glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--lab" or argv[2] not in COMMANDS:
        print("usage: qm.py --lab DIR start|stop|status|vzdump VMID [--migratedfrom NODE]",
              file=sys.stderr)
        return 255
    lab = VmLab(Path(argv[1]))
    vmid = argv[3]
    os.environ["PATH"] = pct.CLI_PATH
    if argv[2] == "start" and argv[4:5] == ["--migratedfrom"] and len(argv) == 6:
        # the target of a live migration (QemuMigrate: `qm start --migratedfrom SRC`):
        # vm_start loads the config from the source node's directory (load_config($vmid,
        # $migratedfrom)), and vm_start_nolock sets PVE_MIGRATED_FROM for the hook
        lab.confdir = lab.root / "etc/pve/nodes" / argv[5] / "qemu-server"
        os.environ["PVE_MIGRATED_FROM"] = argv[5]
    try:
        if not lab.conf_path(vmid).exists():
            raise pct.PctError(f"Configuration file 'nodes/{pct.NODE}/qemu-server/{vmid}.conf'"
                               " does not exist")
        COMMANDS[argv[2]](lab, vmid)
        return 0
    except pct.PctError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
