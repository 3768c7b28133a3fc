"""`pveclean gpus`: every GPU of this host and who uses it, attributed to its owner.

Owners: a container (VMID, hostname, the systemd unit inside it), the host (process and its
systemd unit), or a VM that the GPU is passed to (bound to vfio-pci, named in a `hostpci`
line). Memory comes from NVML per process and per GPU; what no process accounts for is
shown as a leak.

Fast on a busy host: a container whose config passes no GPU through cannot open a GPU node
(its devices cgroup denies it), so its processes are not read at all. The containers that can
are scanned as `pveclean ct` scans one (host/procscan.scan_host); the host's own processes
(everything outside the `lxc/` cgroup tree) the same way. NVML's PIDs are attributed by their
cgroup, so a process with GPU memory is never missed, wherever it runs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from pveclean.core.config import Config
from pveclean.core.discovery import stall_for
from pveclean.core.gpufaults import with_faults
from pveclean.core.gpumap import (
    Proc,
    gpu_entry,
    gpu_indices,
    minors_held,
    owner_order,
    proc_of_holder,
)
from pveclean.core.records import GpuDevices, GpuMemory, NvmlProcesses, Scope
from pveclean.core.report import iso
from pveclean.core.vmguard import conflicts
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import cgroupfs, devnodes, worker
from pveclean.host.hostscan import HostScan
from pveclean.host.nvml import Nvml, NvmlUnavailable
from pveclean.host.procscan import attribute_pid, w_scan
from pveclean.host.reads import Reader, Unread
from pveclean.host.worker import RemoteError, Worker, WorkerError
from pveclean.proxmox import pveconf
from pveclean.proxmox.passthrough import (
    PCI_DEVICES,
    read_pci_mappings,
    vfio_gpus,
    vm_passthrough,
)
from pveclean.proxmox.pveconf import may_use_gpus

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# ---- the command ---------------------------------------------------------------------------
READERS_SHARE = 0.8  # of the deadline: the host's forked readers are given up on by then


def screen_control(stream: TextIO, env: Mapping[str, str]) -> bool:
    """Whether `stream` takes cursor and clear codes: a terminal, and not TERM=dumb (Emacs'
    shell, a serial console) or no TERM at all (cron, a unit)."""
    return stream.isatty() and env.get("TERM", "dumb") not in ("", "dumb")


def show(cfg: Config, as_json: bool = False, watch: float | None = None, count: int = 0,
         pci_root: Path = PCI_DEVICES) -> int:
    """`pveclean gpus`: read the host in a worker bounded by deadline_seconds, print, and
    with `watch` do it again every `watch` seconds (`count` times; 0: until Ctrl-C).
    Exit code 0, or PvecleanError (exit 3) when the host could not be read in time."""
    from pveclean.commands.gpuview import render_gpus  # here: `metrics` and `status` need none

    tty = screen_control(sys.stdout, os.environ)
    shown = 0
    limit = cfg.deadline_seconds
    with Worker(**Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)) as wk:
        try:
            while True:
                # its forked readers are given up on first, so that the rest is still shown
                end = time.monotonic() + limit * READERS_SHARE
                data = wk.call(w_collect, cfg, pci_root, end, timeout=limit, what="gpus")
                text = json.dumps(data, indent=2, default=str) if as_json else render_gpus(data)
                if watch and tty and not as_json:
                    text = "\x1b[H\x1b[2J" + text  # redraw in place
                print(text, flush=True)
                shown += 1
                if not watch or (count and shown >= count):
                    break
                if not tty or as_json:
                    print(flush=True)
                time.sleep(watch)
        except KeyboardInterrupt:
            pass
        except WorkerError as exc:
            raise PvecleanError(f"gpus: reading the host did not finish within {limit:.0f} s "
                                f"({exc.why}); nothing shown",
                                ExitCode.ACCESS) from None
        except RemoteError as exc:
            raise PvecleanError(f"gpus: {exc}", ExitCode.ACCESS) from None
    return ExitCode.OK


# ---- one look at the host -----------------------------------------------------------------
def _ask_nvml(nvml: Nvml, warnings: list[str]
              ) -> tuple[list[GpuMemory], NvmlProcesses, dict[int, str], str]:
    """GPU memory, processes and PCI bus ids, each answer on its own (a driver that cannot
    list processes still gives the GPUs and their bus ids), each GPU on its own (one NVML
    cannot answer for is marked with its status and reason, the others shown)."""
    gpus: list[GpuMemory] = []
    used = NvmlProcesses()
    buses: dict[int, str] = {}
    failed: list[str] = []
    for what in ("memory", "processes", "PCI bus ids"):
        try:
            if what == "memory":
                gpus = nvml.memory()
            elif what == "processes":
                used = nvml.processes()
            else:
                buses = nvml.pci_bus_ids()
        except NvmlUnavailable as exc:
            failed.append(f"no {what}: {exc}")
    if len(failed) == 3:  # NVML itself (init, library): one line says it
        why = failed[0].split(": ", 1)[1]
        warnings.append(f"NVML unavailable ({why}): holders from device nodes only, no memory")
        return gpus, used, buses, f"unavailable: {why}"
    warnings += [f"NVML gave {f}" for f in failed]
    gpus = with_faults(gpus, used.faults)
    for g in gpus:
        if not g.ok:
            warnings.append(f"GPU {g.index} is {g.status} ({g.reason}): NVML cannot tell who "
                            "holds memory on it")
    return gpus, used, buses, "ok" if not failed else f"partial: {'; '.join(failed)}"



def look_once(cfg: Config, pci_root: Path, limit: float, what: str) -> dict[str, Any]:
    """collect() once in a worker of its own, bounded by `limit` seconds (its forked readers
    by READERS_SHARE of it); PvecleanError (exit 3) when it did not finish: for the commands
    that need the map but do not print it (status, the VM hook)."""
    with Worker(**Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)) as wk:
        try:
            data: dict[str, Any] = wk.call(w_collect, cfg, pci_root,
                                           time.monotonic() + limit * READERS_SHARE,
                                           timeout=limit, what=what)
        except (WorkerError, RemoteError) as exc:
            raise PvecleanError(str(exc), ExitCode.ACCESS) from None
    return data


def w_collect(cfg: Config, pci_root: Path, end: float | None = None) -> dict[str, Any]:
    """collect() in a worker (`pveclean gpus`): what can hang there (a pmxcfs that stopped
    answering, /proc/PID/maps of a process wedged in the GPU driver, NVML) hangs the worker,
    which the command gives up on at its deadline, not the command. The NVML session lives
    in the worker's state across --watch refreshes."""
    return collect(cfg, Nvml.in_worker(worker.state()), pci_root,
                   exclude={os.getpid(), os.getppid()}, end=end)


