"""`pveclean install` and `uninstall`: put the hookscript into a storage's snippets directory
and register it on containers through the Proxmox API.

Plan first, then apply: a plan with problems changes nothing. Another hookscript is never
replaced silently: without --chain that is a problem; with --chain it is recorded
(pveclean.chain) and the hook runs it in every phase. A chain record lives in state_dir of
the node the container runs on, so chaining and uninstalling work on this node's containers.
"""

from __future__ import annotations

import os
from pathlib import Path

from pveclean.commands.installplan import Outcome, Plan, Step
from pveclean.core.config import Config
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import devnodes
from pveclean.proxmox import chain, dropin, passthrough, pveconf
from pveclean.proxmox.hookscript import (
    HOOK_NAME,
    MARKER,
    VM_HOOK_NAME,
    config_file,
    hook_text,
    is_pveclean,
    pveclean_bin,
)
from pveclean.proxmox.pveapi import Api, Container, guest_label
from pveclean.proxmox.snippets import parse_volid


# ---- install ----------------------------------------------------------------------------
def _targets(api: Api, plan: Plan, vmids: list[int], online: dict[str, bool],
             gone: list[int] | None = None, kind: str = "lxc"
             ) -> list[tuple[Container, pveconf.CtConfig]]:
    """The guests of `kind` that `vmids` names; one that does not exist is a problem, or,
    when `gone` is given, goes there (uninstall removes what pveclean left for it)."""
    cts = {c.vmid: c for c in api.containers(kind)}
    out = []
    for vmid in vmids:
        c = cts.get(vmid)
        if c is None and gone is not None:
            gone.append(vmid)
        elif c is None:
            plan.problem(f"{guest_label(kind, vmid)} does not exist in this cluster",
                         ExitCode.ACCESS)
        elif not online.get(c.node, False):
            plan.problem(f"{c.label}: its node {c.node} is offline", ExitCode.ACCESS)
        else:
            out.append((c, api.ct_config(c.node, vmid, kind)))
    return out


def _all(api: Api, plan: Plan, online: dict[str, bool], kinds: tuple[str, ...] = ("lxc",)
         ) -> list[tuple[Container, pveconf.CtConfig]]:
    out = []
    for c in (c for kind in kinds for c in api.containers(kind)):
        if c.template:
            continue
        if not online.get(c.node, False):
            plan.notes.append(f"{c.label}: its node {c.node} is offline; not looked at")
            continue
        out.append((c, api.ct_config(c.node, c.vmid, c.kind)))
    return out


def _passes_gpu(cfg: Config, c: Container, conf: pveconf.CtConfig, here: str,
                majors: frozenset[int], mappings: dict[str, list[str]]) -> bool | None:
    """Does the guest's config give it an NVIDIA GPU? A VM's hostpci lines (`mappings`: this
    node's PCI resource mappings) are looked up in this node's sysfs: None for a VM on
    another node (cannot tell from here)."""
    if c.kind != "qemu":
        return bool(conf.gpu_lines(majors))
    if c.node != here:
        return None
    return bool(passthrough.nvidia_functions(conf.lines, mappings,
                                             Path(cfg.pci_sysfs) / "devices"))


def _pci_mappings(cfg: Config, here: str) -> dict[str, list[str]]:
    """/etc/pve/mapping/pci.cfg, read in a worker: pmxcfs can stop answering."""
    from pveclean.host.worker import RemoteError, Worker, WorkerError

    path = Path(cfg.pve_config_dir).parent / "mapping" / "pci.cfg"
    with Worker() as wk:
        try:
            got: dict[str, list[str]] = wk.call(
                passthrough.read_pci_mappings, path, here, timeout=cfg.deadline_seconds,
                what=f"reading {path}")
        except (RemoteError, WorkerError) as exc:
            raise PvecleanError(f"{exc} (pmxcfs not answering?)", ExitCode.ACCESS) from None
    return got


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


def _snippet_path(api: Api, volid: str) -> Path | None:
    """Where a snippet volume lives, as the API describes its storage."""
    parsed = parse_volid(volid)
    if parsed is None:
        return None
    storage, name = parsed
    sdir = api.storage(storage).snippets_dir
    return sdir / name if sdir else None


