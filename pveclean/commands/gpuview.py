"""Plain-text views of the host's GPU map: `pveclean gpus` and `pveclean status`.

Every value that a container can influence goes through `text.safe`: escaped, cut, and
measured by displayed width.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from pveclean.commands.table import mib_text as _n
from pveclean.commands.table import table as _table
from pveclean.core.gpumap import GpuMap, GpuProc, GpuUse, VfioGpu, VmConflict, VmName
from pveclean.core.owners import OwnerKind
from pveclean.core.records import more_column
from pveclean.core.text import ljust, safe, width

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.commands.status import CtView, StatusView

LONG = 300  # cut for free-text values on their own line


def _owner(p: GpuProc, hostnames: Mapping[int, str]) -> str:
    label = p.owner.label
    if p.owner.kind is OwnerKind.CT and p.owner.vmid is not None:
        hn = hostnames.get(p.owner.vmid)
        return f"{label} {safe(hn, 20)}" if hn else label
    return label


def _vms(vms: Iterable[VmName]) -> str:
    return ", ".join(f"VM {m.vmid}" + (f" ({safe(m.name, 30)})" if m.name else "") for m in vms)


def _holders_unknown(g: GpuUse) -> bool:
    """NVML could not list this GPU's processes (issue 38: never drawn as holding none)."""
    return not g.ok and (g.status == "lost" or "processes" in g.gpu.unread)


def _gpu_lines(g: GpuUse, hostnames: Mapping[int, str]) -> list[str]:
    res = f", {_n(g.gpu.reserved_mib)} reserved" if g.gpu.reserved_mib is not None else ""
    lines = ["", f"GPU {g.index}  {safe(g.gpu.name, 40)}  {g.pci_bus_id or '?'}  "
                 f"{safe(g.gpu.uuid, 48)}"]
    if not g.ok:  # NVML could not read it all: say so, and only the figures it read
        lines.append(f"  {safe(g.status, 20).upper()}: {safe(g.gpu.reason, LONG)}")
    if g.used_mib is not None:
        lines.append(f"  memory: {_n(g.used_mib)} of {_n(g.total_mib)} MiB used{res}")
    rows: list[tuple[str, ...]] = [("OWNER", "MiB", "HOST PID", "CT PID", "NAME", "UNIT")]
    for r in g.processes:
        p = r.proc
        rows.append((_owner(p, hostnames), _n(r.memory_mib), str(p.host_pid),
                     str(p.ct_pid or "-"), safe(p.name, 20), safe(p.unit or "-", 40)))
    if g.leak_mib:
        rows.append(("LEAK: no process", _n(g.leak_mib), "-", "-", "-", "-"))
    if len(rows) > 1:
        lines += _table(rows, "  ", right={1})
    elif _holders_unknown(g):  # lost, or its process list unread: not judged, not "none"
        lines.append(f"  who holds it cannot be told: the GPU is {safe(g.status, 20)}")
    else:
        lines.append("  no process holds this GPU")
    share = [f"{safe(o.label, 30)} " + (f"{_n(v)} MiB" if v else "nodes only")
             for o, v in g.by_owner]
    if g.leak_mib:
        share.append(f"leak {_n(g.leak_mib)} MiB (`pveclean reset {g.index}` frees it "
                     "where safe)")
    elif g.unaccounted_mib is None and g.processes:
        share.append("unaccounted memory unknown (NVML gives no per-process figure)")
    if share:
        lines.append("  by owner: " + ", ".join(share))
    return lines


def _vfio_line(v: VfioGpu) -> str:
    vms = _vms(v.vms)
    if v.driver == "vfio-pci":
        who = f"passed to {vms}" if vms else "bound to vfio-pci, named in no VM config"
    else:
        who = f"driver {safe(v.driver, 20)}" if v.driver else "no driver bound"
    return f"  {v.pci_bus_id}  NVIDIA {v.device}  {who}"


def render_gpus(gmap: GpuMap) -> str:
    hostnames = gmap.hostnames
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(gmap.time))
    lines = [f"GPUs of {safe(gmap.host, 40)} at {at} UTC: "
             f"{len(gmap.gpus)} GPU(s) on the nvidia driver, {len(gmap.vfio)} other"]
    for g in gmap.gpus:
        lines += _gpu_lines(g, hostnames)
    if gmap.other_holders:
        lines += ["", "Holding GPU nodes but no single GPU (nvidiactl, nvidia-uvm...):"]
        rows = [("OWNER", "HOST PID", "CT PID", "NAME", "UNIT", "DEVICES")]
        for p in gmap.other_holders:
            devs = ",".join([*(d.word for d in p.devices), *more_column(p.devices_more)]) or "-"
            rows.append((_owner(p, hostnames), str(p.host_pid), str(p.ct_pid or "-"),
                         safe(p.name, 20), safe(p.unit or "-", 40), safe(devs, 40)))
        lines += _table(rows, "  ")
    lines += not_judged_lines(gmap)
    if gmap.vfio:
        lines += ["", "NVIDIA GPUs not on the nvidia driver (NVML does not see them):"]
        lines += [_vfio_line(v) for v in gmap.vfio]
    lines += vm_conflict_lines(gmap.vm_conflicts)
    s = gmap.scan
    lines += ["", f"scanned {len(s.containers_scanned)} container(s) with GPU access "
                  f"(skipped {len(s.containers_skipped_no_gpu)} without) and the host's "
                  f"processes in {s.seconds * 1000:.0f} ms; NVML: {gmap.nvml}"]
    lines += [f"warning: {safe(w, 300)}" for w in gmap.warnings]
    return "\n".join(lines)


