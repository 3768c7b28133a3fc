"""Plain-text views of the host's GPU map: `pveclean gpus` and `pveclean status`.

Every value that a container can influence goes through `text.safe`: escaped, cut, and
measured by displayed width.
"""

from __future__ import annotations

from pveclean.commands.table import mib_text as _n
from pveclean.commands.table import table as _table
from pveclean.core.gpumap import owner_label
from pveclean.core.text import ljust, safe, width

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LONG = 300  # cut for free-text values on their own line


def _owner(p: dict[str, Any], hostnames: dict[str, Any]) -> str:
    label = owner_label(p)
    if p["owner"] == "ct":
        hn = (hostnames.get(str(p["vmid"])) or {}).get("hostname")
        return f"{label} {safe(hn, 20)}" if hn else label
    return label


def render_gpus(data: dict[str, Any]) -> str:
    hostnames = data.get("containers", {})
    n_gpus = len(data["gpus"])
    lines = [f"GPUs of {safe(data['host'], 40)} at {data['time'][:19].replace('T', ' ')} UTC: "
             f"{n_gpus} GPU(s) on the nvidia driver, {len(data['vfio'])} other"]
    for g in data["gpus"]:
        res = f", {_n(g['reserved_mib'])} reserved" if g["reserved_mib"] is not None else ""
        lines += ["", f"GPU {g['index']}  {safe(g['name'], 40)}  {g['pci_bus_id'] or '?'}  "
                      f"{safe(g['uuid'], 48)}"]
        if g.get("status", "ok") != "ok":  # NVML could not read it: say so, no figures
            lines.append(f"  {safe(g['status'], 20).upper()}: {safe(g.get('reason'), LONG)}")
        else:
            lines.append(f"  memory: {_n(g['used_mib'])} of {_n(g['total_mib'])} MiB used{res}")
        rows: list[tuple[str, ...]] = [("OWNER", "MiB", "HOST PID", "CT PID", "NAME", "UNIT")]
        for p in g["processes"]:
            rows.append((_owner(p, hostnames), _n(p["memory_mib"]), str(p["host_pid"]),
                         str(p["ct_pid"] or "-"), safe(p["name"], 20),
                         safe(p["unit"] or "-", 40)))
        if g["leak_mib"]:
            rows.append(("LEAK: no process", _n(g["leak_mib"]), "-", "-", "-", "-"))
        if len(rows) > 1:
            lines += _table(rows, "  ", right={1})
        else:
            lines.append("  no process holds this GPU")
        share = [f"{safe(k, 30)} " + (f"{_n(v)} MiB" if v else "nodes only")
                 for k, v in g["by_owner_mib"].items()]
        if g["leak_mib"]:
            share.append(f"leak {_n(g['leak_mib'])} MiB (reset with nvidia-smi -r -i "
                         f"{g['index']} once nothing uses it)")
        elif g["unaccounted_mib"] is None and g["processes"]:
            share.append("unaccounted memory unknown (NVML gives no per-process figure)")
        if share:
            lines.append("  by owner: " + ", ".join(share))
    if data["other_holders"]:
        lines += ["", "Holding GPU nodes but no single GPU (nvidiactl, nvidia-uvm...):"]
        rows = [("OWNER", "HOST PID", "CT PID", "NAME", "UNIT", "DEVICES")]
        for p in data["other_holders"]:
            devs = ",".join(d.split(" ")[0] for d in p["devices"]) or "-"
            rows.append((_owner(p, hostnames), str(p["host_pid"]), str(p["ct_pid"] or "-"),
                         safe(p["name"], 20), safe(p["unit"] or "-", 40), safe(devs, 40)))
        lines += _table(rows, "  ")
    if data["vfio"]:
        lines += ["", "NVIDIA GPUs not on the nvidia driver (NVML does not see them):"]
        for v in data["vfio"]:
            vms = ", ".join(f"VM {m['vmid']}" + (f" ({safe(m['name'], 30)})" if m["name"] else "")
                            for m in v["vms"])
            if v["driver"] == "vfio-pci":
                who = f"passed to {vms}" if vms else "bound to vfio-pci, named in no VM config"
            else:
                who = f"driver {safe(v['driver'], 20)}" if v["driver"] else "no driver bound"
            lines.append(f"  {v['pci_bus_id']}  NVIDIA {v['device']}  {who}")
    lines += vm_conflict_lines(data.get("vm_conflicts") or [])
    s = data["scan"]
    lines += ["", f"scanned {len(s['containers_scanned'])} container(s) with GPU access "
                  f"(skipped {len(s['containers_skipped_no_gpu'])} without) and the host's "
                  f"processes in {s['seconds'] * 1000:.0f} ms; NVML: {data['sources']['nvml']}"]
    lines += [f"warning: {safe(w, 300)}" for w in data["warnings"]]
    return "\n".join(lines)


