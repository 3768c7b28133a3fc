"""`pveclean install`: put the hookscript into a storage's snippets directory and register it
on containers (or VMs) through the Proxmox API. The planning pieces here (Planning, the
guests found, snippet paths, drop-ins applied) serve `uninstall` too (uninstall.py).

Plan first, then apply: a plan with problems changes nothing. Another hookscript is never
replaced silently: without --chain that is a problem; with --chain it is recorded
(pveclean.chain) and the hook runs it in every phase. A chain record lives in state_dir of
the node the container runs on, so chaining and uninstalling work on this node's containers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pveclean.commands.installplan import InstallRequest, Outcome, Plan, Step
from pveclean.core.config import Config
from pveclean.core.pci import PciAddress
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import devnodes
from pveclean.proxmox import chain, dropin, pveconf, vmtake
from pveclean.proxmox.hookscript import (
    HOOK_NAME,
    MARKER,
    VM_HOOK_NAME,
    config_file,
    hook_text,
    is_pveclean,
    pveclean_bin,
)
from pveclean.proxmox.pveapi import Api, Container, Storage, guest_label
from pveclean.proxmox.snippets import parse_volid


# ---- the guests a plan is for (install's and uninstall's) --------------------------------
@dataclass(frozen=True)
class Planning:
    """One plan in the making, and what it is planned against."""

    api: Api
    cfg: Config
    plan: Plan
    here: str  # this node
    online: dict[str, bool]  # node -> is it online

    @classmethod
    def start(cls, api: Api, cfg: Config, plan: Plan) -> Planning:
        return cls(api, cfg, plan, api.local_node(), api.nodes())


def find_guests(p: Planning, vmids: Sequence[int], kind: str = "lxc",
                gone: list[int] | None = None) -> list[tuple[Container, pveconf.CtConfig]]:
    """The guests of `kind` that `vmids` names; one that does not exist is a problem, or,
    when `gone` is given, goes there (uninstall removes what pveclean left for it)."""
    cts = {c.vmid: c for c in p.api.containers(kind)}
    out = []
    for vmid in vmids:
        c = cts.get(vmid)
        if c is None and gone is not None:
            gone.append(vmid)
        elif c is None:
            p.plan.problem(f"{guest_label(kind, vmid)} does not exist in this cluster",
                           ExitCode.ACCESS)
        elif not p.online.get(c.node, False):
            p.plan.problem(f"{c.label}: its node {c.node} is offline", ExitCode.ACCESS)
        else:
            out.append((c, p.api.ct_config(c.node, vmid, kind)))
    return out


def all_guests(p: Planning, kinds: tuple[str, ...] = ("lxc",)
               ) -> list[tuple[Container, pveconf.CtConfig]]:
    out = []
    for c in (c for kind in kinds for c in p.api.containers(kind)):
        if c.template:
            continue
        if not p.online.get(c.node, False):
            p.plan.notes.append(f"{c.label}: its node {c.node} is offline; not looked at")
            continue
        out.append((c, p.api.ct_config(c.node, c.vmid, c.kind)))
    return out


@dataclass(frozen=True)
class _GpuCheck:
    """Does a guest's config give it an NVIDIA GPU? A VM's hostpci lines (`mappings`: this
    node's PCI resource mappings) are looked up in this node's sysfs."""

    cfg: Config
    here: str
    majors: frozenset[int]  # the NVIDIA device nodes' majors
    mappings: dict[str, list[tuple[PciAddress, ...]]]
    api: Api | None = None  # a VM's hostpci lines as its next start has them (pending too)

    @classmethod
    def of(cls, cfg: Config, here: str, kind: str, api: Api | None = None) -> _GpuCheck:
        return cls(cfg, here, devnodes.nvidia_majors(),
                   _pci_mappings(cfg, here) if kind == "qemu" else {}, api)

    def passes(self, c: Container, conf: pveconf.CtConfig) -> bool | None:
        """None for a VM on another node (cannot tell from here)."""
        if c.kind != "qemu":
            return bool(conf.gpu_lines(self.majors))
        if c.node != self.here:
            return None
        if self.api is not None:  # pending hostpci lines apply before the next pre-start
            conf = self.api.ct_config(c.node, c.vmid, "qemu", current=False)
        return vmtake.unbinds_nvidia(conf.lines, self.mappings,
                                     Path(self.cfg.pci_sysfs) / "devices")


def _pci_mappings(cfg: Config, here: str) -> dict[str, list[tuple[PciAddress, ...]]]:
    """/etc/pve/mapping/pci.cfg, read in a worker: pmxcfs can stop answering."""
    from pveclean.host.worker import RemoteError, Worker, WorkerError

    path = Path(cfg.pve_config_dir).parent / "mapping" / "pci.cfg"
    with Worker() as wk:
        try:
            got: dict[str, list[tuple[PciAddress, ...]]] = wk.call(
                vmtake.read_mappings, path, here, timeout=cfg.deadline_seconds,
                what=f"reading {path}")
        except (RemoteError, WorkerError) as exc:
            raise PvecleanError(f"{exc} (pmxcfs not answering?)", ExitCode.ACCESS) from None
    return got


def snippet_path(api: Api, volid: str) -> Path | None:
    """Where a snippet volume lives, as the API describes its storage."""
    parsed = parse_volid(volid)
    if parsed is None:
        return None
    storage, name = parsed
    sdir = api.storage(storage).snippets_dir
    return sdir / name if sdir else None


# ---- install ----------------------------------------------------------------------------
def _file_action(plan: Plan, path: Path, text: str) -> str:
    try:
        old = path.read_text(encoding="utf-8", errors="replace")
        st = path.stat()
    except FileNotFoundError:
        return "create"
    except OSError as exc:
        plan.problem(f"cannot read {path}: {exc.strerror}", ExitCode.ACCESS)
        return "keep"
    if MARKER not in old:
        plan.problem(f"{path} exists and is not pveclean's hookscript; not overwriting it")
        return "keep"
    owner_ok = os.geteuid() != 0 or (st.st_uid, st.st_gid) == (0, 0)
    return "unchanged" if old == text and st.st_mode & 0o777 == 0o755 and owner_ok else "update"


def plan_install(api: Api, cfg: Config, req: InstallRequest) -> Plan:
    """For containers, or with req.kind qemu for VMs (the same script as pveclean-vm-hook)."""
    plan = Plan("install", storage=req.storage)
    if req.systemd and req.kind == "qemu":
        plan.problem("--systemd is for containers (pve-container@.service); a VM's guard is "
                     "its hookscript", ExitCode.USAGE)
        return plan
    p = Planning.start(api, cfg, plan)
    st = api.storage(req.storage)
    sdir = st.snippets_dir
    if sdir is None:
        plan.problem(f"storage '{req.storage}' (type {st.type}) has no directory for snippets; "
                     "choose a directory storage (dir, nfs, cifs, cephfs) with --storage")
        return plan
    volid = _plan_snippet(p, req, st, sdir)
    gpus = _GpuCheck.of(cfg, p.here, req.kind, p.api)
    targets = (_gpu_guests(p, req, st, gpus) if req.every
               else _named_guests(p, req, st, gpus))
    for c, conf in targets:
        _install_step(p, c, conf, volid, req.chain)
        if req.systemd:
            _dropin_step(cfg, plan, c, p.here)
    return plan


def _plan_snippet(p: Planning, req: InstallRequest, st: Storage, sdir: Path) -> str:
    """The hookscript's file in the storage's snippets directory `sdir`, and the storage's
    content list; the hookscript's volume id."""
    plan = p.plan
    name = VM_HOOK_NAME if req.kind == "qemu" else HOOK_NAME
    plan.file = sdir / name
    plan.text = hook_text(p.cfg)
    plan.file_action = _file_action(plan, plan.file, plan.text)
    if "snippets" not in st.content:
        content = [c for c in st.content if c != "none"] + ["snippets"]
        if req.enable_snippets:
            plan.enable_snippets = content
        else:  # PVE::GuestHelpers::check_hookscript checks the path, never the content list
            plan.notes.append(f"storage '{req.storage}' does not list snippets: the hookscript "
                              "runs anyway, but the GUI and 'pvesm list' do not show it; to "
                              f"show it: pvesm set {req.storage} --content {','.join(content)} "
                              "(or rerun with --enable-snippets)")
    return f"{req.storage}:snippets/{name}"


def _gpu_guests(p: Planning, req: InstallRequest, st: Storage, gpus: _GpuCheck
                ) -> list[tuple[Container, pveconf.CtConfig]]:
    """--all and --all-gpu-vms: every guest of the kind whose config passes a GPU, of this
    node unless the storage is shared."""
    targets = []
    again = f"pveclean install {'--all-gpu-vms' if req.kind == 'qemu' else '--all'}"
    for c, conf in all_guests(p, (req.kind,)):
        gpu = gpus.passes(c, conf)
        if gpu is None:
            p.plan.notes.append(f"{c.label} on node {c.node} skipped: its GPUs are known "
                                f"on its node; run {again} on {c.node}")
        elif gpu and not st.shared and c.node != p.here:
            p.plan.notes.append(f"{c.label} on node {c.node} skipped: storage '{req.storage}' "
                                f"is not shared; run {again} on {c.node}")
        elif gpu:
            targets.append((c, conf))
    if not targets and not p.plan.notes:
        p.plan.notes.append(f"no {'VM' if req.kind == 'qemu' else 'container'} has NVIDIA GPU "
                            "passthrough in its config")
    return targets


def _named_guests(p: Planning, req: InstallRequest, st: Storage, gpus: _GpuCheck
                  ) -> list[tuple[Container, pveconf.CtConfig]]:
    """The guests named, each on this node unless the storage is shared; one without a GPU
    is registered anyway."""
    targets = []
    for c, conf in find_guests(p, req.vmids, req.kind):
        if not st.shared and c.node != p.here:
            p.plan.problem(f"{c.label} is on node {c.node} and storage '{req.storage}' is not "
                           f"shared: run pveclean install there, or use --storage with a "
                           "shared storage")
            continue
        if gpus.passes(c, conf) is False:
            p.plan.notes.append(f"{c.label} has no NVIDIA GPU passthrough in its config; "
                                "registering anyway")
        targets.append((c, conf))
    return targets


def _dropin_step(cfg: Config, plan: Plan, c: Container, here: str) -> None:
    """The unit drop-in lives on the node the container runs on (systemd is per node)."""
    if c.node != here:
        plan.notes.append(f"CT {c.vmid} is on node {c.node}: its systemd drop-in goes on that "
                          f"node; run pveclean install --systemd {c.vmid} there")
        return
    for unit in dropin.UNITS:  # pve-container@ and pve-container-debug@ (pct start --debug)
        path = dropin.dropin_path(cfg, c.vmid, unit)
        text = dropin.dropin_text(c.vmid, pveclean_bin(), config_file(cfg),
                                  cfg.unit_start_timeout_seconds, unit)
        try:
            old = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            plan.dropins.append((c.vmid, path, "create", text))
            continue
        except OSError as exc:
            plan.problem(f"cannot read {path}: {exc.strerror}", ExitCode.ACCESS)
            continue
        if dropin.MARKER not in old:
            plan.problem(f"{path} exists and is not pveclean's drop-in; not overwriting it")
            continue
        plan.dropins.append((c.vmid, path, "unchanged" if old == text else "update", text))


def _install_step(p: Planning, c: Container, conf: pveconf.CtConfig, volid: str,
                  chain_existing: bool) -> None:
    """Set hookscript `volid` on the guest; another one is chained, with `chain_existing`."""
    plan = p.plan
    cur = conf.hookscript
    step = Step(c.vmid, c.node, "set", before=cur, after=volid, digest=conf.digest,
                kind=c.kind)
    rec = chain.read_record(p.cfg, c.vmid) if c.node == p.here else None
    if cur == volid:
        step.action = "unchanged"
        step.chained = rec[0] if rec else None
        plan.steps.append(step)
        return
    if c.lock:
        plan.problem(f"{c.label} is locked ({c.lock}); try again when that is over",
                     ExitCode.ACCESS)
        return
    if cur is not None and not is_pveclean(cur):
        if not chain_existing:
            tool = "qm" if c.kind == "qemu" else "pct"
            plan.problem(f"{c.label} already has hookscript {cur}; not replacing it: rerun "
                         "with --chain to keep it (pveclean then runs it in every phase), or "
                         f"remove it first ({tool} set {c.vmid} --delete hookscript)")
            return
        if c.node != p.here:
            plan.problem(f"{c.label} is on node {c.node}: --chain records its hookscript "
                         f"{cur} on the node it runs on; run pveclean install --chain there")
            return
        path = snippet_path(p.api, cur)
        if path is None or not path.is_file():
            plan.problem(f"{c.label}: its hookscript {cur} is not a file on this node "
                         f"({path or 'not a snippets volume'}); cannot chain it", ExitCode.ACCESS)
            return
        step.action, step.chained, step.chained_path = "chain", cur, str(path)
    elif rec:
        step.chained = rec[0]  # pveclean moved to another storage: the chain stays
    plan.steps.append(step)


def hookscript_is(api: Api, s: Step, volid: str | None) -> bool:
    """Re-read the config in force: is the hookscript now `volid`? (False if unreadable.)"""
    try:
        return api.ct_config(s.node, s.vmid, s.kind).hookscript == volid
    except PvecleanError:
        return False


def apply_install(api: Api, cfg: Config, plan: Plan) -> Outcome:
    out = Outcome()
    if plan.problems:
        raise PvecleanError("refusing to apply a plan with problems", ExitCode.USAGE)
    if plan.enable_snippets is not None and plan.storage:
        api.set_storage_content(plan.storage, plan.enable_snippets)
        out.done.append(f"storage '{plan.storage}': content {','.join(plan.enable_snippets)}")
    if plan.file is not None and plan.file_action in ("create", "update"):
        dropin.write_file(plan.file, plan.text, 0o755)
        out.done.append(f"wrote {plan.file}")
    for s in plan.steps:
        if s.action not in ("set", "chain"):
            continue
        assert s.after is not None
        try:
            if s.action == "chain":
                assert s.chained and s.chained_path
                chain.write_record(cfg, s.vmid, s.chained, s.chained_path)
            elif s.before is None:
                chain.remove_record(cfg, s.vmid)  # a stale record must not run
            try:
                api.set_hookscript(s.node, s.vmid, s.after, s.digest, s.kind)
            except PvecleanError:
                if not hookscript_is(api, s, s.after):
                    if s.action == "chain":
                        chain.remove_record(cfg, s.vmid)
                    raise
                # The change went through though the call looked failed (e.g. pvesh's
                # stderr while it waited for the config lock): keep the chain record.
        except PvecleanError as exc:
            out.errors.append((f"{guest_label(s.kind, s.vmid)}: {exc}", exc.exit_code))
            continue
        except OSError as exc:
            out.errors.append((f"{guest_label(s.kind, s.vmid)}: cannot write the chain "
                               f"record: {exc.strerror}", ExitCode.ACCESS))
            continue
        out.done.append(f"{guest_label(s.kind, s.vmid)}: hookscript {s.after}"
                        + (f" (runs {s.chained} too)" if s.chained else ""))
    apply_dropins(cfg, plan, out)
    return out


def apply_dropins(cfg: Config, plan: Plan, out: Outcome) -> None:
    """Write or remove the plan's systemd drop-ins (install's and uninstall's)."""
    changed = False
    for vmid, path, action, text in plan.dropins:
        try:
            if action in ("create", "update"):
                dropin.write_file(path, text)
                out.done.append(f"CT {vmid}: wrote {path}")
            elif action == "remove":
                dropin.remove_dropin(path)
                out.done.append(f"CT {vmid}: removed {path}")
            else:
                continue
            changed = True
        except PvecleanError as exc:
            out.errors.append((f"CT {vmid}: {exc}", exc.exit_code))
    if changed and (warning := dropin.daemon_reload(cfg)):
        out.errors.append((warning, ExitCode.ACCESS))