def not_judged_lines(gmap: GpuMap) -> list[str]:
    """What the look could not read whole: what it holds cannot be told (a VM's start is
    refused while any is)."""
    if not gmap.not_judged:
        return []
    rows = [("OWNER", "HOST PID", "WHAT", "WHY")]
    rows += [(n.owner.label, str(n.host_pid or "-"), safe(n.what, 30), safe(n.why, 80))
             for n in gmap.not_judged]
    return ["", "NOT JUDGED (could not be read whole; a VM's start is refused while any is):",
            *_table(rows, "  ")]


def vm_conflict_lines(rows: Iterable[VmConflict]) -> list[str]:
    """GPUs a VM's config passes through while a container or the host holds them."""
    rows = list(rows)
    if not rows:
        return []
    out = ["", "GPUs a VM passes through, held here now:"]
    for c in rows:
        held = [f"CT {v}" for v in c.containers]
        held += [f"{c.host_holders} host process(es)"] if c.host_holders else []
        out.append(f"  GPU {c.gpu} ({c.pci_bus_id}): passed to {_vms(c.vms)}, held by "
                   f"{', '.join(held)}; at the VM's start pveclean's VM hook would "
                   f"{safe(c.next_vm_start, 80)}")
    return out


def gpu_count(e: CtView) -> str:
    """A status row's GPU column: how many host GPUs the config grants ("all": a whole /dev
    or LXC's nvidia hook)."""
    if e.grant is None:
        return "?"
    if e.grant.gpus is None:
        return "all" if e.grant.lines else "0"
    return str(len(e.grant.gpus))


def _last(e: CtView) -> str:
    rep = e.last_report
    if rep is not None and rep.verdict:
        return f"{rep.verdict} {rep.start} {rep.phase}"
    return rep.error if rep is not None and rep.error is not None else "-"


def _detail(e: CtView) -> list[str]:
    detail = []
    g = e.grant
    if g is not None and g.hookscript:
        detail.append(f"  hookscript: {g.hookscript}"
                      + (f" (chained: {g.chained})" if g.chained else ""))
    detail += [f"  gpu config: {line}" for line in (g.lines if g is not None else ())]
    for h in e.holders or ():
        mib = ", ".join(f"GPU {i}: {m if m is not None else '?'} MiB"
                        for i, m in sorted(h.gpu_memory_mib.items())) or "no GPU memory"
        unit = f" in {safe(h.unit, 64)}" if h.unit else ""
        detail.append(f"  holder: PID {h.host_pid} {safe(h.name, 16)}{unit} ({mib})")
    for key, text in (("error", e.error), ("holders error", e.problem)):
        if text:
            detail.append(f"  {key}: {safe(text, 300)}")
    return detail


def render_status(view: StatusView) -> str:
    nodes = ", ".join(f"{n} ({'online' if up else 'OFFLINE'})"
                      for n, up in sorted(view.nodes.items()))
    lines = [f"this node: {view.node}; nodes: {nodes}", ""]
    rows = [("VMID", "NODE", "STATUS", "GPU", "HOOK", "HOLDERS", "GPU MiB", "LAST REPORT")]
    for e in view.containers:
        held = e.holders
        rows.append((str(e.vmid), e.node, e.status + (f" ({e.lock})" if e.lock else ""),
                     gpu_count(e),
                     str(e.grant.hook) if e.grant is not None else "?",
                     str(len(held)) if held is not None else "-",
                     str(e.gpu_memory_mib) if held is not None else "-",
                     _last(e) if e.node == view.node else "-"))
    cells = [[safe(v, 60) for v in r] for r in rows]
    widths = [max(width(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines += ["  ".join(ljust(v, w) for v, w in zip(r, widths, strict=True)).rstrip()
              for r in cells]
    for e in view.containers:
        detail = _detail(e)
        if detail:
            lines += ["", f"CT {e.vmid} {e.name}".rstrip(), *detail]
    lines += vm_conflict_lines(view.vm_conflicts)
    lines += [f"doctor: CT {e.vmid}: " + ", ".join(f"{k} {n}" for k, n in sorted(e.doctor.items()))
              + f" (pveclean doctor {e.vmid})" for e in view.containers if e.doctor]
    lines += [f"warning: {safe(w, 300)}" for w in view.warnings]
    return "\n".join(lines)