def vm_conflict_lines(rows: list[dict[str, Any]]) -> list[str]:
    """GPUs a VM's config passes through while a container or the host holds them."""
    if not rows:
        return []
    out = ["", "GPUs a VM passes through, held here now:"]
    for c in rows:
        vms = ", ".join(f"VM {m['vmid']}" + (f" ({safe(m['name'], 30)})" if m["name"] else "")
                        for m in c["vms"])
        held = [f"CT {v}" for v in c["containers"]]
        held += [f"{c['host_holders']} host process(es)"] if c["host_holders"] else []
        out.append(f"  GPU {c['gpu']} ({c['pci_bus_id']}): passed to {vms}, held by "
                   f"{', '.join(held)}; at the VM's start pveclean's VM hook would "
                   f"{safe(c['next_vm_start'], 80)}")
    return out


def gpu_count(e: dict[str, Any]) -> str:
    """A status row's GPU column: how many host GPUs the config grants ("all": a whole /dev
    or LXC's nvidia hook)."""
    if "gpu" not in e:
        return "?"
    if e.get("gpus") is None:
        return "all" if e["gpu"] else "0"
    return str(len(e["gpus"]))


def render_status(data: dict[str, Any]) -> str:
    nodes = ", ".join(f"{n} ({'online' if up else 'OFFLINE'})"
                      for n, up in sorted(data["nodes"].items()))
    lines = [f"this node: {data['node']}; nodes: {nodes}", ""]
    rows = [("VMID", "NODE", "STATUS", "GPU", "HOOK", "HOLDERS", "GPU MiB", "LAST REPORT")]
    for e in data["containers"]:
        rep = e.get("last_report") or {}
        last = (f"{rep.get('verdict')} {rep.get('start')} {rep.get('phase')}"
                if rep.get("verdict") else rep.get("error", "-"))
        held = e.get("holders")
        rows.append((str(e["vmid"]), e["node"], e["status"] + (f" ({e['lock']})" if e["lock"]
                                                                else ""),
                     gpu_count(e),
                     e.get("hook", "?"),
                     str(len(held)) if held is not None else "-",
                     str(e["gpu_memory_mib"]) if "gpu_memory_mib" in e else "-",
                     last if e["node"] == data["node"] else "-"))
    cells = [[safe(v, 60) for v in r] for r in rows]
    widths = [max(width(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines += ["  ".join(ljust(v, w) for v, w in zip(r, widths, strict=True)).rstrip()
              for r in cells]
    for e in data["containers"]:
        detail = []
        if e.get("hookscript"):
            detail.append(f"  hookscript: {e['hookscript']}"
                          + (f" (chained: {e['chained']})" if e.get("chained") else ""))
        detail += [f"  gpu config: {g}" for g in e.get("gpu") or []]
        for h in e.get("holders") or []:
            mib = ", ".join(f"GPU {g}: {m if m is not None else '?'} MiB"
                            for g, m in sorted(h["gpu_memory_mib"].items())) or "no GPU memory"
            unit = f" in {safe(h['unit'], 64)}" if h.get("unit") else ""
            detail.append(f"  holder: PID {h['host_pid']} {safe(h['name'], 16)}{unit} ({mib})")
        for key in ("error", "holders_error"):
            if e.get(key):
                detail.append(f"  {key.replace('_', ' ')}: {safe(e[key], 300)}")
        if detail:
            lines += ["", f"CT {e['vmid']} {e['name']}".rstrip(), *detail]
    lines += vm_conflict_lines(data.get("vm_conflicts") or [])
    lines += [f"warning: {safe(w, 300)}" for w in data["warnings"]]
    return "\n".join(lines)
