"""`pveclean unit VMID start-pre|stop-post`: what the systemd drop-in runs (see
proxmox/dropin.py), lean like the hook."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path

from pveclean.commands import hook, xidhook
from pveclean.commands.hook import post_stop, pre_start
from pveclean.core.config import Config
from pveclean.errors import ConfigError, ExitCode, PvecleanError
from pveclean.host import journal, reportfiles
from pveclean.host.configfile import load
from pveclean.host.prelude import NvmlWorker
from pveclean.proxmox import pveconf, startrecord
from pveclean.proxmox.dropin import PHASES, UNITS, bound


def _stamp_path(cfg: Config, vmid: int) -> Path:
    return Path(cfg.state_dir) / "unit" / f"{vmid}.started"


def _hook_checked_this_stop(cfg: Config, vmid: int) -> bool:
    """Did the hookscript's post-stop write a report since this unit run started?"""
    try:
        started = _stamp_path(cfg, vmid).stat().st_mtime
    except OSError:
        return False
    for path in reversed(reportfiles.list_reports(cfg.report_dir, vmid)):
        if "-post-stop-" in path.name:
            with contextlib.suppress(OSError):
                return path.stat().st_mtime >= started
            return False
    return False


HOOK_TO_UNIT_S = 30.0  # s from the hook's pre-start to the unit's start-pre of one start


def start_pre(vmid: int, cfg: Config, nvml: NvmlWorker, unit: str = UNITS[0]) -> int:
    """The hook's pre-start, unless the hookscript's pre-start checked this very start (one
    check and one report per start: vm_start runs the hook, then starts the unit)."""
    with contextlib.suppress(OSError):
        stamp = _stamp_path(cfg, vmid)
        stamp.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp.write_text("")
        os.utime(stamp)
    if startrecord.hook_checked(cfg, vmid, HOOK_TO_UNIT_S):
        return 0
    xid_refused = xidhook.before_phase(vmid, "pre-start", cfg, hook.say)  # issue 41
    code = pre_start(vmid, cfg, nvml, via=via(vmid, "ExecStartPre", unit))
    return ExitCode.REFUSE if code == ExitCode.REFUSE or xid_refused else 0


def stop_post(vmid: int, cfg: Config, nvml: NvmlWorker, unit: str = UNITS[0]) -> int:

    if not _hook_checked_this_stop(cfg, vmid):
        xidhook.before_phase(vmid, "post-stop", cfg, hook.say)  # issue 41: the Xid pass
        post_stop(vmid, cfg, nvml, via=via(vmid, "ExecStopPost", unit))
    return 0


def via(vmid: int, line: str, unit: str = UNITS[0]) -> str:
    """What a drop-in report says ran it: its phase names the hookscript's it stands in for."""
    return f"systemd drop-in ({unit}@{vmid}.service {line}=)"


def from_argv(argv: list[str], nvml: NvmlWorker) -> int:
    """`pveclean unit [-c FILE] VMID PHASE` without typer: systemd gives it a fixed argv
    (see __main__). `nvml`: the run's NVML worker, made by __main__."""
    args = list(argv)
    config = None
    if len(args) >= 2 and args[0] in ("-c", "--config"):
        config, args = args[1], args[2:]
    elif args and args[0].startswith("--config="):
        config, args = args[0].split("=", 1)[1], args[1:]
    unit = UNITS[0]
    if len(args) >= 2 and args[0] == "--unit" and args[1] in UNITS:
        unit, args = args[1], args[2:]
    return main(args, nvml, config, unit)


def _to_journal(socket_path: str, vmid: int | None, phase: str | None) -> hook.Sink:
    """The unit's stdout is null and its stderr lxc-start's error log: lines go to the
    journal (journalctl -u pve-container@<vmid>), with the VMID and phase as fields."""
    fields = {"PVECLEAN_VMID": str(vmid), "PVECLEAN_PHASE": f"unit {phase}"} if vmid else {}

    def sink(text: str, priority: str) -> None:
        journal.send(text, priority, fields, socket_path)

    return sink


def under_systemd() -> bool:
    """Whether systemd runs this (it sets INVOCATION_ID for every unit's processes)."""
    return bool(os.environ.get("INVOCATION_ID"))


def _usage(tell: hook.Sink, message: str) -> int:
    """A bad argument: under systemd said in the journal and exit 0 (a bad drop-in line must
    not keep a container from starting); by hand on stderr with exit 2, as every command."""
    if under_systemd():
        tell(message, "warning")
        return 0
    sys.stderr.write(f"{message}\n")
    return ExitCode.USAGE


def main(argv: list[str], nvml: NvmlWorker, config: str | None = None,
         unit: str = UNITS[0]) -> int:
    """`pveclean unit VMID start-pre|stop-post`. Non-zero (ExitCode.REFUSE) only for a refusal.
    Says everything in the journal: nothing to stdout or stderr."""
    try:
        cfg = load(config)
    except ConfigError as exc:  # said where a journal normally is
        return _usage(_to_journal(journal.JOURNAL_SOCKET, None, None),
                      f"pveclean unit {' '.join(argv)[:100]}: config error, nothing done: {exc}")
    tell = _to_journal(cfg.journal_socket, None, None)
    if len(argv) != 2 or argv[1] not in PHASES:
        return _usage(tell, f"pveclean unit: bad arguments {argv!r}: usage: pveclean unit "
                      "VMID start-pre|stop-post; nothing done")
    try:
        vmid = pveconf.parse_vmid(argv[0])
    except PvecleanError as exc:
        return _usage(tell, f"pveclean: {exc}")
    phase = argv[1]
    tell = _to_journal(cfg.journal_socket, vmid, phase)
    hook.redirect(tell)
    if not cfg.phase_enabled("pre-start" if phase == "start-pre" else "post-stop"):
        return 0
    cfg = dataclasses.replace(cfg, deadline_seconds=bound(cfg, phase))  # within the unit's
    try:
        if phase == "start-pre":
            return start_pre(vmid, cfg, nvml, unit)
        return stop_post(vmid, cfg, nvml, unit)
    except PvecleanError as exc:
        tell(f"pveclean: CT {vmid} unit {phase}: {exc}", "warning")
    except Exception as exc:  # the unit must never fail for pveclean's own trouble
        tell(f"pveclean: CT {vmid} unit {phase}: internal error: {type(exc).__name__}: {exc}",
             "err")
    finally:
        hook.redirect(None)
    return 0
