"""`pveclean status`: every container of the cluster (through the API) with its GPU config
and hookscript; this node's also with their current GPU holders and their last report."""

from __future__ import annotations

from pathlib import Path

from pveclean.cleanup import RunOptions, clean
from pveclean.core.config import Config
from pveclean.errors import PvecleanError
from pveclean.host import devnodes, reportfiles
from pveclean.host.prelude import NvmlWorker
from pveclean.proxmox import chain
from pveclean.proxmox.hookscript import is_pveclean
from pveclean.proxmox.pveapi import Api, Container, Storage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def last_report(cfg: Config, vmid: int) -> dict[str, Any] | None:
    paths = reportfiles.list_reports(cfg.report_dir, vmid)
    if not paths:
        return None
    try:
        rep = reportfiles.load(paths[-1])
    except Exception as exc:  # a broken file (OSError, ReportError, anything) is shown, not fatal
        return {"path": str(paths[-1]), "error": f"unreadable: {type(exc).__name__}"}
    return {"path": str(paths[-1]), "verdict": rep.get("verdict"), "phase": rep.get("phase"),
            "start": rep.get("start")}


def holders(cfg: Config, vmid: int) -> dict[str, Any]:
    """Current GPU holders of a container on this node (a dry run: nothing is signalled)."""
    try:
        with NvmlWorker() as nvml:  # each container's run its own, as its count of kills
            rep = clean(vmid, cfg, nvml.warm(cfg, vmid), RunOptions(phase="status", dry_run=True,
                        write_report=False)).report
    except PvecleanError as exc:
        return {"holders_error": str(exc)}
    hs = [{"host_pid": h.host_pid, "ct_pid": h.ct_pid, "name": h.name, "unit": h.unit,
           "gpu_memory_mib": {int(k): v for k, v in sorted(h.gpu_memory_mib.items())},
           "devices": h.devices}
          for h in rep.holders]
    mib = sum(m or 0 for h in rep.holders for m in h.gpu_memory_mib.values())
    out: dict[str, Any] = {"holders": hs, "gpu_memory_mib": mib}
    if rep.busy:
        out["holders_error"] = "busy: another pveclean run holds this container"
    return out


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


def collect(api: Api, cfg: Config, with_holders: bool = True) -> dict[str, Any]:
    here, online = api.local_node(), api.nodes()
    majors = devnodes.nvidia_majors()
    snippets = _Snippets(api, online)
    cts: list[dict[str, Any]] = []
    warnings: list[str] = []
    for c in api.containers():
        e: dict[str, Any] = {"vmid": c.vmid, "node": c.node, "name": c.name,
                             "status": c.status, "lock": c.lock, "template": c.template}
        cts.append(e)
        if not online.get(c.node, False):
            e["error"] = f"node {c.node} is offline"
            continue
        try:
            conf = api.ct_config(c.node, c.vmid)
        except PvecleanError as exc:
            e["error"] = str(exc)
            continue
        hs = conf.hookscript
        rec = chain.read_record(cfg, c.vmid) if c.node == here else None
        kind = "none" if hs is None else "other"
        if is_pveclean(hs):
            kind = "chained" if rec else "pveclean"
        grant = conf.gpu(majors)
        # the GPUs, not the lines that grant them (/dev/nvidiaN, nvidiactl, nvidia-uvm and a
        # devices rule are 4 lines for one GPU); None: every GPU of the host
        e.update(gpu=list(grant.lines), hookscript=hs, hook=kind,
                 gpus=None if grant.minors is None else sorted(grant.minors),
                 chained=rec[0] if rec and kind == "chained" else None)
        if hs:
            warnings += snippets.warnings(c, hs)
        if c.node != here:
            continue
        e["last_report"] = last_report(cfg, c.vmid)
        if e["gpu"]:
            # /cluster/resources' status comes from pvestatd and lags ~10 s (`unknown` at
            # first): ask this node for the live state before showing holders.
            try:
                e["status"] = api.ct_status(here, c.vmid)
            except PvecleanError as exc:
                e["holders_error"] = f"cannot read its state: {exc}"
        if with_holders and e["status"] == "running" and e["gpu"]:
            e.update(holders(cfg, c.vmid))
    for node in api.stale_nodes(online):
        warnings.append(f"node {node}: pvestatd has not reported for 5 minutes (the GUI shows "
                        "its status as unknown); container states from /cluster/resources "
                        "may be old: check 'systemctl status pvestatd' there")
    conflicts: list[dict[str, Any]] = []
    if with_holders and any(v.node == here for v in api.containers("qemu")):
        conflicts = vm_conflicts(cfg, warnings)
    return {"node": here, "nodes": online, "containers": cts, "vm_conflicts": conflicts,
            "warnings": warnings}


def vm_conflicts(cfg: Config, warnings: list[str]) -> list[dict[str, Any]]:
    """This node has VMs: the GPUs a VM passes through while a container or the host holds
    them, from `pveclean gpus`' map (read in a worker, within deadline_seconds)."""
    from pveclean.commands.gpus import look_once

    try:
        data = look_once(cfg, Path(cfg.pci_sysfs) / "devices", cfg.deadline_seconds,
                         "the GPU map")
    except PvecleanError as exc:
        warnings.append(f"VMs' GPUs not checked: {exc}")
        return []
    rows: list[dict[str, Any]] = data.get("vm_conflicts") or []
    return rows