def plan_install(api: Api, cfg: Config, vmids: list[int], all_gpu: bool, storage: str,
                 chain_existing: bool, enable_snippets: bool, systemd: bool = False,
                 kind: str = "lxc") -> Plan:
    """For containers, or with `kind` qemu for VMs (the same script as pveclean-vm-hook)."""
    plan = Plan("install", storage=storage)
    if systemd and kind == "qemu":
        plan.problem("--systemd is for containers (pve-container@.service); a VM's guard is "
                     "its hookscript", ExitCode.USAGE)
        return plan
    here, online = api.local_node(), api.nodes()
    st = api.storage(storage)
    if st.snippets_dir is None:
        plan.problem(f"storage '{storage}' (type {st.type}) has no directory for snippets; "
                     "choose a directory storage (dir, nfs, cifs, cephfs) with --storage")
        return plan
    name = VM_HOOK_NAME if kind == "qemu" else HOOK_NAME
    volid = f"{storage}:snippets/{name}"
    plan.file = st.snippets_dir / name
    plan.text = hook_text(cfg)
    plan.file_action = _file_action(plan, plan.file, plan.text)
    if "snippets" not in st.content:
        content = [c for c in st.content if c != "none"] + ["snippets"]
        if enable_snippets:
            plan.enable_snippets = content
        else:  # PVE::GuestHelpers::check_hookscript checks the path, never the content list
            plan.notes.append(f"storage '{storage}' does not list snippets: the hookscript "
                              "runs anyway, but the GUI and 'pvesm list' do not show it; to "
                              f"show it: pvesm set {storage} --content {','.join(content)} "
                              "(or rerun with --enable-snippets)")
    majors = devnodes.nvidia_majors()
    mappings = _pci_mappings(cfg, here) if kind == "qemu" else {}
    if all_gpu:
        targets = []
        for c, conf in _all(api, plan, online, (kind,)):
            gpu = _passes_gpu(cfg, c, conf, here, majors, mappings)
            again = f"pveclean install {'--all-gpu-vms' if kind == 'qemu' else '--all'}"
            if gpu is None:
                plan.notes.append(f"{c.label} on node {c.node} skipped: its GPUs are known "
                                  f"on its node; run {again} on {c.node}")
            elif gpu and not st.shared and c.node != here:
                plan.notes.append(f"{c.label} on node {c.node} skipped: storage '{storage}' is "
                                  f"not shared; run {again} on {c.node}")
            elif gpu:
                targets.append((c, conf))
        if not targets and not plan.notes:
            plan.notes.append(f"no {'VM' if kind == 'qemu' else 'container'} has NVIDIA GPU "
                              "passthrough in its config")
    else:
        targets = []
        for c, conf in _targets(api, plan, vmids, online, kind=kind):
            if not st.shared and c.node != here:
                plan.problem(f"{c.label} is on node {c.node} and storage '{storage}' is not "
                             f"shared: run pveclean install there, or use --storage with a "
                             "shared storage")
                continue
            if _passes_gpu(cfg, c, conf, here, majors, mappings) is False:
                plan.notes.append(f"{c.label} has no NVIDIA GPU passthrough in its config; "
                                  "registering anyway")
            targets.append((c, conf))
    for c, conf in targets:
        _install_step(api, cfg, plan, c, conf, volid, chain_existing, here)
        if systemd:
            _dropin_step(cfg, plan, c, here)
    return plan


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


def _install_step(api: Api, cfg: Config, plan: Plan, c: Container, conf: pveconf.CtConfig,
                  volid: str, chain_existing: bool, here: str) -> None:
    cur = conf.hookscript
    step = Step(c.vmid, c.node, "set", before=cur, after=volid, digest=conf.digest,
                kind=c.kind)
    rec = chain.read_record(cfg, c.vmid) if c.node == here else None
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
        if c.node != here:
            plan.problem(f"{c.label} is on node {c.node}: --chain records its hookscript "
                         f"{cur} on the node it runs on; run pveclean install --chain there")
            return
        path = _snippet_path(api, cur)
        if path is None or not path.is_file():
            plan.problem(f"{c.label}: its hookscript {cur} is not a file on this node "
                         f"({path or 'not a snippets volume'}); cannot chain it", ExitCode.ACCESS)
            return
        step.action, step.chained, step.chained_path = "chain", cur, str(path)
    elif rec:
        step.chained = rec[0]  # pveclean moved to another storage: the chain stays
    plan.steps.append(step)


