"""`pveclean vmhook VMID PHASE`: the hookscript of a VM that passes an NVIDIA GPU through
(`pveclean install --vm`). Its pre-start finds every holder of the VM's GPUs and, by
`vm_gpu_policy`, refuses the start naming each, or stops the containers' holders of those
GPUs (the same cleanup as `pveclean ct`, one report per container) and verifies through NVML
that nothing is left on them; with `vm_gpu_rebind` it then hands each GPU's IOMMU group to
vfio-pci, and its post-stop gives them back to their drivers.

qemu-server runs the hookscript as containers' (PVE::GuestHelpers::exec_hookscript): pre-start
in vm_start_nolock under the config lock, fatal; post-stop from vm_stop_cleanup or `qm
cleanup`. As for containers, only ExitCode.REFUSE fails the start (the shim turns every other
status into a warning), and a failure of pveclean itself never keeps a VM from starting.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pveclean.core import vmguard
from pveclean.core.config import Config
from pveclean.core.gpumap import GpuMap
from pveclean.core.pci import PciAddress, sysfs_order
from pveclean.core.text import safe
from pveclean.core.vmreport import CtStop, VmReport, VmVerdict
from pveclean.errors import ConfigError, ExitCode, PvecleanError
from pveclean.host import pcibind
from pveclean.host.clock import start_deadline
from pveclean.host.prelude import NvmlWorker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from pveclean.core.records import Deadline
    from pveclean.core.vmreport import Moved
    from pveclean.host.worker import Worker

    T = TypeVar("T")

SETTLE_POLL = 0.2  # s between looks while a stopped holder's GPU memory is released


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: list[str], nvml: NvmlWorker) -> int:
    """Never raises: every failure is one line in the task log, and only a decision refuses."""
    from pveclean.proxmox.pveconf import parse_vmid

    if len(argv) != 2:  # usage errors on stderr, as `pveclean hook`'s (the task log has both)
        sys.stderr.write("pveclean: usage: pveclean vmhook VMID PHASE (see 'pveclean vmhook "
                         "-h')\n")
        return ExitCode.USAGE
    try:
        vmid = parse_vmid(argv[0])
    except PvecleanError as exc:
        sys.stderr.write(f"pveclean: {exc}\n")
        return ExitCode.USAGE
    phase = argv[1]
    try:
        from pveclean.host.configfile import load

        cfg = load()
    except ConfigError as exc:
        say(f"pveclean: VM {vmid} {phase}: config error, nothing done: {exc}")
        return 0
    if phase == "give-back":  # by hand: a stranded hand-off (pveclean vmhook VMID give-back)
        return _give_back_by_hand(vmid, cfg)
    # The VM's own previous hookscript (install --vm --chain) runs first in every phase, as it
    # did before pveclean; one that fails pre-start refuses the start, and then pveclean stops
    # nothing for a start that will not happen.
    if _chained(vmid, phase, cfg) != 0 and phase == "pre-start":
        say(f"pveclean: VM {vmid} pre-start: refusing to start: the chained hookscript failed")
        return ExitCode.REFUSE
    try:
        if phase == "pre-start" and cfg.phase_enabled(phase):
            return pre_start(vmid, cfg, nvml)
        if phase == "post-stop" and cfg.phase_enabled(phase):
            post_stop(vmid, cfg)
    except PvecleanError as exc:
        say(f"pveclean: VM {vmid} {phase}: {safe(exc, 300)}; nothing done")
    except Exception as exc:  # never a traceback in the task log, never a failed start
        say(f"pveclean: VM {vmid} {phase}: internal error: {type(exc).__name__}: "
            f"{safe(exc, 300)}")
    return 0


def _chained(vmid: int, phase: str, cfg: Config) -> int:
    """The chained hookscript's exit code; a failure to run it is said, not fatal."""
    from pveclean.proxmox import chain

    try:
        return chain.run_chained(vmid, phase, cfg, guest="VM")
    except Exception as exc:
        say(f"pveclean: VM {vmid} {phase}: chained hookscript not run: "
            f"{type(exc).__name__}: {safe(exc, 300)}")
        return 0


def _look(cfg: Config, deadline: Deadline) -> GpuMap:
    """`pveclean gpus`' map of the host, in a worker bounded by the deadline."""
    from pveclean.commands.gpus import look_once

    return look_once(cfg, Path(cfg.pci_sysfs) / "devices",
                     max(deadline.remaining() - 0.5, 0.5), "reading the host's GPUs")


def _settled(cfg: Config, addrs: list[PciAddress], deadline: Deadline
             ) -> tuple[GpuMap, list[str]]:
    """_look(), and again while memory on the VM's GPUs is still being released (issue 38:
    commands/vmrelease.py); the lines for memory still falling when time ran out."""
    from pveclean.commands.vmrelease import settle

    return settle(_look(cfg, deadline), addrs, lambda: _look(cfg, deadline), deadline)


