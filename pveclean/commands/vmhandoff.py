"""The VM hook's hand-off record (`<state_dir>/vfio-<vmid>.yaml`, core/handoff.py's rules):
read, merged on each hand-off, and the give-back that leaves a group another VM reserved or
has open, and keeps what it could not give back."""

from __future__ import annotations

import os
from pathlib import Path

from pveclean.core.config import Config
from pveclean.core.handoff import GroupHandoff, merge, split
from pveclean.errors import PvecleanError
from pveclean.host import pcibind


def record_file(cfg: Config, vmid: int) -> Path:
    return Path(cfg.state_dir) / f"vfio-{vmid}.yaml"


def read(cfg: Config, vmid: int) -> list[GroupHandoff] | None:
    """The VM's record (None: there is none); PvecleanError when it cannot be read."""
    import yaml

    path = record_file(cfg, vmid)
    try:
        saved = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
    except FileNotFoundError:
        return None
    except (OSError, yaml.YAMLError) as exc:
        raise PvecleanError(f"cannot read {path}: {exc}") from None
    items = saved if isinstance(saved, list) else []
    return [g for g in map(GroupHandoff.of, items) if g is not None]


def write(cfg: Config, vmid: int, groups: list[GroupHandoff]) -> None:
    """The record replaced whole, atomically; removed when no group is left."""
    import yaml

    from pveclean.host.wholefile import replace_whole

    path = record_file(cfg, vmid)
    if not groups:
        path.unlink(missing_ok=True)
        return
    text = yaml.dump([g.as_dict() for g in groups], Dumper=yaml.CSafeDumper)
    replace_whole(path, text, f".vfio-{vmid}-")


def add(cfg: Config, vmid: int, done: list[pcibind.Handoff]) -> None:
    """A hand-off merged into the record (never overwriting an older driver)."""
    new = [GroupHandoff(h.address, tuple(h.before.items())) for h in done]
    try:
        old = read(cfg, vmid) or []
    except PvecleanError:
        old = []
    write(cfg, vmid, merge(old, new))


def busy(cfg: Config, vmid: int, groups: list[GroupHandoff]) -> dict[str, str]:
    """Function -> why it may not be given back now: another VM's live reservation, or its
    IOMMU group open through /dev/vfio."""
    from pveclean.host import vfioopen
    from pveclean.proxmox import vmtake

    out: dict[str, str] = {}
    for addr, r in vmtake.reservations(Path(cfg.qemu_run_dir)).items():
        if r.vmid != vmid:
            out[str(addr)] = f"reserved by VM {r.vmid}"
    devices = Path(cfg.pci_sysfs) / "devices"
    group_no = {fn: vfioopen.group_of(devices, fn) for g in groups for fn in g.functions}
    opened = vfioopen.open_groups({n for n in group_no.values() if n is not None})
    for fn, n in group_no.items():
        if n in opened and fn not in out:
            out[fn] = f"/dev/vfio/{n} is open"
    return out


def plan(cfg: Config, vmid: int) -> tuple[list[GroupHandoff], list[tuple[GroupHandoff, str]]]:
    """The recorded groups to give back now, and those to leave (with why)."""
    groups = read(cfg, vmid) or []
    return split(groups, busy(cfg, vmid, groups))


def as_handoff(g: GroupHandoff) -> pcibind.Handoff:
    return pcibind.Handoff(g.address, dict(g.before))


def stranded(cfg: Config, vmid: int, taken: set[str]) -> list[int]:
    """Other VMs whose hand-off record is stranded: no QEMU of theirs runs and they hold no
    reservation (a start that failed after pre-start, a migration's source, a post-stop that
    never came), and none of whose functions VM `vmid`'s start takes."""
    import re

    from pveclean.proxmox import vmtake

    run = Path(cfg.qemu_run_dir)
    live = {r.vmid for r in vmtake.reservations(run).values()}
    out: list[int] = []
    try:
        names = sorted(os.listdir(cfg.state_dir))
    except OSError:
        return out
    for name in names:
        m = re.fullmatch(r"vfio-(\d+)\.yaml", name)
        other = int(m.group(1)) if m else vmid
        if other == vmid or other in live or vmtake.qemu_running(run, other):
            continue
        try:
            groups = read(cfg, other) or []
        except PvecleanError:
            continue
        if not any(fn in taken for g in groups for fn in g.functions):
            out.append(other)
    return out
