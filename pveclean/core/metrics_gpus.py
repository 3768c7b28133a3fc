"""`pveclean gpus`' map as Prometheus samples, pure: per node, GPU and owner the memory held
and the holders, the memory no live process accounts for, the GPUs on vfio-pci and the VMs
whose hostpci lines name a GPU, and whether each container is running.

Labels join with the exporters a Proxmox cluster already runs: `id` as
prometheus-pve-exporter writes it (`lxc/129`, `qemu/102`; `node/<name>` for the host's own
processes), so `* on(id) group_left(name) pve_guest_info` names the guest; `UUID` and
`pci_bus_id` as NVIDIA's dcgm-exporter writes them (`GPU-...`, `00000000:01:00.0`), so a join
with `DCGM_FI_DEV_FB_USED` on `UUID` works unchanged."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pveclean.core.gpumap import GpuMap
from pveclean.core.metrics import MIB, Family, guest_id
from pveclean.core.owners import Owner, OwnerKind
from pveclean.core.pci import HostPci, PciAddress
from pveclean.core.records import SourceState

NVML_ANSWERED = frozenset({SourceState.OK, SourceState.PARTIAL})

GPU = ("node", "gpu", "UUID", "pci_bus_id")
OWNER = (*GPU, "owner_type", "id")
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "pveclean_gpu_info": ("gauge", "1 for each GPU NVML lists, with its model.",
                          (*GPU, "model")),
    "pveclean_gpu_memory_total_bytes": ("gauge", "GPU memory in all.", GPU),
    "pveclean_gpu_memory_used_bytes": ("gauge", "GPU memory in use, as NVML counts it.", GPU),
    "pveclean_gpu_memory_bytes": ("gauge", "GPU memory held by an owner's processes (id: "
                                  "lxc/VMID, qemu/VMID or node/NAME).", OWNER),
    "pveclean_gpu_holders": ("gauge", "Processes of an owner that hold the GPU's device node "
                             "or memory.", OWNER),
    "pveclean_gpu_unaccounted_memory_bytes": ("gauge", "GPU memory in use that no live "
                                              "process accounts for (a leak, beyond "
                                              "allocator slack).", GPU),
    "pveclean_gpu_vfio": ("gauge", "1 for an NVIDIA GPU not on the nvidia driver (vfio-pci: "
                          "passed to a VM), by driver.", ("node", "pci_bus_id", "driver")),
    "pveclean_gpu_vm_assigned": ("gauge", "1 for a GPU a VM's hostpci line names (id: "
                                 "qemu/VMID); the VM cannot start while anything holds it.",
                                 ("node", "pci_bus_id", "id")),
    "pveclean_container_running": ("gauge", "1 when the container's monitor runs, 0 when "
                                   "it is stopped, for containers with a cgroup or a GPU "
                                   "holder.", ("node", "id")),
    "pveclean_gpus_up": ("gauge", "1 when the last look at the host finished within its "
                         "deadline, 0 when it did not (the map is then left out).", ("node",)),
    "pveclean_gpus_last_success_timestamp_seconds": ("gauge", "When the map was last read "
                                                     "whole (Unix time).", ("node",)),
    "pveclean_gpus_collect_duration_seconds": ("gauge", "How long the last look took.",
                                               ("node",)),
    "pveclean_gpus_warnings": ("gauge", "Warnings of the last look (see pveclean gpus).",
                               ("node",)),
    # issue 38: a leak is only what NVML positively shows
    "pveclean_gpu_nvml_ok": ("gauge", "1 when NVML answered for the GPU (its memory and "
                             "process list), 0 when not (lost, failed, hung): its memory is "
                             "then not judged and no unaccounted series is written.", GPU),
    "pveclean_gpus_nvml_up": ("gauge", "1 when NVML answered the last look (if only in part), "
                              "0 when it could not be used at all.", ("node",)),
}


def dcgm_bus_id(address: PciAddress | None) -> str:
    """The `pci_bus_id` label as NVML and dcgm-exporter write it: `00000000:01:00.0`."""
    return "" if address is None else address.nvml


def owner(who: Owner, node: str) -> tuple[str, str]:
    """(owner_type, id) of a process of `pveclean gpus`' map."""
    if who.kind is OwnerKind.CT and who.vmid is not None:
        return "lxc", guest_id(who.vmid)
    if who.kind is OwnerKind.HOST:
        return "node", guest_id(node, "node")
    return "unknown", "unknown"


