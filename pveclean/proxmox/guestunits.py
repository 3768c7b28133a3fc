"""The systemd units inside a container: stopped through `pct exec ... systemctl stop`, watched
from the host through their cgroups, and the hints that name them in a report."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from pveclean.core.text import safe
from pveclean.core.unitgroups import units_of
from pveclean.core.units import shell_command, stop_command, unit_cgroup, unit_of
from pveclean.core.verdicts import STOPPED, Outcome
from pveclean.host import cgroupfs
from pveclean.proxmox.pct import PctMissing, run_pct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.amendments import UnitStop, UnitStops
    from pveclean.core.config import Config
    from pveclean.core.records import Deadline, Discovery, Holder, Scope
    from pveclean.core.report import Report

STOP_MAX_SECONDS = 20.0  # one `systemctl stop` never takes longer (and never half the run)


def processes_in(cgroup_root: Path, cgroup: str | None, until: float | None = None
                 ) -> int | None:
    """How many processes the unit's cgroup tree holds now (None: not known: a tree not
    walked whole, within the cgroup cap and by `until`, monotonic)."""
    if not cgroup:
        return None
    try:
        tree = cgroupfs.tree_pids(cgroup_root / cgroup.lstrip("/"), until=until)
    except (OSError, RecursionError):  # a tree the container nested too deep to walk
        return None
    return None if tree.truncated else len(tree)


RESTART_POLL = 0.02  # s between looks at the cgroups of services that may come back


def await_restarts(holders: list[Holder], cgroup_root: Path, until: float) -> None:
    """systemd starts a service again RestartSec (100 ms by default) after its main process
    exits, later than a clean result must hold: until `until` (monotonic), look at the
    cgroups of the services whose holders were signalled, and return as soon as one has a
    process again, so that its hint names it (see hints)."""
    cgroups = {cg for h in holders if h.outcome in STOPPED and h.unit
               and h.unit.endswith(".service") and (cg := unit_cgroup(h.cgroup, h.unit))}
    while cgroups and time.monotonic() < until:
        if any(processes_in(cgroup_root, cg, until) for cg in cgroups):
            return
        time.sleep(min(RESTART_POLL, max(until - time.monotonic(), 0.0)))


def init_unit_of(init_pid: int | None) -> str | None:
    return unit_of(cgroupfs.pid_cgroup(init_pid)) if init_pid else None


def stop_units(vmid: int, holders: list[Holder], init_pid: int | None, cgroup_root: Path,
               pct_command: str, timeout: float, dry_run: bool = False) -> UnitStops:
    """Stop the systemd units of the container's GPU holders with one
    `pct exec VMID -- systemctl stop -- UNIT...`, bounded by `timeout`, and say per unit
    what happened (judged from the host: is the unit's cgroup empty now?)."""
    from pveclean.core.amendments import UnitStop, UnitStops  # --stop-units only

    init_unit = init_unit_of(init_pid)
    infos = units_of(holders, init_unit)
    if not holders:
        return UnitStops(note=f"CT {vmid} has no GPU holders: no unit to stop")
    if not infos:
        return UnitStops(note=f"no GPU holder of CT {vmid} runs in a systemd unit (no systemd "
                              "in the container, or its holders run outside units): nothing to "
                              "stop; cleaning up as usual")
    wanted = sorted(u for u, i in infos.items() if i.refused is None)
    units: list[UnitStop] = []
    for unit in sorted(infos):
        i = infos[unit]
        entry = UnitStop(unit, sorted(i.pids))
        if i.refused:
            entry = dataclasses.replace(entry, action="not stopped", detail=i.refused)
        elif dry_run:
            entry = dataclasses.replace(entry, action="would stop", detail="dry run")
        units.append(entry)
    command = shell_command(vmid, wanted) if wanted else None
    if not wanted or dry_run:
        return UnitStops(units, command)
    until = time.monotonic() + timeout  # systemctl, then the units' walks: within `timeout`
    try:
        res = run_pct(pct_command, stop_command(vmid, wanted), timeout)
        rc, err = res.returncode, (res.stderr.strip().splitlines() or [""])[-1]
    except PctMissing as exc:
        rc, err = -1, str(exc)
    units = [u if u.action else _judged(u, processes_in(cgroup_root, infos[u.unit].cgroup,
                                                        until), rc, err, vmid, timeout)
             for u in units]
    note = None
    if rc not in (0, None) and all(u.action == "failed" for u in units if u.unit in wanted):
        note = (f"systemctl stop failed in CT {vmid} (exit {rc}: {safe(err, 160)}); "
                "no systemd there? cleaning up as usual")
    return UnitStops(units, command, note, ran=True, exit=rc)


def _judged(u: UnitStop, left: int | None, rc: int | None, err: str, vmid: int,
            timeout: float) -> UnitStop:
    """One unit after `systemctl stop` (exit `rc`, None: timed out), `left` processes in
    its cgroup (None: not known)."""
    if rc is None:
        action, detail = "timed out", f"systemctl stop did not finish within {timeout:.1f} s"
    elif left == 0:
        action, detail = "stopped", "its cgroup is empty"
    elif rc == 0 and left is None:
        action, detail = "unverified", "systemctl stop succeeded; its cgroup could not be read"
    elif rc == 0:
        action, detail = "incomplete", f"{left} process(es) left in its cgroup"
    else:
        action, detail = "failed", (f"systemctl stop failed in CT {vmid} (exit {rc}): "
                                    f"{safe(err, 160)}; cleaning up as usual")
    return dataclasses.replace(u, action=action, detail=detail, processes_left=left,
                               looked=True)


def hints(vmid: int, holders: list[Holder], cgroup_root: Path, dry_run: bool,
          stopped: set[str], manual: bool = False, until: float | None = None) -> list[str]:
    """For units whose holders respawned, or that still run
    after the cleanup: the exact command that stops them (units already stopped by
    --stop-units are left out). After a
    manual cleanup also for services whose holders were stopped and are not back yet: one
    with a RestartSec= longer than the run waited (RESTART_WATCH) brings them back later,
    and systemd's state of it cannot be read from the host without a `pct exec`."""
    out: list[str] = []
    for unit, info in sorted(units_of(holders, None).items()):
        if info.refused or unit in stopped:
            continue
        members = [h for h in holders if h.unit == unit]
        respawned = any(h.respawned_by or h.round or h.outcome == Outcome.SURVIVED
                        for h in members)
        left = processes_in(cgroup_root, info.cgroup, until)
        if respawned:
            why = "restarted its GPU holders"
        elif dry_run:
            why = "runs GPU holders"
        elif left:
            why = f"is still active ({left} process(es) in its cgroup)"
        elif manual and unit.endswith(".service") and any(
                h.outcome in STOPPED for h in members):
            why = ("ran the GPU holders stopped now, and starts them again later if it has "
                   "Restart=")
        else:
            continue
        out.append(f"{unit} in CT {vmid} {why}; stop it with: {shell_command(vmid, [unit])}"
                   f" (or: pveclean ct {vmid} --stop-units)")
    return out


def before_stop(vmid: int, cfg: Config, scope: Scope, disc: Discovery, deadline: Deadline,
                dry_run: bool, progress: Callable[[str], None] | None) -> UnitStops:
    """`pveclean ct --stop-units`: stop the discovered holders' units before any signal,
    within half of what is left of the run (at most STOP_MAX_SECONDS)."""
    from pveclean.core.amendments import UnitStops

    if not scope.running:
        return UnitStops(note=f"CT {vmid} is not running: no systemd to ask; cleaning up as "
                              "usual")
    timeout = max(min(deadline.remaining() / 2, STOP_MAX_SECONDS), 0.5)
    if progress and not dry_run and any(h.unit for h in disc.holders):
        progress(f"stopping the holders' systemd units in CT {vmid} (at most {timeout:.0f} s)")
    return stop_units(vmid, disc.holders, disc.init_pid, scope.cgroup_dir.parent.parent,
                      cfg.pct_command, timeout, dry_run)


def annotate(rep: Report, scope: Scope, unit_stops: UnitStops | None,
             until: float | None = None) -> Report:
    """The report with what --stop-units did, and hints naming the units still at work (the
    units' trees walked by `until`, monotonic: the run's deadline)."""
    stopped = unit_stops.stopped() if unit_stops is not None else set()
    found = hints(rep.vmid, rep.holders, scope.cgroup_dir.parent.parent, rep.dry_run, stopped,
                  manual=rep.phase == "manual", until=until)
    return rep.with_units(unit_stops, found)
