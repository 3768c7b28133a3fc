"""The systemd units behind GPU holders: read from cgroup paths, stopped through `pct exec`.

A holder's unit is read the way systemd's `cg_path_get_unit` reads it: the first component
of its cgroup path that is not a slice (`/lxc/129/ns/system.slice/sglang.service/...` ->
`sglang.service`; for a container only what lies below its `ns/`). Cgroup names below `ns/`
are made by the container's root, so a unit name is container-controlled text: it is
accepted only in systemd's unit-name syntax, never decides what is signalled, and reaches
`systemctl` only as a separate argv element after `--`, inside the container.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import procfs
from .text import safe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .config import Config
    from .discover import Deadline, Scope
    from .model import Discovery, Holder

# systemd's unit_name_is_valid(): prefix of [A-Za-z0-9:_.\-], at most one "@" with a
# non-empty instance (a template itself never runs), a unit type suffix, at most 255 bytes.
_CHARS = r"[A-Za-z0-9:_.\\-]"
_UNIT = re.compile(rf"(?:{_CHARS}+)(?:@{_CHARS}+)?\.([a-z]+)")
UNIT_TYPES = ("service", "socket", "target", "device", "mount", "automount", "swap", "timer",
              "path", "slice", "scope")
PROCESS_TYPES = ("service", "scope", "socket", "mount", "swap")  # units that hold processes
UNIT_NAME_MAX = 255
STOP_MAX_SECONDS = 20.0  # one `systemctl stop` never takes longer (and never half the run)


def unit_type(name: str) -> str | None:
    """The type of a valid unit name (`service`, `scope`, ...), None for anything else."""
    if not name or len(name) > UNIT_NAME_MAX or name.startswith("-"):
        return None
    m = _UNIT.fullmatch(name)
    return m.group(1) if m and m.group(1) in UNIT_TYPES else None


def unit_of(cgroup: str | None) -> str | None:
    """The systemd unit a process runs in, from its cgroup v2 path on the host.

    `/lxc/<vmid>/ns/...` is a container's process: its unit is read below `ns/` (the
    container's own systemd tree); any other path is the host's. None where the path is not
    systemd's layout (a container without systemd, `pct exec`'s `ns/.lxc`, LXC's monitor) or
    the first non-slice component is not a valid unit name of a type that holds processes.
    """
    if not cgroup:
        return None
    parts = [p for p in cgroup.split("/") if p and p != "."]
    if parts and parts[0] == "lxc":
        if len(parts) < 3 or parts[2] != "ns":
            return None
        parts = parts[3:]
    for part in parts:
        kind = unit_type(part)
        if kind == "slice":
            continue
        return part if kind in PROCESS_TYPES else None
    return None


def unit_cgroup(cgroup: str, unit: str) -> str | None:
    """The cgroup path of `unit` itself, cut out of a member's path (the unit's components
    and everything above them), or None if the path does not contain it."""
    parts = cgroup.split("/")
    start = 3 if len(parts) > 3 and parts[1] == "lxc" else 0
    for i in range(start, len(parts)):
        if parts[i] == unit:
            return "/".join(parts[: i + 1])
    return None


def refusal(unit: str, init_unit: str | None = None) -> str | None:
    """Why pveclean never stops this unit, or None when it may."""
    kind = unit_type(unit)
    if kind is None:
        return "not a valid systemd unit name"
    if unit == "init.scope" or (init_unit is not None and unit == init_unit):
        return "it holds the container's init (PID 1)"
    if kind == "slice":
        return "a slice (a group of units), never stopped as a whole"
    if kind != "service":
        return f"a {kind} unit: it restarts nothing, and the cleanup ends its holders"
    if unit.startswith("user@"):
        return "a user's service manager: stopping it ends every service of that user"
    return None


def stop_command(vmid: int, units: list[str]) -> list[str]:
    """The `pct` arguments that stop `units` inside the container (each its own argv)."""
    return ["exec", str(vmid), "--", "systemctl", "stop", "--", *units]


def shell_command(vmid: int, units: list[str]) -> str:
    """The line an admin types (names are validated: no quoting or `--` is needed)."""
    return f"pct exec {vmid} -- systemctl stop {' '.join(units)}"


@dataclass
class UnitInfo:
    unit: str
    cgroup: str | None  # the unit's own cgroup path on the host
    pids: list[int]
    refused: str | None = None


def _get(h: Any, key: str) -> Any:
    return h.get(key) if isinstance(h, dict) else getattr(h, key, None)


def _collect(holders: list[Any], init_unit: str | None) -> dict[str, UnitInfo]:
    """Units of the holders (model.Holder or their report dicts) and who runs in each."""
    found: dict[str, UnitInfo] = {}
    for h in holders:
        unit = _get(h, "unit")
        if not unit:
            continue
        info = found.setdefault(unit, UnitInfo(unit, unit_cgroup(_get(h, "cgroup") or "", unit),
                                               [], refusal(unit, init_unit)))
        pid = int(_get(h, "host_pid"))
        info.pids.append(pid)
        protected = _get(h, "protected")
        if protected and info.refused is None:
            info.refused = f"it runs a protected holder (PID {pid}: {protected})"
    return found


def processes_in(cgroup_root: Path, cgroup: str | None) -> int | None:
    """How many processes the unit's cgroup tree holds now (None: not known)."""
    if not cgroup:
        return None
    try:
        return len(procfs.tree_pids(cgroup_root / cgroup.lstrip("/")))
    except (OSError, RecursionError):  # a tree the container nested too deep to walk
        return None


