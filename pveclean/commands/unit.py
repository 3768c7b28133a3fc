"""`pveclean unit VMID start-pre|stop-post`: what the systemd drop-in runs (see
proxmox/dropin.py), lean like the hook."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from pveclean.commands.hook import post_stop, pre_start
from pveclean.core.config import Config
from pveclean.errors import ConfigError, ExitCode, PvecleanError
from pveclean.host import reportfiles
from pveclean.host.configfile import load
from pveclean.host.prelude import NvmlWorker
from pveclean.proxmox import pveconf
from pveclean.proxmox.dropin import PHASES


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


def start_pre(vmid: int, cfg: Config, nvml: NvmlWorker) -> int:

    with contextlib.suppress(OSError):
        stamp = _stamp_path(cfg, vmid)
        stamp.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp.write_text("")
        os.utime(stamp)
    code = pre_start(vmid, cfg, nvml, via=via(vmid, "ExecStartPre"))
    return ExitCode.REFUSE if code == ExitCode.REFUSE else 0


def stop_post(vmid: int, cfg: Config, nvml: NvmlWorker) -> int:

    if not _hook_checked_this_stop(cfg, vmid):
        post_stop(vmid, cfg, nvml, via=via(vmid, "ExecStopPost"))
    return 0


def via(vmid: int, line: str) -> str:
    """What a drop-in report says ran it: its phase names the hookscript's it stands in for."""
    return f"systemd drop-in (pve-container@{vmid}.service {line}=)"


def from_argv(argv: list[str], nvml: NvmlWorker) -> int:
    """`pveclean unit [-c FILE] VMID PHASE` without typer: systemd gives it a fixed argv
    (see __main__). `nvml`: the run's NVML worker, made by __main__."""
    args = list(argv)
    config = None
    if len(args) >= 2 and args[0] in ("-c", "--config"):
        config, args = args[1], args[2:]
    elif args and args[0].startswith("--config="):
        config, args = args[0].split("=", 1)[1], args[1:]
    if args and args[0] in ("-h", "--help"):
        print("usage: pveclean unit [-c FILE] VMID start-pre|stop-post")
        return 0
    return main(args, nvml, config)


def main(argv: list[str], nvml: NvmlWorker, config: str | None = None) -> int:
    """`pveclean unit VMID start-pre|stop-post`. Non-zero (ExitCode.REFUSE) only for a refusal."""
    if len(argv) != 2 or argv[1] not in PHASES:
        print("usage: pveclean unit VMID start-pre|stop-post")
        return 0  # a bad drop-in line must not keep a container from starting
    try:
        vmid = pveconf.parse_vmid(argv[0])
    except PvecleanError as exc:
        print(f"pveclean: {exc}")
        return 0
    phase = argv[1]
    try:
        cfg = load(config)
    except ConfigError as exc:
        print(f"pveclean: CT {vmid} unit {phase}: config error, nothing done: {exc}")
        return 0
    if not cfg.phase_enabled("pre-start" if phase == "start-pre" else "post-stop"):
        return 0
    try:
        if phase == "start-pre":
            return start_pre(vmid, cfg, nvml)
        return stop_post(vmid, cfg, nvml)
    except PvecleanError as exc:
        print(f"pveclean: CT {vmid} unit {phase}: {exc}")
    except Exception as exc:  # the unit must never fail for pveclean's own trouble
        print(f"pveclean: CT {vmid} unit {phase}: internal error: {type(exc).__name__}: {exc}")
    finally:
        sys.stdout.flush()
    return 0
