"""What `pveclean gpus` reads, in its worker (commands/gpus.py hands it the look): every GPU of
this host and who uses it, attributed to its owner.

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

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from pveclean.core import notjudged
from pveclean.core.config import Config
from pveclean.core.discovery import stall_for
from pveclean.core.gpufaults import from_driver, with_faults, with_known
from pveclean.core.gpumap import (
    GpuMap,
    GpuProc,
    GpuUse,
    ScanStats,
    VmConflict,
    gpu_use,
    owner_order,
    place_all,
)
from pveclean.core.notjudged import NotJudged
from pveclean.core.owners import Layout, Owner, OwnerKind, is_ct_dir
from pveclean.core.pci import PciAddress
from pveclean.core.records import GpuDevices, GpuMemory, NvmlProcesses, Scope, Source, SourceState
from pveclean.core.vmguard import conflicts
from pveclean.errors import PvecleanError
from pveclean.host import cgroupfs, devnodes, worker
from pveclean.host.hostscan import HostScan, attribute_pid
from pveclean.host.nvml import ABANDONED, Nvml, NvmlUnavailable
from pveclean.host.procscan import w_scan
from pveclean.host.reads import Reader, Unread
from pveclean.host.worker import Worker
from pveclean.proxmox import pveconf
from pveclean.proxmox.passthrough import (
    PCI_DEVICES,
    read_pci_mappings,
    this_node,
    vfio_gpus,
    vm_passthrough,
)
from pveclean.proxmox.pveconf import may_use_gpus


def look(cfg: Config, pci_root: Path | None, end: float | None) -> GpuMap:
    """collect() in the worker of `pveclean gpus` (commands/gpus.w_collect): what can hang
    there (a pmxcfs that stopped answering, /proc/PID/maps of a process wedged in the GPU
    driver, NVML) hangs the worker, which the command gives up on at its deadline, not the
    command. The NVML session lives in the worker's state across --watch refreshes."""
    return collect(cfg, nvml_session(worker.state()), pci_root or PCI_DEVICES,
                   exclude={os.getpid(), os.getppid()}, end=end)


# ---- one look at the host -----------------------------------------------------------------
def _ask_nvml(nvml: Nvml, warnings: list[str]
              ) -> tuple[list[GpuMemory], NvmlProcesses, dict[int, PciAddress], Source]:
    """GPU memory, processes and PCI bus ids, each answer on its own (a driver that cannot
    list processes still gives the GPUs and their bus ids), each GPU on its own (one NVML
    cannot answer for is marked with its status and reason, the others shown)."""
    gpus: list[GpuMemory] = []
    used = NvmlProcesses()
    buses: dict[int, PciAddress] = {}
    failed: list[tuple[str, NvmlUnavailable]] = []  # (what was asked, why it failed)
    for what in ("memory", "processes", "PCI bus ids"):
        try:
            if what == "memory":
                gpus = nvml.memory()
            elif what == "processes":
                used = nvml.processes()
            else:
                buses = nvml.pci_bus_ids()
        except NvmlUnavailable as exc:
            failed.append((what, exc))
    if len(failed) == 3:  # NVML itself (init, library): one line says it
        why = str(failed[0][1])
        warnings.append(f"NVML unavailable ({why}): holders from device nodes only, no memory")
        return gpus, used, buses, Source(SourceState.UNAVAILABLE, f"unavailable: {why}")
    said = [f"no {what}: {exc}" for what, exc in failed]
    warnings += [f"NVML gave {line}" for line in said]
    for what, fault in failed:
        if what == "processes":  # not "every GPU's memory leaked" (issue 38): not judged
            from pveclean.core.release import unlisted
            used = unlisted(gpus, str(fault))
    gpus = with_faults(gpus, used.faults)
    gpus, buses = with_known(gpus, buses, worker.state().setdefault("gpu_known", {}))
    if any(not g.uuid for g in gpus):  # issue 38: a fresh process knows none: the driver's
        from pveclean.host.nvmlfacts import driver_gpus  # (only then: not on every look)
        gpus, buses = from_driver(gpus, buses, driver_gpus())
    for g in gpus:
        if not g.ok:
            warnings.append(f"GPU {g.index} is {g.status} ({g.reason}): NVML cannot tell who "
                            "holds memory on it")
    if not failed:
        return gpus, used, buses, Source(SourceState.OK)
    return gpus, used, buses, Source(SourceState.PARTIAL, f"partial: {'; '.join(said)}")


