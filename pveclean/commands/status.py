"""`pveclean status`: every container of the cluster (through the API) with its GPU config
and hookscript; this node's also with their current GPU holders and their last report."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pveclean.cleanup import RunOptions, clean
from pveclean.core.config import Config
from pveclean.core.gpumap import VmConflict
from pveclean.core.records import Holder, device_labels
from pveclean.errors import PvecleanError
from pveclean.host import devnodes, reportfiles
from pveclean.host.prelude import NvmlWorker
from pveclean.proxmox import chain
from pveclean.proxmox.hookscript import is_pveclean
from pveclean.proxmox.pveapi import Api, Container, Storage

Json = dict[str, object]  # one object of `status --json`'s document


@dataclass(frozen=True)
class LastReport:
    """A container's newest report as status shows it (its values as the file has them)."""

    path: str
    verdict: object = None
    phase: object = None
    start: object = None
    error: str | None = None  # the file could not be read

    def as_dict(self) -> Json:
        if self.error is not None:
            return {"path": self.path, "error": self.error}
        return {"path": self.path, "verdict": self.verdict, "phase": self.phase,
                "start": self.start}


class HookKind(StrEnum):
    NONE = "none"
    OTHER = "other"  # another hookscript
    PVECLEAN = "pveclean"
    CHAINED = "chained"  # pveclean's, running the one it replaced after it


@dataclass(frozen=True)
class Grant:
    """A container's GPU config and hookscript."""

    lines: tuple[str, ...]  # the config lines that grant GPU nodes
    hookscript: str | None
    hook: HookKind
    gpus: tuple[int, ...] | None  # the GPUs granted (None: every GPU of the host)
    chained: str | None


@dataclass
class CtView:
    """One container of the cluster, filled in as far as status could read it."""

    vmid: int
    node: str
    name: str
    status: str
    lock: str | None
    template: bool
    error: str | None = None  # its config could not be read
    grant: Grant | None = None
    last_report: LastReport | None = None
    report_looked: bool = False  # this node's: its last report was looked for
    state_error: str | None = None  # its live state could not be read
    holders: tuple[Holder, ...] | None = None
    holders_error: str | None = None
    doctor: dict[str, int] | None = None  # this node's: doctor's findings per check

    @property
    def problem(self) -> str | None:
        """Why its holders are not shown (the last word, as the document keeps it)."""
        return self.holders_error if self.holders_error is not None else self.state_error

    @property
    def gpu_memory_mib(self) -> int:
        return sum(m or 0 for h in self.holders or () for m in h.gpu_memory_mib.values())

    def as_dict(self) -> Json:
        d: Json = {"vmid": self.vmid, "node": self.node, "name": self.name,
                   "status": self.status, "lock": self.lock, "template": self.template}
        if self.error is not None:
            d["error"] = self.error
        g = self.grant
        if g is not None:
            d.update(gpu=list(g.lines), hookscript=g.hookscript, hook=str(g.hook),
                     gpus=None if g.gpus is None else list(g.gpus), chained=g.chained)
        if self.report_looked:
            d["last_report"] = None if self.last_report is None else self.last_report.as_dict()
        if self.state_error is not None:
            d["holders_error"] = self.state_error
        if self.holders is not None:
            d["holders"] = [_holder_row(h) for h in self.holders]
            d["gpu_memory_mib"] = self.gpu_memory_mib
        if self.holders_error is not None:
            d["holders_error"] = self.holders_error
        if self.doctor is not None:
            d["doctor_findings"] = dict(self.doctor)
        return d


def _holder_row(h: Holder) -> Json:
    return {"host_pid": h.host_pid, "ct_pid": h.ct_pid, "name": h.name, "unit": h.unit,
            "gpu_memory_mib": {int(k): v for k, v in sorted(h.gpu_memory_mib.items())},
            "devices": device_labels(h.devices, h.devices_more)}