def families(gmap: GpuMap, node: str, running: Mapping[int, bool],
             vm_refs: Iterable[HostPci], now: float) -> list[Family]:
    """The samples of one look. `running`: VMID -> whether the container runs; `vm_refs`:
    each id of every VM's hostpci lines."""
    fams = {n: Family(n, kind, hlp, labels) for n, (kind, hlp, labels) in FAMILIES.items()}
    refs = list(vm_refs)
    addresses: list[PciAddress] = []
    for g in gmap.gpus:
        bus = g.pci_bus_id
        gpu = (node, g.index, g.gpu.uuid or "", dcgm_bus_id(bus))
        fams["pveclean_gpu_info"].set(1, *gpu, g.gpu.name or "")
        if g.total_mib is not None:
            fams["pveclean_gpu_memory_total_bytes"].set(g.total_mib * MIB, *gpu)
        if g.used_mib is not None:
            fams["pveclean_gpu_memory_used_bytes"].set(g.used_mib * MIB, *gpu)
        if g.unaccounted_mib is not None:
            fams["pveclean_gpu_unaccounted_memory_bytes"].set(g.unaccounted_mib * MIB, *gpu)
        fams["pveclean_gpu_nvml_ok"].set(1 if g.gpu.ok else 0, *gpu)
        for p in g.processes:
            who = owner(p.owner, node)
            fams["pveclean_gpu_holders"].add(1, *gpu, *who)
            fams["pveclean_gpu_memory_bytes"].add((p.memory_mib or 0) * MIB, *gpu, *who)
        if bus is not None:
            addresses.append(bus)
    for v in gmap.vfio:
        fams["pveclean_gpu_vfio"].set(1, node, dcgm_bus_id(v.pci_bus_id), v.driver or "none")
        addresses.append(v.pci_bus_id)
    for addr in dict.fromkeys(addresses):
        for ref in refs:
            if ref.address.covers(addr):
                fams["pveclean_gpu_vm_assigned"].set(1, node, dcgm_bus_id(addr),
                                                     guest_id(ref.vmid, "qemu"))
    for vmid, up in sorted(running.items()):
        fams["pveclean_container_running"].set(1 if up else 0, node, guest_id(vmid))
    fams["pveclean_gpus_nvml_up"].set(1 if gmap.nvml.state in NVML_ANSWERED else 0, node)
    status(fams, node, True, now, gmap.scan.seconds, len(gmap.warnings))
    return list(fams.values())


def status(fams: dict[str, Family], node: str, up: bool, last_ok: float | None,
           seconds: float | None, warnings: int) -> None:
    fams["pveclean_gpus_up"].set(1 if up else 0, node)
    if last_ok is not None:
        fams["pveclean_gpus_last_success_timestamp_seconds"].set(float(round(last_ok)), node)
    if seconds is not None:
        fams["pveclean_gpus_collect_duration_seconds"].set(float(seconds), node)
    fams["pveclean_gpus_warnings"].set(warnings, node)


def failed(node: str, seconds: float, last_ok: float | None) -> list[Family]:
    """A look that did not finish: no map (an old one would be shown as current), the
    status, and when the map was last read whole (from the file it replaces)."""
    fams = {n: Family(n, kind, hlp, labels) for n, (kind, hlp, labels) in FAMILIES.items()}
    status(fams, node, False, last_ok, seconds, 1)
    return list(fams.values())


def last_success(old: Iterable[tuple[str, dict[str, str], float]]) -> float | None:
    return next((v for name, _l, v in old
                 if name == "pveclean_gpus_last_success_timestamp_seconds"), None)


def job_map(gmap: GpuMap) -> dict[str, list[str]]:
    """dcgm-exporter's HPC job mapping (--hpc-job-mapping-dir): per GPU index the guests
    whose processes hold it, one per line in a file named by the index, so that its own
    series carry `hpc_job="lxc/129"`. GPUs no guest holds are left out."""
    out: dict[str, list[str]] = {}
    for g in gmap.gpus:
        ids = sorted({guest_id(p.owner.vmid) for p in g.processes
                      if p.owner.kind is OwnerKind.CT and p.owner.vmid is not None})
        if ids:
            out[str(g.index)] = ids
    return out
