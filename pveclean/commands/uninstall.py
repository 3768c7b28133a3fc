"""`pveclean uninstall`: take pveclean's hookscript off containers and VMs, restoring the one
it chained; drop what pveclean left on this node (systemd drop-ins, chain records, also those
of destroyed containers), and with --all the snippet file once no guest uses it.

Planned and carried out as an install is (see install.py and installplan.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pveclean.commands.install import (
    Planning,
    all_guests,
    apply_dropins,
    find_guests,
    hookscript_is,
    snippet_path,
)
from pveclean.commands.installplan import Outcome, Plan, Step
from pveclean.core.config import Config
from pveclean.errors import ExitCode, PvecleanError
from pveclean.proxmox import chain, dropin, pveconf
from pveclean.proxmox.hookscript import MARKER, is_pveclean
from pveclean.proxmox.pveapi import Api, Container, guest_label


def plan_uninstall(api: Api, cfg: Config, vmids: Sequence[int], all_: bool, kind: str = "lxc"
                   ) -> Plan:
    """`vmids` of `kind`; with `all_` every container and VM with pveclean's hookscript."""
    p = Planning.start(api, cfg, Plan("uninstall"))
    gone: list[int] = []
    seen = (all_guests(p, ("lxc", "qemu")) if all_
            else find_guests(p, vmids, kind, None if kind == "qemu" else gone))
    dropin_vmids = set(dropin.installed(cfg)) if all_ else set()
    dropin_vmids |= _forget_gone(p, gone)
    dropin_vmids |= {c.vmid for c, _conf in seen if c.kind == "lxc" and c.node == p.here
                     and dropin.is_ours(dropin.dropin_path(cfg, c.vmid))}
    for vmid in sorted(dropin_vmids):
        for unit in dropin.UNITS:
            unit_file = dropin.dropin_path(cfg, vmid, unit)
            if unit == dropin.UNITS[0] or dropin.is_ours(unit_file):
                p.plan.dropins.append((vmid, unit_file, "remove", ""))
    volids = _Volids()
    for c, conf in seen:
        _uninstall_step(p, c, conf, all_, volids)
    if all_ and not any(not up for up in p.online.values()):
        for volid in sorted(volids.removed - volids.still_used):
            path = snippet_path(api, volid)
            if path is not None and path.is_file():
                p.plan.remove_files.append(path)
    return p.plan


def _forget_gone(p: Planning, gone: list[int]) -> set[int]:
    """What pveclean left on this node for containers destroyed since (its drop-in would run
    for the next container of that VMID): the chain records go in the plan; the VMIDs whose
    drop-ins go are returned."""
    dropin_vmids: set[int] = set()
    for vmid in gone:
        left = dropin.is_ours(dropin.dropin_path(p.cfg, vmid)), chain.read_record(p.cfg, vmid)
        if not any(left):
            p.plan.problem(f"CT {vmid} does not exist in this cluster, and pveclean left "
                           "nothing for it on this node", ExitCode.ACCESS)
            continue
        p.plan.notes.append(f"CT {vmid} no longer exists: removing what pveclean left for it "
                            "on this node")
        if left[0]:
            dropin_vmids.add(vmid)
        if left[1]:
            p.plan.forget_chains.append(vmid)
    return dropin_vmids


@dataclass
class _Volids:
    """pveclean's hookscript volumes that uninstall saw: the ones it removes from guests
    here, and the ones guests on other nodes still use (uninstall --all)."""

    removed: set[str] = field(default_factory=set)
    still_used: set[str] = field(default_factory=set)


def _uninstall_step(p: Planning, c: Container, conf: pveconf.CtConfig, all_: bool,
                    volids: _Volids) -> None:
    """Restore the hookscript pveclean chained, or delete pveclean's."""
    cur = conf.hookscript
    if not is_pveclean(cur):
        if not all_:
            p.plan.steps.append(Step(c.vmid, c.node, "skip", before=cur, kind=c.kind,
                                     note=f"hookscript is {cur or 'not set'}, not pveclean's"))
        return
    if c.node != p.here:
        if all_:
            p.plan.notes.append(f"{c.label} on node {c.node} skipped: run pveclean "
                                "uninstall --all there")
            volids.still_used.add(str(cur))
        else:
            p.plan.problem(f"{c.label} is on node {c.node}: its chained hookscript (if any) "
                           "is recorded there; run pveclean uninstall there")
        return
    if c.lock:
        p.plan.problem(f"{c.label} is locked ({c.lock}); try again when that is over",
                       ExitCode.ACCESS)
        return
    rec = chain.read_record(p.cfg, c.vmid)
    if rec:
        p.plan.steps.append(Step(c.vmid, c.node, "restore", before=cur, after=rec[0],
                                 digest=conf.digest, kind=c.kind))
    else:
        p.plan.steps.append(Step(c.vmid, c.node, "delete", before=cur, digest=conf.digest,
                                 kind=c.kind))
    volids.removed.add(str(cur))


def apply_uninstall(api: Api, cfg: Config, plan: Plan) -> Outcome:
    out = Outcome()
    if plan.problems:
        raise PvecleanError("refusing to apply a plan with problems", ExitCode.USAGE)
    for s in plan.steps:
        who = guest_label(s.kind, s.vmid)
        try:
            if s.action == "restore":
                assert s.after is not None
                api.set_hookscript(s.node, s.vmid, s.after, s.digest, s.kind)
                out.done.append(f"{who}: hookscript {s.after} restored")
            elif s.action == "delete":
                api.delete_hookscript(s.node, s.vmid, s.digest, s.kind)
                out.done.append(f"{who}: hookscript {s.before} removed")
            else:
                continue
            chain.remove_record(cfg, s.vmid)
        except PvecleanError as exc:
            want = s.after if s.action == "restore" else None
            if not hookscript_is(api, s, want):  # did it go through anyway?
                out.errors.append((f"{who}: {exc}", exc.exit_code))
                continue
            out.done.append(f"{who}: hookscript {want or 'removed'}")
            chain.remove_record(cfg, s.vmid)
    for vmid in plan.forget_chains:
        chain.remove_record(cfg, vmid)
        out.done.append(f"CT {vmid}: its chain record removed")
    apply_dropins(cfg, plan, out)
    if out.errors:
        return out
    for path in plan.remove_files:
        try:
            if MARKER in path.read_text(encoding="utf-8", errors="replace"):
                path.unlink()
                out.done.append(f"removed {path}")
        except OSError as exc:
            out.errors.append((f"cannot remove {path}: {exc.strerror}", ExitCode.ACCESS))
    return out