def nvml_session(state: worker.State) -> Nvml:
    """The worker's NVML session; after a round in which NVML stalled or failed (the
    session's `error`), a new one that asks NVML again (issue 38: a --watch or the exporter
    does not keep the error for the rest of its run), once no call of the old one is still
    stuck in the driver (asking then would only leave another thread stuck)."""
    nv = state.get("nvml")
    stuck = any(t.is_alive() for t in ABANDONED)
    if nv is not None and nv.error and not stuck:
        del state["nvml"]
    return Nvml.in_worker(state)


@dataclass
class Seen:
    """What HostScan read this time: the host PIDs read whole that hold nothing, and every
    host PID listed (for `pveclean metrics`' rolling reads)."""

    clean: list[int] = field(default_factory=list)
    alive: set[int] = field(default_factory=set)


def collect(cfg: Config, nvml: Nvml | None, pci_root: Path = PCI_DEVICES,
            exclude: set[int] | None = None, end: float | None = None,
            settled: frozenset[int] = frozenset(), seen: Seen | None = None) -> GpuMap:
    """Every GPU, every holder, every owner: the map (what --json prints).
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
        look = _Look(cfg, root, devices, end, warnings)
        gmap = look.build(nvml, pci_root, host_scan, ct_reader, t0)
        if host_scan is not None and seen is not None:
            seen.clean, seen.alive = host_scan.clean, host_scan.alive
        return gmap
    finally:
        ct_reader.close()
        if host_scan is not None:
            host_scan.close()


@dataclass
class _Look:
    """One look at the host, step by step: the containers, NVML, the host's, the VMs'."""

    cfg: Config
    root: Path
    devices: GpuDevices
    end: float | None
    warnings: list[str]
    procs: dict[int, GpuProc] = field(default_factory=dict)
    hostnames: dict[int, str] = field(default_factory=dict)
    scanned: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    unread: list[NotJudged] = field(default_factory=list)  # never innocent: core/notjudged

    def containers(self, ct_reader: Reader) -> None:
        """The holders of each container whose config may use a GPU (or that has none)."""
        majors = devnodes.nvidia_majors()
        try:
            ct_dirs = sorted(e.name for e in os.scandir(self.root / Layout.PVE) if e.is_dir())
        except OSError:
            ct_dirs = []
        for name in ct_dirs:
            if not is_ct_dir(name):
                continue
            vmid = int(name)
            try:
                conf: pveconf.CtConfig | None = pveconf.read_config(self.cfg.pve_config_dir,
                                                                    vmid)
            except PvecleanError:
                conf = None  # a cgroup without a config here: cannot tell, so look
            if conf is not None:
                self.hostnames[vmid] = conf.get("hostname") or ""
                if not may_use_gpus(conf, majors):
                    self.skipped.append(vmid)
                    continue
            self.scanned.append(vmid)
            self._container(ct_reader, vmid, self.root / Layout.PVE / name)

    def _container(self, ct_reader: Reader, vmid: int, cgroup_dir: Path) -> None:
        scope = Scope(vmid, cgroup_dir, self.devices, frozenset(),
                      running=cgroupfs.monitor_running(str(self.root), vmid))
        try:
            view = ct_reader.call(w_scan, scope, end=self.end, what=f"reading CT {vmid}")
        except Unread as why:  # a tree the container made unreadable, or past the deadline
            self.warnings.append(str(why))
            self.warnings.append(f"CT {vmid}: its cgroup tree could not be read; its holders "
                                 "are shown only as NVML lists them")
            self.unread.append(notjudged.tree(vmid, str(why)))
            return
        self.warnings += [f"CT {vmid}: {p}" for p in view.unjudged_problems()]
        self.unread += notjudged.of_container(vmid, view.unjudged)
        for h in view.holders.values():
            if h.host_pid == 0:  # discovery.unwalked: the part of the tree not walked
                self.unread.append(notjudged.tree(vmid, h.protected or "not walked"))
                continue
            self.procs[h.host_pid] = GpuProc.of_holder(h, vmid, view.rdevs.get(h.host_pid, ()))

    def host(self, host_scan: HostScan | None) -> tuple[list[GpuProc], int]:
        """The host's own holders, and how many of its processes were looked at."""
        if host_scan is None:
            return [], 0
        try:
            host, n_host, unread = host_scan.result()
        except Exception as exc:
            self.warnings.append(f"the host's cgroups could not be read "
                                 f"({type(exc).__name__}); host holders are shown only as "
                                 "NVML lists them")
            self.unread += notjudged.of_host([f"its cgroups ({type(exc).__name__})"])
            return [], 0
        self.warnings += unread
        self.unread += notjudged.of_host(unread)
        return host, n_host

    def build(self, nvml: Nvml | None, pci_root: Path, host_scan: HostScan | None,
              ct_reader: Reader, t0: float) -> GpuMap:
        self.containers(ct_reader)
        nvml_state = Source(SourceState.DISABLED)
        gpus: list[GpuMemory] = []
        used = NvmlProcesses()
        buses: dict[int, PciAddress] = {}
        if nvml is not None:
            gpus, used, buses, nvml_state = _ask_nvml(nvml, self.warnings)
            if nvml_state.state is SourceState.PARTIAL:  # who has memory where: not all told
                self.unread.append(notjudged.NotJudged(Owner(OwnerKind.UNKNOWN), "NVML",
                                                       str(nvml_state)))
        host, n_host = self.host(host_scan)
        if host_scan is None:
            self.unread += notjudged.of_host(["its cgroups could not be read"])
        self.procs.update((p.host_pid, p) for p in host)
        for pid, per_gpu in used.by_pid.items():
            self.procs[pid] = (self.procs.get(pid) or attribute_pid(pid)).with_memory(per_gpu)
        placed = place_all(self.procs.values(), self.devices)
        pve = Path(self.cfg.pve_config_dir).parent
        vfio = vfio_gpus(pci_root, pve / "qemu-server", pve / "mapping" / "pci.cfg")
        for p in self.procs.values():
            if p.owner.vmid is not None and p.owner.vmid not in self.hostnames:
                self.hostnames[p.owner.vmid] = ""
        uses = tuple(gpu_use(g, buses.get(g.index), placed) for g in gpus)
        other = [p.proc for p in placed if not any(p.on(g) for g in gpus)]
        scan = ScanStats(tuple(self.scanned), tuple(self.skipped), n_host, len(host),
                         round(time.monotonic() - t0, 3),
                         None if host_scan is None else host_scan.settled)
        gmap = GpuMap(os.uname().nodename, time.time(), uses,
                      tuple(sorted(other, key=owner_order)),
                      tuple(vfio), (), dict(self.hostnames), scan,
                      Source(SourceState.OK), nvml_state, tuple(self.warnings),
                      tuple(p.proc for p in placed if p.nodes.untied), tuple(self.unread))
        return gmap.with_conflicts(self.conflicts(uses, pve))

    def conflicts(self, uses: tuple[GpuUse, ...], pve: Path) -> list[VmConflict]:
        vm_refs = vm_passthrough(pve / "qemu-server",
                                 read_pci_mappings(pve / "mapping" / "pci.cfg", this_node()))
        return conflicts(uses, vm_refs, self.cfg.vm_gpu_policy, self.cfg.vm_gpu_allow_host)
