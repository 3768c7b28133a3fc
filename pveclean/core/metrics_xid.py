"""The Xid reader's counts as Prometheus samples, pure: `pveclean_gpu_xid_total` by node,
GPU (NVML's index, or the driver's PCI id for a GPU NVML does not list now), UUID, owner
(`id` as prometheus-pve-exporter writes it: lxc/VMID, node/NAME, unknown), Xid number and
the action NVIDIA's catalog gives it (core/xid.Action: app, reset, reboot, none, support,
unlisted), plus the kernel log's records lost and unparsed Xid messages."""

from __future__ import annotations

from collections.abc import Iterable

from pveclean.core.gpumap import GpuUse
from pveclean.core.metrics import Family, guest_id
from pveclean.core.owners import Owner, OwnerKind
from pveclean.core.pci import PciAddress
from pveclean.core.xidlog import XidLog

FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "pveclean_gpu_xid_total": ("counter", "Xids the NVIDIA driver logged, by GPU, the owner of "
                               "the process it named (id), Xid and the action NVIDIA's Xid "
                               "catalog gives it (app, reset, reboot, none, support, "
                               "unlisted).", ("node", "gpu", "UUID", "id", "xid", "action")),
    "pveclean_xid_unparsed": ("gauge", "Kernel messages kept that name an Xid but are not the "
                              "driver's line (see pveclean gpus).", ("node",)),
    "pveclean_xid_records_lost_total": ("counter", "Kernel log records dropped before the Xid "
                                        "reader read them.", ("node",)),
}


def owner_id(who: Owner, node: str) -> str:
    if who.kind is OwnerKind.CT and who.vmid is not None:
        return guest_id(who.vmid)
    if who.kind is OwnerKind.HOST:
        return guest_id(node, "node")
    return "unknown"


def gpu_of(pci: str, gpus: Iterable[GpuUse]) -> tuple[str, str]:
    """(gpu, UUID) of the GPU at the driver's `0000:01:00`: NVML's index and UUID, else the
    PCI id and no UUID."""
    addr = PciAddress.parse(pci)
    for g in gpus:
        if addr is not None and g.pci_bus_id is not None and addr.covers(g.pci_bus_id):
            return str(g.index), g.gpu.uuid or ""
    return pci, ""


def families(log: XidLog, gpus: Iterable[GpuUse], node: str) -> list[Family]:
    fams = {n: Family(n, kind, hlp, labels) for n, (kind, hlp, labels) in FAMILIES.items()}
    listed = list(gpus)
    for (pci, who, xid, action), n in sorted(log.counts.items(), key=str):
        gpu, uuid = gpu_of(pci, listed)
        fams["pveclean_gpu_xid_total"].add(n, node, gpu, uuid, owner_id(who, node), xid,
                                           str(action))
    if log.unparsed:  # a family without samples is left out: nothing to say, no series
        fams["pveclean_xid_unparsed"].set(len(log.unparsed), node)
    if log.lost:
        fams["pveclean_xid_records_lost_total"].set(log.lost, node)
    return list(fams.values())