RESTART_POLL = 0.02  # s between looks at the cgroups of services that may come back


def await_restarts(holders: list[Holder], cgroup_root: Path, until: float) -> None:
    """systemd starts a service again RestartSec (100 ms by default) after its main process
    exits, later than a clean result must hold: until `until` (monotonic), look at the
    cgroups of the services whose holders were signalled, and return as soon as one has a
    process again, so that its hint names it (see hints)."""
    cgroups = {cg for h in holders if h.outcome in ("terminated", "killed") and h.unit
               and h.unit.endswith(".service") and (cg := unit_cgroup(h.cgroup, h.unit))}
    while cgroups and time.monotonic() < until:
        if any(processes_in(cgroup_root, cg) for cg in cgroups):
            return
        time.sleep(min(RESTART_POLL, max(until - time.monotonic(), 0.0)))


def init_unit_of(init_pid: int | None) -> str | None:
    return unit_of(procfs.pid_cgroup(init_pid)) if init_pid else None


def stop_units(vmid: int, holders: list[Any], init_pid: int | None, cgroup_root: Path,
               pct_command: str, timeout: float, dry_run: bool = False) -> dict[str, Any]:
    """Stop the systemd units of the container's GPU holders with one
    `pct exec VMID -- systemctl stop -- UNIT...`, bounded by `timeout`, and say per unit
    what happened (judged from the host: is the unit's cgroup empty now?)."""
    init_unit = init_unit_of(init_pid)
    infos = _collect(holders, init_unit)
    out: dict[str, Any] = {"units": [], "command": None, "note": None}
    if not holders:
        out["note"] = f"CT {vmid} has no GPU holders: no unit to stop"
        return out
    if not infos:
        out["note"] = (f"no GPU holder of CT {vmid} runs in a systemd unit (no systemd in the "
                       "container, or its holders run outside units): nothing to stop; "
                       "cleaning up as usual")
        return out
    wanted = sorted(u for u, i in infos.items() if i.refused is None)
    for unit in sorted(infos):
        i = infos[unit]
        entry: dict[str, Any] = {"unit": unit, "holders": sorted(i.pids)}
        if i.refused:
            entry.update(action="not stopped", detail=i.refused)
        elif dry_run:
            entry.update(action="would stop", detail="dry run")
        out["units"].append(entry)
    if not wanted or dry_run:
        if wanted:
            out["command"] = shell_command(vmid, wanted)
        return out
    out["command"] = shell_command(vmid, wanted)
    from .pct import PctMissing, run_pct  # here: a holder's unit_of() is read in the scan

    try:
        res = run_pct(pct_command, stop_command(vmid, wanted), timeout)
        rc, err = res.returncode, (res.stderr.strip().splitlines() or [""])[-1]
    except PctMissing as exc:
        rc, err = -1, str(exc)
    out["exit"] = rc
    for entry in out["units"]:
        if entry.get("action"):
            continue
        left = processes_in(cgroup_root, infos[entry["unit"]].cgroup)
        entry["processes_left"] = left
        if rc is None:
            entry.update(action="timed out",
                         detail=f"systemctl stop did not finish within {timeout:.1f} s")
        elif left == 0:
            entry.update(action="stopped", detail="its cgroup is empty")
        elif rc == 0 and left is None:
            entry.update(action="unverified", detail="systemctl stop succeeded; its cgroup "
                                                     "could not be read")
        elif rc == 0:
            entry.update(action="incomplete", detail=f"{left} process(es) left in its cgroup")
        else:
            entry.update(action="failed",
                         detail=f"systemctl stop failed in CT {vmid} (exit {rc}): "
                                f"{safe(err, 160)}; cleaning up as usual")
    if rc not in (0, None) and all(e.get("action") == "failed" for e in out["units"]
                                   if e["unit"] in wanted):
        out["note"] = (f"systemctl stop failed in CT {vmid} (exit {rc}: {safe(err, 160)}); "
                       "no systemd there? cleaning up as usual")
    return out


