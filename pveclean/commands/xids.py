"""The Xid reader as the commands run it: one pass over the kernel log (host/kmsg.py) with the
owners of the GPU map just taken, for `pveclean metrics`, `gpus` and every hook phase; the
lines `gpus` and the reports show; the pre-start check of a container's GPUs."""

from __future__ import annotations

from collections.abc import Iterable

from pveclean.core.config import Config
from pveclean.core.gpumap import GpuMap, GpuUse
from pveclean.core.owners import Owner
from pveclean.core.text import safe
from pveclean.core.xid import Action
from pveclean.core.xidlog import Seen, XidLog
from pveclean.host import kmsg


def map_pids(gmap: GpuMap | None) -> dict[int, tuple[Owner, str]] | None:
    """PID -> (owner, name) of every process the map saw on a GPU."""
    if gmap is None:
        return None
    return {p.proc.host_pid: (p.owner, p.proc.name) for g in gmap.gpus for p in g.processes}


def xid_pass(cfg: Config, gmap: GpuMap | None = None, keep: bool = True
             ) -> tuple[XidLog, list[Seen], str | None]:
    """One bounded pass; never raises for the kernel log (why it was not read is returned).
    `keep` False: the log is read as far as the kernel has it, and nothing saved."""
    return kmsg.read_xids(cfg.kmsg_path, cfg.state_dir, pids=map_pids(gmap), keep=keep)


def describe(s: Seen) -> str:
    """One Xid as every view says it."""
    x = s.xid
    who = s.owner.label if s.how != "unknown" else "unknown process"
    pid = "pid ?" if x.pid is None else f"pid {x.pid}"
    name = "" if x.name is None else f" {safe(x.name, 40)}"
    return (f"Xid {x.xid} ({s.action}) on {x.pci}: {pid}{name}, {who}: {safe(x.text, 80)}")


def advice(action: Action, gpu: str = "GPU") -> str:
    if action is Action.RESET:
        return f"the GPU needs a reset: `pveclean reset {gpu} --dry-run` shows what it would do"
    if action is Action.REBOOT:
        return "NVIDIA's catalog says the node needs a reboot"
    return ""


def gpu_lines(log: XidLog, gpus: Iterable[GpuUse]) -> dict[int, list[str]]:
    """GPU index -> its last Xids, newest last, for `pveclean gpus`."""
    out: dict[int, list[str]] = {}
    for g in gpus:
        if g.pci_bus_id is None:
            continue
        prefix = str(g.pci_bus_id.whole_device)
        seen = log.last_on(prefix)
        if seen:
            out[g.index] = [describe(s) for s in seen]
    return out


def gpus_section(cfg: Config, gmap: GpuMap) -> tuple[str, dict[str, list[dict[str, object]]]]:
    """`pveclean gpus`' last Xids per GPU: the text after the map, and the `xids` object of
    its JSON (GPU index -> the last Xids, newest last); both empty when there are none.
    Reads the kernel log and saves nothing."""
    try:
        log = xid_pass(cfg, gmap, keep=False)[0]
    except OSError:
        return "", {}
    lines = gpu_lines(log, gmap.gpus)
    if not lines:
        return "", {}
    text = ["", "Last Xids (NVIDIA driver faults, newest last):"]
    doc: dict[str, list[dict[str, object]]] = {}
    for g in gmap.gpus:
        if g.index in lines and g.pci_bus_id is not None:
            text += [f"  GPU {g.index}: {line}" for line in lines[g.index]]
            doc[str(g.index)] = [s.as_dict() for s in log.last_on(str(g.pci_bus_id.whole_device))]
            pending = log.needs_reset(str(g.pci_bus_id.whole_device))
            if pending is not None:
                text.append(f"  GPU {g.index}: {advice(pending.action, str(g.index))}")
    return "\n".join(text), doc
