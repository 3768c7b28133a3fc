"""Plain-text rendering of reports for terminals and task logs.

Every value that a container can influence (names, command lines, paths, cgroups, warnings
quoting them) goes through `text.safe`: escaped, cut, and measured by displayed width.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pveclean.core.gpumap import owner_label
from pveclean.core.text import ljust, safe, width
from pveclean.core.verdicts import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# ---- the terminal view --------------------------------------------------------------------
def _n(mib: int | None) -> str:
    """A MiB figure as every command prints it: digits only (18000), as in reports."""
    return "-" if mib is None else str(mib)


def _table(rows: Sequence[tuple[str, ...]], indent: str = "",
           right: Collection[int] = ()) -> list[str]:
    """Columns two spaces apart, each as wide as its widest cell in displayed columns (a wide
    character takes two); the columns in `right` aligned right; no trailing spaces."""
    widths = [max(width(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(" " * (w - width(c)) + c if i in right else ljust(c, w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]


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


LONG = 300  # cut for free-text values (cmdline, warnings) on their own line


def command_line(value: object) -> str:
    """A report's `cmdline` for humans: its arguments joined by spaces (a report keeps the
    list; one written before it was a list is a string already)."""
    if isinstance(value, list | tuple):
        return " ".join(map(str, value))
    return "" if value is None else str(value)


def _mib(h: dict[str, Any]) -> str:
    vals = [v for v in (h.get("gpu_memory_mib") or {}).values() if v is not None]
    return str(sum(vals)) if vals else "-"


def short_node(path: str) -> str:
    """A held node as the table shows it: NVIDIA's by what follows /dev/nvidia (`0`, `ctl`,
    `uvm`, `caps/nvidia-cap1`), any other path whole (the report has every path)."""
    rest = path.removeprefix("/dev/nvidia")
    if rest == path or not rest:
        return path
    return rest.lstrip("-")


def holders_table(rep: dict[str, Any]) -> list[str]:
    rows = [("HOST PID", "CT PID", "NAME", "UNIT", "GPU MiB", "DEVICES", "OUTCOME", "SIGNALS")]
    for h in rep.get("holders", []):
        devs = ",".join(short_node(d.split(" ")[0]) for d in h.get("devices", [])) or "-"
        sigs = ",".join(s.split(" ")[0].removeprefix("SIG") for s in h.get("signals", [])
                        if s.startswith("SIG"))
        outcome = str(h.get("outcome"))
        if h.get("protected"):
            outcome += f" ({h['protected']})"
        rows.append((
            safe(h["host_pid"], 12),
            safe(h.get("ct_pid") or "-", 12),
            safe(h.get("name"), 16),
            safe(h.get("unit") or "-", 32),
            safe(_mib(h), 12),
            safe(devs, 40),
            safe(outcome, 80),
            safe(sigs or "-", 40),
        ))
    return _table(rows, "  ")


def summary_line(rep: dict[str, Any]) -> str:
    s = rep.get("summary", {})
    verdict = rep.get("verdict")
    n = s.get("holders", 0)
    stopped = s.get("stopped", 0)
    head = f"CT {safe(rep['vmid'], 20)} {safe(rep['phase'], 20)}"
    if verdict == Verdict.NOTHING_TO_DO:
        return f"{head}: no GPU holders ({rep['duration_s']:.2f} s)"
    if verdict == Verdict.BUSY:
        return f"{head}: busy: {safe('; '.join(rep.get('errors', [])), LONG)}"
    if verdict == Verdict.DRY_RUN:
        return f"{head}: dry run, {n} GPU holder(s) would be stopped, nothing signalled"
    freed = s.get("freed_mib", 0)
    text = f"{head}: stopped {stopped} of {n} GPU holder(s) ({freed} MiB freed) in " \
           f"{rep['duration_s']:.2f} s, verdict {safe(verdict, 20)}"
    if s.get("units_stopped"):
        text += f"; units stopped first: {safe(', '.join(s['units_stopped']), 120)}"
    return text


def memory_lines(rep: dict[str, Any]) -> list[str]:
    out = []
    for g in rep.get("gpus", []):
        after, before = g.get("used_after_mib"), g.get("used_before_mib")
        out.append(
            f"  GPU {g['index']} {safe(g['name'], 40)}: used "
            f"{before if before is not None else '?'} -> "
            f"{after if after is not None else '?'} MiB of {g['total_mib'] or '?'}"
            + (f" ({safe(g['status'], 20)}: {safe(g.get('reason'), LONG)})"
               if g.get("status") else ""))
    return out


def unit_lines(rep: dict[str, Any]) -> list[str]:
    """What --stop-units did per unit, and the commands that stop units still at work."""
    out = []
    stops = rep.get("unit_stops") or {}
    for u in stops.get("units", []):
        left = u.get("processes_left")
        out.append(f"  unit {safe(u.get('unit'), 64)}: {u.get('action')}"
                   + (f" ({safe(u.get('detail'), 200)})" if u.get("detail") else "")
                   + (f", {left} process(es) left" if left else ""))
    if stops.get("note"):
        out.append(f"units: {safe(stops['note'], 300)}")
    out += [f"hint: {safe(h, 300)}" for h in rep.get("hints", [])]
    return out


def render_run(rep: dict[str, Any]) -> str:
    lines = [summary_line(rep)]
    if rep.get("holders"):
        lines += holders_table(rep)
    lines += memory_lines(rep)
    lines += unit_lines(rep)
    for w in rep.get("warnings", []):
        lines.append(f"warning: {safe(w, LONG)}")
    for e in rep.get("errors", []):
        lines.append(f"error: {safe(e, LONG)}")
    for n in rep.get("notify_errors") or []:  # the run's syslog/journal line or metrics
        lines.append(f"not said: {safe(n, LONG)}")
    return "\n".join(lines)


def reports_table(reps: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per past run: time, vmid, phase, verdict, stopped, MiB freed, duration."""
    rows = [("TIME (UTC)", "VMID", "PHASE", "VERDICT", "STOPPED", "MIB FREED", "SECONDS",
             "REPORT")]
    for name, r in reps:
        s = r.get("summary") or {}
        rows.append((
            safe(str(r.get("start", "?"))[:19].replace("T", " "), 19),
            safe(r.get("vmid", "?"), 12),
            safe(r.get("phase", "?"), 12),
            safe(r.get("verdict", "?"), 16),
            safe(f"{s.get('stopped', 0)}/{s.get('holders', 0)}", 16),
            safe(s.get("freed_mib", 0), 12),
            f"{float(r.get('duration_s', 0)):.2f}",
            safe(name, 80),
        ))
    return _table(rows)


