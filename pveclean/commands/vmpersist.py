"""Persistence mode, the common host holder of a VM's GPU, handled per GPU by the VM hook.

nvidia-persistenced keeps every GPU's device node open, and the driver's unbind of a GPU
(nv_pci_remove) waits until nothing holds it: a VM's start would hang under its config lock.
So pre-start turns persistence off for each GPU of the VM that the daemon holds, that GPU
alone (through NVML, which tells the daemon to close that node; host/persistence.py), then
verifies the node is free with the other holders; the GPUs are written down
(`<state_dir>/persistence-<vmid>.yaml`, PCI ids) and post-stop turns persistence back on for
each that is back on the nvidia driver, keeping the rest written down for the next time.
"""

from __future__ import annotations

from pathlib import Path

from pveclean.core.config import Config
from pveclean.core.gpumap import GpuMap
from pveclean.core.pci import PciAddress


def record_file(cfg: Config, vmid: int) -> Path:
    return Path(cfg.state_dir) / f"persistence-{vmid}.yaml"


def read_record(cfg: Config, vmid: int) -> list[PciAddress]:
    """The GPUs whose persistence pre-start turned off (none when the record is missing or
    unreadable)."""
    import yaml

    try:
        got = yaml.load(record_file(cfg, vmid).read_text(), Loader=yaml.CSafeLoader)
    except (OSError, yaml.YAMLError):
        return []
    items = got if isinstance(got, list) else []
    return [a for a in (PciAddress.parse(str(x)) for x in items) if a is not None]


def write_record(cfg: Config, vmid: int, addrs: list[PciAddress]) -> None:
    """The record, replaced whole (removed when empty)."""
    import yaml

    from pveclean.host.wholefile import replace_whole

    path = record_file(cfg, vmid)
    if not addrs:
        path.unlink(missing_ok=True)
        return
    text = yaml.dump(sorted({str(a) for a in addrs}), Dumper=yaml.CSafeDumper)
    replace_whole(path, text, f".persistence-{vmid}-")


def turn_off(cfg: Config, vmid: int, gmap: GpuMap, indices: frozenset[int],
             timeout: float) -> list[str]:
    """Persistence off for each GPU of `indices` alone; the GPUs turned off are added to the
    record first (a crash in between leaves them to post-stop). Returns what failed."""
    from pveclean.host import persistence
    from pveclean.host.nvml import Nvml
    from pveclean.host.worker import RemoteError, Worker, WorkerError

    addrs = {g.index: g.pci_bus_id for g in gmap.gpus if g.index in indices}
    before = read_record(cfg, vmid)
    write_record(cfg, vmid, before + [a for a in addrs.values() if a is not None])
    failed, unchanged = [], []
    with Worker(**Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)) as wk:
        for index in sorted(indices):
            try:
                err = wk.call(persistence.w_set_persistence_mode, index, False, timeout,
                              timeout=timeout + 1.0, what="turning persistence off")
            except (RemoteError, WorkerError) as exc:
                err = str(exc)
            if err is not None:
                unchanged.append(addrs.get(index))
                failed.append(f"GPU {index} ({addrs.get(index)}): persistence mode could not "
                              f"be turned off ({err}): nvidia-persistenced keeps it open")
    if unchanged:  # only what was turned off is turned back on
        write_record(cfg, vmid, before + [a for a in addrs.values()
                                          if a is not None and a not in unchanged])
    return failed


def restore(cfg: Config, vmid: int, gmap: GpuMap, timeout: float) -> list[str]:
    """Persistence back on for each recorded GPU that is back on the nvidia driver; the others
    stay recorded. Returns one line per GPU."""
    from pveclean.host import persistence
    from pveclean.host.nvml import Nvml
    from pveclean.host.worker import RemoteError, Worker, WorkerError

    wanted = read_record(cfg, vmid)
    if not wanted:
        return []
    from pveclean.proxmox import vmtake

    rows = {g.pci_bus_id: g.index for g in gmap.gpus if g.pci_bus_id is not None}
    reserved = {a: r.vmid for a, r in vmtake.reservations(Path(cfg.qemu_run_dir)).items()
                if r.vmid != vmid}
    left, lines = [], []
    with Worker(**Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)) as wk:
        for addr in wanted:
            index = rows.get(addr)
            if addr in reserved:  # a late post-stop: another VM starts with it or runs
                left.append(addr)
                lines.append(f"{addr} is reserved by VM {reserved[addr]}: persistence stays "
                             "off (kept for the next post-stop)")
                continue
            if index is None:
                left.append(addr)
                lines.append(f"{addr} is not on the nvidia driver: persistence stays off "
                             "until it is back (kept for the next post-stop)")
                continue
            try:
                err = wk.call(persistence.w_set_persistence_mode, index, True, timeout,
                              timeout=timeout + 1.0, what="turning persistence on")
            except (RemoteError, WorkerError) as exc:
                err = str(exc)
            if err is not None:
                left.append(addr)
            lines.append(f"GPU {index} ({addr}): persistence mode "
                         + ("back on" if err is None else f"NOT back on: {err}"))
    write_record(cfg, vmid, left)
    return lines