def collect(cfg: Config, nvml: Nvml | None, pci_root: Path = PCI_DEVICES,
            exclude: set[int] | None = None, end: float | None = None,
            settled: frozenset[int] = frozenset(), seen: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """Every GPU, every holder, every owner, as one plain dict (what --json prints).
    `exclude`: pveclean's own processes (default: this one), left out of the host's; `end`
    (monotonic): when the host's forked readers are given up on; `settled`: host PIDs not
    read this time; `seen` gets HostScan's `clean` and `alive` PIDs."""
    t0 = time.monotonic()
    root = Path(cfg.cgroup_root or cgroupfs.cgroup2_root())
    devices = devnodes.gpu_devices(cfg.devices)
    warnings: list[str] = []
    host_scan: HostScan | None = None
    try:
        # the host's readers go first: they read while the containers and NVML are asked
        host_scan = HostScan(root, devices, exclude or {os.getpid()}, stall_for(cfg), end,
                             settled=settled)
    except Exception as exc:
        warnings.append(f"the host's cgroups could not be read ({type(exc).__name__}); host "
                        "holders are shown only as NVML lists them")
    # the containers', one after another
    ct_reader = Reader(Worker(marks=True), stall_for(cfg), warnings, "not looked at")
    try:
        data = _collect(cfg, nvml, pci_root, root, devices, host_scan, ct_reader, warnings, t0,
                        end)
        if host_scan is not None:
            data["scan"]["host_processes_settled"] = host_scan.settled
            if seen is not None:
                seen.update(clean=host_scan.clean, alive=host_scan.alive)
        return data
    finally:
        ct_reader.close()
        if host_scan is not None:
            host_scan.close()


def _collect(cfg: Config, nvml: Nvml | None, pci_root: Path, root: Path, devices: GpuDevices,
             host_scan: HostScan | None, ct_reader: Reader, warnings: list[str], t0: float,
             end: float | None) -> dict[str, Any]:
    majors = devnodes.nvidia_majors()
    pve = Path(cfg.pve_config_dir).parent
    procs: dict[int, Proc] = {}
    hostnames: dict[int, str] = {}
    scanned, skipped = [], []
    try:
        ct_dirs = sorted(e.name for e in os.scandir(root / "lxc") if e.is_dir())
    except OSError:
        ct_dirs = []
    for name in ct_dirs:
        if not name.isdigit():
            continue
        vmid = int(name)
        try:
            conf: pveconf.CtConfig | None = pveconf.read_config(cfg.pve_config_dir, vmid)
        except PvecleanError:
            conf = None  # a cgroup without a config here: cannot tell, so look
        if conf is not None:
            hostnames[vmid] = conf.get("hostname") or ""
            if not may_use_gpus(conf, majors):
                skipped.append(vmid)
                continue
        scanned.append(vmid)
        scope = Scope(vmid, root / "lxc" / name, devices, frozenset(),
                      running=cgroupfs.monitor_running(str(root), vmid))
        try:
            view = ct_reader.call(w_scan, scope, end=end, what=f"reading CT {vmid}")
        except Unread as why:  # a tree the container made unreadable, or past the deadline
            warnings.append(str(why))
            warnings.append(f"CT {vmid}: its cgroup tree could not be read; its holders are "
                            "shown only as NVML lists them")
            continue
        warnings += [f"CT {vmid}: {p}" for p in view.unjudged_problems()]
        for h in view.holders.values():
            procs[h.host_pid] = proc_of_holder(h, vmid)
    nvml_state = "ok"
    gpus: list[GpuMemory] = []
    used = NvmlProcesses()
    buses: dict[int, str] = {}
    if nvml is None:
        nvml_state = "disabled"
    else:
        gpus, used, buses, nvml_state = _ask_nvml(nvml, warnings)
    host: list[Proc] = []
    n_host = 0
    if host_scan is not None:
        try:
            host, n_host, unread = host_scan.result()
            warnings += unread
        except Exception as exc:
            warnings.append(f"the host's cgroups could not be read ({type(exc).__name__}); "
                            "host holders are shown only as NVML lists them")
    procs.update((p.host_pid, p) for p in host)
    for pid, per_gpu in used.by_pid.items():
        p = procs.get(pid) or attribute_pid(pid)
        p.memory.update(per_gpu)
        procs[pid] = p
    for p in procs.values():
        p.minors = minors_held(p, devices)
    qemu_dir = pve / "qemu-server"
    vfio = vfio_gpus(pci_root, qemu_dir, pve / "mapping" / "pci.cfg")
    vm_refs = vm_passthrough(qemu_dir, read_pci_mappings(pve / "mapping" / "pci.cfg",
                                                         os.uname().nodename))
    for p in procs.values():
        if p.vmid is not None and p.vmid not in hostnames:
            hostnames[p.vmid] = ""
    data = {
        "pveclean_gpus": 1,
        "host": os.uname().nodename,
        "time": iso(time.time()),
        "gpus": [gpu_entry(g, buses.get(g.index), procs.values()) for g in gpus],
        "other_holders": [p.as_dict() for p in sorted(procs.values(), key=owner_order)
                          if not gpu_indices(p, gpus)],
        "vfio": vfio,
        "vm_conflicts": [],
        "containers": {str(v): {"hostname": hostnames.get(v, "")} for v in sorted(hostnames)},
        "scan": {"containers_scanned": scanned, "containers_skipped_no_gpu": skipped,
                 "host_processes": n_host, "host_holders": len(host),
                 "seconds": round(time.monotonic() - t0, 3)},
        "sources": {"host": "ok", "nvml": nvml_state},
        "warnings": warnings,
    }
    data["vm_conflicts"] = conflicts(data, vm_refs, cfg.vm_gpu_policy, cfg.vm_gpu_allow_host)
    return data