def _call(wk: Worker, fn: Callable[..., T], *args: object, deadline: Deadline, what: str) -> T:
    from pveclean.host.worker import RemoteError, WorkerError

    try:
        got: T = wk.call(fn, *args, timeout=max(deadline.remaining() - 0.5, 0.5), what=what)
        return got
    except (WorkerError, RemoteError) as exc:
        raise PvecleanError(str(exc)) from None


def pre_start(vmid: int, cfg: Config, nvml: NvmlWorker) -> int:
    from pveclean.host.worker import Worker
    from pveclean.proxmox import passthrough, vmtake

    deadline = start_deadline(cfg.deadline_seconds)
    pve = str(Path(cfg.pve_config_dir).parent)
    with Worker() as scan:
        take = _call(scan, vmtake.w_vm_take, pve, vmid, cfg.pci_sysfs, cfg.qemu_run_dir,
                     os.environ.get("PVE_MIGRATED_FROM"), deadline=deadline,
                     what="reading the VM's config")
        if take is None or not take.nvidia:
            return 0  # no NVIDIA GPU passed through (or no VM of that id here): not ours
        for line in take.notes + ([f"the start will fail: {take.fails}"] if take.fails else []):
            say(f"pveclean: VM {vmid} pre-start: {line}")
        drivers = take.drivers
        if not drivers:
            return 0  # nothing the start unbinds: nothing to guard
        addrs = sorted(drivers, key=sysfs_order)
        say(f"pveclean: VM {vmid} pre-start: checking who holds {_listed(addrs)} (the IOMMU "
            "group qemu-server unbinds)")
        gmap, releasing = _settled(cfg, addrs, deadline)  # issue 38: a slow release
        minors = {g.minor: g.pci_bus_id for g in gmap.gpus
                  if g.pci_bus_id is not None and g.pci_bus_id in addrs and g.minor is not None}
        keeping = _call(scan, passthrough.w_keeping, cfg.pve_config_dir, minors,
                        deadline=deadline, what="reading the containers' configs")
    reservations = {a: r.vmid for a, r in vmtake.reservations(Path(cfg.qemu_run_dir)).items()}
    policy = _policy(vmid, cfg)
    plan = vmguard.plan(vmguard.VmStart(vmid, addrs, reservations, keeping, drivers), gmap,
                        policy, cfg.vm_gpu_allow_host)
    for line in plan.notes:
        say(f"pveclean: VM {vmid} pre-start: {line}")
    record = VmReport(vmid, "pre-start", os.uname().nodename, 0.0, policy, plan=plan)
    if plan.decision is vmguard.Decision.REFUSE:
        for line in [*releasing, *plan.blockers]:
            say(f"pveclean: VM {vmid} pre-start: refusing to start: {line}")
        return _finish(cfg, record, VmVerdict.REFUSED, ExitCode.REFUSE, deadline=deadline)
    if plan.persistence:
        from pveclean.commands import vmpersist

        failed = vmpersist.turn_off(cfg, vmid, gmap, plan.persistence,
                                    max(min(deadline.remaining() - 1.0, 10.0), 0.5))
        if failed:
            for line in failed:
                say(f"pveclean: VM {vmid} pre-start: refusing to start: {line}")
            _persistence_back(vmid, cfg, "pre-start")  # those it did turn off
            return _finish(cfg, record, VmVerdict.REFUSED, ExitCode.REFUSE, deadline=deadline)
    if plan.decision is vmguard.Decision.STOP or plan.persistence:
        record, left = _stop_holders(vmid, cfg, nvml, plan, deadline, record)
        if left:
            for line in left:
                say(f"pveclean: VM {vmid} pre-start: refusing to start: {line}")
            if plan.persistence:  # the start is refused: no post-stop will turn it back on
                _persistence_back(vmid, cfg, "pre-start")
            return _finish(cfg, record, VmVerdict.RESIDUAL, ExitCode.REFUSE, deadline=deadline)
        say(f"pveclean: VM {vmid} pre-start: GPU {_listed(addrs)} verified free")
    if cfg.vm_gpu_rebind:
        _give_back_stranded(vmid, cfg, {str(a) for a in drivers})
        record = record.with_rebind(_rebind(vmid, cfg, take.groups, deadline))
    return _finish(cfg, record, VmVerdict.CLEAR if plan.decision is vmguard.Decision.CLEAR
                   else VmVerdict.STOPPED, ExitCode.OK, deadline=deadline)