def render_report(r: dict[str, Any]) -> str:
    """A whole report, readably: the run's summary, holders, memory, sources, problems."""
    lines = [render_run(r), ""]
    lines.append(f"started {safe(r.get('start'), 40)} on {safe(r.get('host'), 64)}, "
                 f"pveclean {safe(r.get('pveclean'), 20)}")
    srcs = r.get("sources") or {}
    if srcs:
        lines.append("sources: " + "; ".join(f"{safe(k, 20)} {safe(v, LONG)}"
                                             for k, v in srcs.items()))
    for h in r.get("holders", []):
        lines.append(f"  PID {safe(h['host_pid'], 12)} ({safe(h.get('name'), 16)}): "
                     f"{safe(command_line(h.get('cmdline')), LONG)}")
        lines.append(f"      cgroup {safe(h.get('cgroup'), 120)}, "
                     f"unit {safe(h.get('unit') or '-', 64)}, user {safe(h.get('user'), 32)}"
                     f", seen by {safe(', '.join(h.get('sources', [])), 40)}, signals: "
                     f"{safe(', '.join(h.get('signals', [])) or 'none', LONG)}")
    for o in r.get("other_gpu_users", []):
        lines.append(f"  other GPU user (not signalled): PID {safe(o['host_pid'], 12)} "
                     f"{safe(o.get('name'), 16)} in {safe(o.get('cgroup'), 120)}")
    for leak in r.get("leaks", []):
        lines.append(f"  leak: GPU {safe(leak['index'], 8)} {safe(leak['unaccounted_mib'], 12)}"
                     f" MiB: {safe(leak['hint'], LONG)}")
    return "\n".join(lines)


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
