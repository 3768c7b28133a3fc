"""The systemd drop-in: pveclean around every start and stop of a container's unit.

Every start of a Proxmox container, by `vm_start` or by the restart after a reboot from inside
the guest, goes through `pve-container@<vmid>.service` (src/pve-container@.service:
`ExecStart=/usr/bin/lxc-start -F -n %i`). A reboot from inside the guest runs no hookscript
phase at all (lxc-pve-poststop-hook exits before exec_hookscript; the stop wrapper restarts the
unit, which goes straight to lxc-start). A drop-in's `ExecStartPre=` and `ExecStopPost=` run
on every start and after every stop, that reboot included:

    [Service]
    ExecStartPre=/bin/sh -c '<pveclean> unit -c <config> <vmid> start-pre; ...'
    ExecStopPost=-<pveclean> unit -c <config> <vmid> stop-post

`start-pre` is the hook's pre-start cleanup (leftover GPU holders of the earlier run, empty
leftover cgroups); it exits non-zero only for a refuse decision (pre_start_policy: refuse,
ExitCode.REFUSE), and a small sh wrapper turns every other failure (pveclean or its Python gone,
a crash) into a warning, so only that decision can fail the unit. `stop-post` is the hook's
post-stop leak check, skipped when the hookscript's post-stop already checked this stop; its
`-` prefix means it never fails the unit. Both are cheap when there is nothing to do (no
NVML, no report).
Lean like the hook: no typer, no proxmoxer on this path.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pveclean.core.config import Config
from pveclean.errors import ExitCode, PvecleanError

TYPE_CHECKING = False



MARKER = "# pveclean systemd drop-in"
DROPIN_NAME = "pveclean.conf"
PHASES = ("start-pre", "stop-post")
# `pct start --debug` and `debug: 1` start pve-container-debug@<vmid>.service instead
UNITS = ("pve-container", "pve-container-debug")
STOP_TIMEOUT_S = 120.0  # src/pve-container@.service: TimeoutStopSec=120s (each Exec*Post too)


def within(timeout: float) -> float:
    """What of a unit timeout pveclean's own run may use: the rest is kept for Python's start,
    NVML's init and the report (systemd kills the line at the timeout and fails the unit)."""
    return timeout - max(3.0, timeout * 0.15)


def bound(cfg: Config, phase: str) -> float:
    """The deadline of a drop-in run: the config's, cut to fit the unit's limit."""
    limit = cfg.unit_start_timeout_seconds if phase == "start-pre" else STOP_TIMEOUT_S
    return min(cfg.deadline_seconds, within(limit))
_UNSAFE = set(" \t\n\"'\\$%;`")


def dropin_dir(cfg: Config, vmid: int, unit: str = UNITS[0]) -> Path:
    return Path(cfg.systemd_dir) / f"{unit}@{vmid}.service.d"


def dropin_path(cfg: Config, vmid: int, unit: str = UNITS[0]) -> Path:
    return dropin_dir(cfg, vmid, unit) / DROPIN_NAME


def start_pre_command(vmid: int, bin_path: str, conf: str, unit: str = UNITS[0]) -> str:
    """ExecStartPre= through /bin/sh, like the hookscript shim: only the refuse code fails the
    unit; pveclean missing, its Python gone, a crash or a kill is one warning in the journal
    (the unit's stdout is null, its stderr lxc-start's error log) and the container starts.
    `$$` is systemd's literal `$` (systemd.service, "Command lines")."""
    return (f"/bin/sh -c '{bin_path} unit{conf}{_unit_arg(unit)} {vmid} start-pre; rc=$$?; "
            f"[ $$rc = 0 ] || [ $$rc = {ExitCode.REFUSE} ] || {{ m=\"pveclean: WARNING: CT "
            f"{vmid} start-pre: pveclean failed (exit $$rc); starting without its check\"; "
            "systemd-cat -t pveclean -p warning echo \"$$m\" 2>/dev/null || "
            "logger -t pveclean -p user.warning \"$$m\" 2>/dev/null; rc=0; }; exit $$rc'")


def _unit_arg(unit: str) -> str:
    return "" if unit == UNITS[0] else f" --unit {unit}"


def dropin_text(vmid: int, bin_path: str, config_file: str | None,
                start_timeout: float = 90.0, unit: str = UNITS[0]) -> str:
    """The drop-in for one container's `unit`; paths with characters systemd would interpret
    refused. TimeoutStartSec= is set here: ExecStartPre= runs within it (systemd's default
    is 90 s; pveclean's own run is bound below it, see `bound`)."""
    for value in (bin_path, config_file or ""):
        if _UNSAFE & set(value):
            raise PvecleanError(f"path {value!r} cannot go into a systemd unit", ExitCode.USAGE)
    conf = f" -c {config_file}" if config_file else ""
    return (f"{MARKER}: written by 'pveclean install --systemd', removed by "
            "'pveclean uninstall'.\n"
            f"# Runs pveclean before every start and after every stop of CT {vmid}, the reboot "
            "from inside the guest included (no hookscript phase runs on that one).\n"
            "[Service]\n"
            f"TimeoutStartSec={start_timeout:g}s\n"
            f"ExecStartPre={start_pre_command(vmid, bin_path, conf, unit)}\n"
            f"ExecStopPost=-{bin_path} unit{conf}{_unit_arg(unit)} {vmid} stop-post\n")


def is_ours(path: Path) -> bool:
    try:
        return MARKER in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def installed(cfg: Config) -> list[int]:
    """VMIDs that have pveclean's drop-in under systemd_dir."""
    out = []
    with contextlib.suppress(OSError):
        for d in Path(cfg.systemd_dir).glob("pve-container@*.service.d"):
            vmid = d.name.removeprefix("pve-container@").removesuffix(".service.d")
            if vmid.isdigit() and is_ours(d / DROPIN_NAME):
                out.append(int(vmid))
    return sorted(out)


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Atomically (temp file, fsync, rename; never through a symlink), with `mode`, root's
    when run as root, its directory created. The drop-in and the stamped hookscript."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            os.write(fd, text.encode())
            os.fchmod(fd, mode)
            if os.geteuid() == 0:
                os.fchown(fd, 0, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        raise PvecleanError(f"cannot write {path}: {exc.strerror}", ExitCode.ACCESS) from None


def remove_dropin(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise PvecleanError(f"cannot remove {path}: {exc.strerror}", ExitCode.ACCESS) from None
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # only when nothing else is in it


def daemon_reload(cfg: Config) -> str | None:
    """`systemctl daemon-reload` when the drop-ins are systemd's real ones and systemd runs;
    returns a warning line when it failed."""
    real = {Path("/etc/systemd/system"), Path("/run/systemd/system")}
    if Path(cfg.systemd_dir) not in real or not Path("/run/systemd/system").is_dir():
        return None
    import subprocess

    try:
        res = subprocess.run(["systemctl", "daemon-reload"], capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl daemon-reload failed: {exc}"
    if res.returncode != 0:
        return f"systemctl daemon-reload failed: {res.stderr.strip()[:200]}"
    return None