def _policy(vmid: int, cfg: Config) -> str:
    """vm_gpu_policy, or vm_gpu_backup when the start is a backup's (a vzdump task starts a
    stopped VM paused: enforce_vm_running_for_backup; its devices are bound all the same)."""
    from pveclean.proxmox import tasks

    task = tasks.running_task()
    if task is None or task.type != "vzdump":
        return cfg.vm_gpu_policy
    say(f"pveclean: VM {vmid} pre-start: a backup's start (vzdump): vm_gpu_backup "
        f"{cfg.vm_gpu_backup} applies")
    return cfg.vm_gpu_backup


def _listed(addrs: list[PciAddress]) -> str:
    return ", ".join(map(str, addrs))


def _stop_holders(vmid: int, cfg: Config, nvml: NvmlWorker, plan: vmguard.Plan,
                  deadline: Deadline, record: VmReport) -> tuple[VmReport, list[str]]:
    """Each container's holders of the VM's GPUs stopped as `pveclean ct` stops them (and only
    those); then the GPUs looked at until nothing holds them, or the deadline. Returns the
    record with each container's run, and what is still held."""
    from pveclean.cleanup import RunOptions, clean

    for ct, only in sorted(plan.stop.items()):
        say(f"pveclean: VM {vmid} pre-start: stopping CT {ct}'s holders of GPU "
            f"{', '.join(str(i) for i in sorted(only[0]))}, grace {cfg.grace_seconds:g} s")
        res = clean(ct, cfg, nvml.warm(cfg, ct), RunOptions(phase="vm-start", only=only),
                    deadline)
        rep = res.report
        record = record.with_stop(ct, CtStop(str(rep.verdict),
                                             None if res.path is None else str(res.path)))
        say(f"pveclean: VM {vmid} pre-start: CT {ct}: {rep.verdict}; "
            f"{res.path or 'no report written'}")
    addrs = [t.address for t in plan.targets]
    while True:
        left = vmguard.still_held(addrs, _look(cfg, deadline), cfg.vm_gpu_allow_host)
        if not left or deadline.remaining() < 1.0:
            return record, left
        time.sleep(SETTLE_POLL)


def _rebind(vmid: int, cfg: Config, addrs: list[PciAddress], deadline: Deadline,
            fs: pcibind.Sysfs | None = None) -> dict[str, Moved | str]:
    """Each GPU's IOMMU group to vfio-pci, in a worker (an unbind can block in the driver);
    what was moved is kept in the state dir for post-stop. A failure is said and undone; the
    start goes on (qemu-server binds on its own, and says why when it cannot). `fs`: the
    sysfs (default: cfg.pci_sysfs)."""
    from pveclean.host.worker import Worker

    fs = fs or pcibind.Sysfs(cfg.pci_sysfs)

    out: dict[str, Moved | str] = {}
    done = []
    with Worker() as wk:
        for address in addrs:
            addr = str(address)  # sysfs' name of the device
            try:
                got = _call(wk, pcibind.w_bind, fs, addr, deadline=deadline,
                            what=f"binding {addr} to vfio-pci")
            except PvecleanError as exc:
                got = f"{exc} (the worker was given up on: the driver may still hold it)"
            if isinstance(got, str):
                say(f"pveclean: VM {vmid} pre-start: WARNING: {addr} not handed to vfio-pci: "
                    f"{got}")
                out[addr] = got
                continue
            say(f"pveclean: VM {vmid} pre-start: {addr} and its IOMMU group on vfio-pci")
            out[addr] = got
            done.append(got)
    if done:
        from pveclean.commands import vmhandoff

        vmhandoff.add(cfg, vmid, done)
    return out


def post_stop(vmid: int, cfg: Config, fs: pcibind.Sysfs | None = None) -> None:
    """The GPUs pre-start handed to vfio-pci, back to the drivers they had; persistence
    back on for those pre-start turned it off for."""
    fs = fs or pcibind.Sysfs(cfg.pci_sysfs)
    try:
        _give_back(vmid, cfg, fs)
    finally:
        _persistence_back(vmid, cfg)


def _persistence_back(vmid: int, cfg: Config, phase: str = "post-stop") -> None:
    from pveclean.commands import vmpersist

    if not vmpersist.read_record(cfg, vmid):
        return
    deadline = start_deadline(cfg.deadline_seconds)
    for line in vmpersist.restore(cfg, vmid, _look(cfg, deadline),
                                  max(min(deadline.remaining() - 1.0, 10.0), 0.5)):
        say(f"pveclean: VM {vmid} {phase}: {line}")