def hints(vmid: int, holders: list[dict[str, Any]], cgroup_root: Path, dry_run: bool,
          stopped: set[str], manual: bool = False) -> list[str]:
    """For units whose holders respawned, or that still run after the cleanup: the exact
    command that stops them (units already stopped by --stop-units are left out). After a
    manual cleanup also for services whose holders were stopped and are not back yet: one
    with a RestartSec= longer than the run waited (RESTART_WATCH) brings them back later,
    and systemd's state of it cannot be read from the host without a `pct exec`."""
    out: list[str] = []
    for unit, info in sorted(_collect(holders, None).items()):
        if info.refused or unit in stopped:
            continue
        members = [h for h in holders if h.get("unit") == unit]
        respawned = any(h.get("respawned_by") or h.get("round") or h.get("outcome") ==
                        "survived" for h in members)
        left = processes_in(cgroup_root, info.cgroup)
        if respawned:
            why = "restarted its GPU holders"
        elif dry_run:
            why = "runs GPU holders"
        elif left:
            why = f"is still active ({left} process(es) in its cgroup)"
        elif manual and unit.endswith(".service") and any(
                h.get("outcome") in ("terminated", "killed") for h in members):
            why = ("ran the GPU holders stopped now, and starts them again later if it has "
                   "Restart=")
        else:
            continue
        out.append(f"{unit} in CT {vmid} {why}; stop it with: {shell_command(vmid, [unit])}"
                   f" (or: pveclean ct {vmid} --stop-units)")
    return out


def before_stop(vmid: int, cfg: Config, scope: Scope, disc: Discovery, deadline: Deadline,
                dry_run: bool, progress: Callable[[str], None] | None) -> dict[str, Any]:
    """`pveclean ct --stop-units`: stop the discovered holders' units before any signal,
    within half of what is left of the run (at most STOP_MAX_SECONDS)."""
    if not scope.running:
        return {"units": [], "command": None,
                "note": f"CT {vmid} is not running: no systemd to ask; cleaning up as usual"}
    timeout = max(min(deadline.remaining() / 2, STOP_MAX_SECONDS), 0.5)
    if progress and not dry_run and any(h.unit for h in disc.holders):
        progress(f"stopping the holders' systemd units in CT {vmid} (at most {timeout:.0f} s)")
    return stop_units(vmid, disc.holders, disc.init_pid, scope.cgroup_dir.parent.parent,
                      cfg.pct_command, timeout, dry_run)


def annotate(rep: dict[str, Any], scope: Scope, unit_stops: dict[str, Any] | None) -> None:
    """Add what --stop-units did, and hints naming the units still at work, to a report."""
    stopped: set[str] = set()
    if unit_stops is not None:
        rep["unit_stops"] = unit_stops
        stopped = {u["unit"] for u in unit_stops["units"] if u.get("action") == "stopped"}
        rep["summary"]["units_stopped"] = sorted(stopped)
    found = hints(int(rep["vmid"]), rep.get("holders", []), scope.cgroup_dir.parent.parent,
                  bool(rep.get("dry_run")), stopped, manual=rep.get("phase") == "manual")
    if found:
        rep["hints"] = found