def _hookscript_is(api: Api, s: Step, volid: str | None) -> bool:
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
                if not _hookscript_is(api, s, s.after):
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
    _apply_dropins(cfg, plan, out)
    return out


def _apply_dropins(cfg: Config, plan: Plan, out: Outcome) -> None:
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


# ---- uninstall --------------------------------------------------------------------------
def plan_uninstall(api: Api, cfg: Config, vmids: list[int], all_: bool, kind: str = "lxc"
                   ) -> Plan:
    """`vmids` of `kind`; with `all_` every container and VM with pveclean's hookscript."""
    plan = Plan("uninstall")
    here, online = api.local_node(), api.nodes()
    gone: list[int] = []
    seen = (_all(api, plan, online, ("lxc", "qemu")) if all_
            else _targets(api, plan, vmids, online, None if kind == "qemu" else gone, kind))
    removed: set[str] = set()
    still_used: set[str] = set()
    dropin_vmids = set(dropin.installed(cfg)) if all_ else set()
    for vmid in gone:  # destroyed: its drop-in would run for the next container of that VMID
        left = dropin.is_ours(dropin.dropin_path(cfg, vmid)), chain.read_record(cfg, vmid)
        if not any(left):
            plan.problem(f"CT {vmid} does not exist in this cluster, and pveclean left "
                         "nothing for it on this node", ExitCode.ACCESS)
            continue
        plan.notes.append(f"CT {vmid} no longer exists: removing what pveclean left for it "
                          "on this node")
        if left[0]:
            dropin_vmids.add(vmid)
        if left[1]:
            plan.forget_chains.append(vmid)
    for c, _conf in seen:
        if c.kind == "lxc" and c.node == here and dropin.is_ours(dropin.dropin_path(cfg, c.vmid)):
            dropin_vmids.add(c.vmid)
    for vmid in sorted(dropin_vmids):
        for unit in dropin.UNITS:
            unit_file = dropin.dropin_path(cfg, vmid, unit)
            if unit == dropin.UNITS[0] or dropin.is_ours(unit_file):
                plan.dropins.append((vmid, unit_file, "remove", ""))
    for c, conf in seen:
        cur = conf.hookscript
        if not is_pveclean(cur):
            if not all_:
                plan.steps.append(Step(c.vmid, c.node, "skip", before=cur, kind=c.kind,
                                       note=f"hookscript is {cur or 'not set'}, not pveclean's"))
            continue
        if c.node != here:
            if all_:
                plan.notes.append(f"{c.label} on node {c.node} skipped: run pveclean "
                                  "uninstall --all there")
                still_used.add(str(cur))
            else:
                plan.problem(f"{c.label} is on node {c.node}: its chained hookscript (if any) "
                             "is recorded there; run pveclean uninstall there")
            continue
        if c.lock:
            plan.problem(f"{c.label} is locked ({c.lock}); try again when that is over",
                         ExitCode.ACCESS)
            continue
        rec = chain.read_record(cfg, c.vmid)
        if rec:
            plan.steps.append(Step(c.vmid, c.node, "restore", before=cur, after=rec[0],
                                   digest=conf.digest, kind=c.kind))
        else:
            plan.steps.append(Step(c.vmid, c.node, "delete", before=cur, digest=conf.digest,
                                   kind=c.kind))
        removed.add(str(cur))
    if all_ and not any(not up for up in online.values()):
        for volid in sorted(removed - still_used):
            path = _snippet_path(api, volid)
            if path is not None and path.is_file():
                plan.remove_files.append(path)
    return plan


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
            if not _hookscript_is(api, s, want):  # did it go through anyway?
                out.errors.append((f"{who}: {exc}", exc.exit_code))
                continue
            out.done.append(f"{who}: hookscript {want or 'removed'}")
            chain.remove_record(cfg, s.vmid)
    for vmid in plan.forget_chains:
        chain.remove_record(cfg, vmid)
        out.done.append(f"CT {vmid}: its chain record removed")
    _apply_dropins(cfg, plan, out)
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