def _give_back_stranded(vmid: int, cfg: Config, taken: set[str],
                        fs: pcibind.Sysfs | None = None) -> None:
    """Other VMs' stranded hand-offs (vmhandoff.stranded) given back now: qemu-server runs no
    post-stop after a start that failed past pre-start, nor on a migration's source."""
    from pveclean.commands import vmhandoff

    for other in vmhandoff.stranded(cfg, vmid, taken):
        say(f"pveclean: VM {vmid} pre-start: VM {other}'s hand-off is stranded (no QEMU, no "
            "reservation): giving it back")
        _give_back(other, cfg, fs or pcibind.Sysfs(cfg.pci_sysfs))


def _give_back_by_hand(vmid: int, cfg: Config, fs: pcibind.Sysfs | None = None) -> int:
    """`pveclean vmhook VMID give-back`: VM `vmid`'s recorded hand-off back to its drivers
    (and its persistence back on) when the VM runs no QEMU and holds no reservation; a
    running or starting VM keeps its GPUs."""
    from pveclean.commands import vmhandoff, vmpersist
    from pveclean.proxmox import vmtake

    run = Path(cfg.qemu_run_dir)
    held = any(r.vmid == vmid for r in vmtake.reservations(run).values())
    try:
        recorded = vmhandoff.read(cfg, vmid) is not None or bool(vmpersist.read_record(cfg,
                                                                                      vmid))
        if not recorded:
            say(f"pveclean: VM {vmid} give-back: nothing recorded; nothing to do")
        elif held or vmtake.qemu_running(run, vmid):
            say(f"pveclean: VM {vmid} give-back: the VM runs or is starting: its GPUs stay")
        else:
            post_stop(vmid, cfg, fs)
    except PvecleanError as exc:
        say(f"pveclean: VM {vmid} give-back: {safe(exc, 300)}; nothing done")
    return 0


def _give_back(vmid: int, cfg: Config, fs: pcibind.Sysfs) -> None:
    """Each recorded group back to its drivers, but one another VM reserved or has open
    (kept); one that fails stays recorded, and the report says `give-back failed`."""
    from pveclean.commands import vmhandoff
    from pveclean.host.worker import Worker

    if vmhandoff.read(cfg, vmid) is None:
        return
    give, keep = vmhandoff.plan(cfg, vmid)
    deadline = start_deadline(cfg.deadline_seconds)
    given_back: dict[str, list[str]] = {}
    left = [g for g, _ in keep]
    for g, why in keep:
        say(f"pveclean: VM {vmid} post-stop: {g.address} left on vfio-pci ({why}); kept for "
            "a later give-back")
    with Worker() as wk:
        for g in give:
            h = vmhandoff.as_handoff(g)
            try:
                failed = _call(wk, pcibind.w_give_back, fs, h, deadline=deadline,
                               what=f"giving {h.address} back")
            except PvecleanError as exc:
                failed = [str(exc)]
            given_back[h.address] = failed
            if failed:
                left.append(g)
            say(f"pveclean: VM {vmid} post-stop: {h.address} "
                + ("back on " + ", ".join(f"{f}: {d}" for f, d in h.before.items())
                   if not failed else f"NOT given back: {'; '.join(failed)} (kept)"))
    vmhandoff.write(cfg, vmid, left)
    record = VmReport(vmid, "post-stop", os.uname().nodename, 0.0, cfg.vm_gpu_policy,
                      given_back=given_back)
    verdict = (VmVerdict.GIVE_BACK_FAILED if any(given_back.values())
               else VmVerdict.GIVEN_BACK)
    _finish(cfg, record, verdict, ExitCode.OK, deadline=deadline)


def _finish(cfg: Config, record: VmReport, outcome: VmVerdict, code: int,
            deadline: Deadline | None = None) -> int:
    """The VM's report (kind: vm), written as the containers' are: in a worker, within
    REPORT_WAIT at least (a report dir on a hung NFS mount blocks there, not the start); a
    report that cannot be written is said, never a failed start by itself."""
    from pveclean.cleanup import REPORT_WAIT
    from pveclean.host import reportfiles
    from pveclean.host.worker import RemoteError, Worker, WorkerError

    rep = record.finished(outcome, time.time())
    vmid, phase = rep.vmid, rep.phase
    wait = max(deadline.remaining() if deadline else 0.0, REPORT_WAIT)
    with Worker() as wk:
        try:
            path = wk.call(reportfiles.write, rep.as_dict(), cfg.report_dir,
                           reportfiles.report_name(vmid, phase, rep.started), timeout=wait,
                           what="writing the report")
            say(f"pveclean: VM {vmid} {phase}: {outcome}; report {path}")
        except (RemoteError, WorkerError) as exc:
            why = exc.message(reportfiles.ReportError) if isinstance(exc, RemoteError) else exc
            say(f"pveclean: VM {vmid} {phase}: {outcome}; WARNING: report not written: {why}")
    return code