@dataclass(frozen=True)
class StatusView:
    """`pveclean status`: the cluster's containers, this node's VMs' conflicts, warnings."""

    node: str
    nodes: dict[str, bool]
    containers: tuple[CtView, ...]
    vm_conflicts: tuple[VmConflict, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> Json:
        return {"node": self.node, "nodes": self.nodes,
                "containers": [c.as_dict() for c in self.containers],
                "vm_conflicts": [c.as_dict() for c in self.vm_conflicts],
                "warnings": list(self.warnings)}


def last_report(cfg: Config, vmid: int) -> LastReport | None:
    paths = reportfiles.list_reports(cfg.report_dir, vmid)
    if not paths:
        return None
    try:
        rep = reportfiles.load_row(paths[-1])
    except Exception as exc:  # a broken file (OSError, ReportError, anything) is shown, not fatal
        return LastReport(str(paths[-1]), error=f"unreadable: {type(exc).__name__}")
    return LastReport(str(paths[-1]), rep.verdict, rep.phase, rep.start)


def holders(cfg: Config, e: CtView) -> None:
    """Current GPU holders of a container on this node (a dry run: nothing is signalled)."""
    try:
        with NvmlWorker() as nvml:  # each container's run its own, as its count of kills
            rep = clean(e.vmid, cfg, nvml.warm(cfg, e.vmid), RunOptions(phase="status",
                        dry_run=True, write_report=False)).report
    except PvecleanError as exc:
        e.holders_error = str(exc)
        return
    e.holders = tuple(rep.holders)
    if rep.busy:
        e.holders_error = "busy: another pveclean run holds this container"


class _Snippets:
    """Which nodes lack a hookscript that lives on non-shared storage (cached per call)."""

    def __init__(self, api: Api, online: dict[str, bool]) -> None:
        self.api, self.online = api, online
        self.storages: dict[str, Storage | str] = {}
        self.present: dict[tuple[str, str], set[str] | str] = {}

    def warnings(self, c: Container, volid: str) -> list[str]:
        name = volid.partition(":")[0]
        if name not in self.storages:
            try:
                self.storages[name] = self.api.storage(name)
            except PvecleanError as exc:
                self.storages[name] = str(exc)
        st = self.storages[name]
        if isinstance(st, str):
            return [f"CT {c.vmid}: cannot check its hookscript {volid}: {st}"]
        if st.shared:
            return []
        if "snippets" not in st.content:
            # The content listing is then [] on every node although the script runs
            # (PVE::Storage::volume_list lists only the storage's content types): no
            # listing can say it is missing.
            return []
        out = []
        for node in sorted(n for n, up in self.online.items() if up):
            key = (node, name)
            if key not in self.present:
                try:
                    self.present[key] = self.api.snippets(node, name)
                except PvecleanError as exc:
                    self.present[key] = str(exc)
            found = self.present[key]
            if isinstance(found, set) and volid in found:
                continue
            why = f" ({found})" if isinstance(found, str) else ""
            out.append(f"CT {c.vmid}: hookscript {volid} is missing on node {node}{why}; "
                       f"storage '{name}' is not shared, so a start there aborts: run pveclean "
                       f"install on {node} or use a shared storage")
        return out


def _grant(api: Api, cfg: Config, c: Container, here: str, majors: frozenset[int],
           e: CtView) -> Grant | None:
    try:
        conf = api.ct_config(c.node, c.vmid)
    except PvecleanError as exc:
        e.error = str(exc)
        return None
    hs = conf.hookscript
    rec = chain.read_record(cfg, c.vmid) if c.node == here else None
    kind = HookKind.NONE if hs is None else HookKind.OTHER
    if is_pveclean(hs):
        kind = HookKind.CHAINED if rec else HookKind.PVECLEAN
    grant = conf.gpu(majors)
    # the GPUs, not the lines that grant them (/dev/nvidiaN, nvidiactl, nvidia-uvm and a
    # devices rule are 4 lines for one GPU); None: every GPU of the host
    return Grant(tuple(grant.lines), hs, kind,
                 None if grant.minors is None else tuple(sorted(grant.minors)),
                 rec[0] if rec and kind is HookKind.CHAINED else None)


def _here(api: Api, cfg: Config, here: str, e: CtView, with_holders: bool) -> None:
    """This node's container: its last report, its live state and its holders."""
    e.report_looked, e.last_report = True, last_report(cfg, e.vmid)
    granted = e.grant is not None and bool(e.grant.lines)
    if granted:
        # /cluster/resources' status comes from pvestatd and lags ~10 s (`unknown` at
        # first): ask this node for the live state before showing holders.
        try:
            e.status = api.ct_status(here, e.vmid)
        except PvecleanError as exc:
            e.state_error = f"cannot read its state: {exc}"
    if with_holders and e.status == "running" and granted:
        holders(cfg, e)


def collect(api: Api, cfg: Config, with_holders: bool = True) -> StatusView:
    here, online = api.local_node(), api.nodes()
    majors = devnodes.nvidia_majors()
    snippets = _Snippets(api, online)
    cts: list[CtView] = []
    warnings: list[str] = []
    for c in api.containers():
        e = CtView(c.vmid, c.node, c.name, c.status, c.lock, c.template)
        cts.append(e)
        if not online.get(c.node, False):
            e.error = f"node {c.node} is offline"
            continue
        e.grant = _grant(api, cfg, c, here, majors, e)
        if e.grant is None:
            continue
        if e.grant.hookscript:
            warnings += snippets.warnings(c, e.grant.hookscript)
        if c.node == here:
            _here(api, cfg, here, e, with_holders)
    for node in api.stale_nodes(online):
        warnings.append(f"node {node}: pvestatd has not reported for 5 minutes (the GUI shows "
                        "its status as unknown); container states from /cluster/resources "
                        "may be old: check 'systemctl status pvestatd' there")
    if with_holders:
        doctor_counts(cfg, [e for e in cts if e.node == here and e.grant and e.grant.lines],
                      warnings)
    conflicts: list[VmConflict] = []
    if with_holders and any(v.node == here for v in api.containers("qemu")):
        conflicts = vm_conflicts(cfg, warnings)
    return StatusView(here, online, tuple(cts), tuple(conflicts), tuple(warnings))


def vm_conflicts(cfg: Config, warnings: list[str]) -> list[VmConflict]:
    """This node has VMs: the GPUs a VM passes through while a container or the host holds
    them, from `pveclean gpus`' map (read in a worker, within deadline_seconds)."""
    from pveclean.commands.gpus import look_once

    try:
        gmap = look_once(cfg, Path(cfg.pci_sysfs) / "devices", cfg.deadline_seconds,
                         "the GPU map")
    except PvecleanError as exc:
        warnings.append(f"VMs' GPUs not checked: {exc}")
        return []
    return list(gmap.vm_conflicts)


def doctor_counts(cfg: Config, here: list[CtView], warnings: list[str]) -> None:
    """doctor's findings per check of this node's GPU containers (configs, nodes, majors,
    libraries; NVML is not asked: no persistence or VM check here)."""
    from pveclean.commands.doctor import counts

    if not here:
        return
    got = counts(cfg, [e.vmid for e in here])
    if isinstance(got, str):
        warnings.append(f"doctor's checks skipped: {got}")
        return
    for e in here:
        e.doctor = got.get(e.vmid, {})
