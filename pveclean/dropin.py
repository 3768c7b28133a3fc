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
EXIT_REFUSE), and a small sh wrapper turns every other failure (pveclean or its Python gone,
a crash) into a warning, so only that decision can fail the unit. `stop-post` is the hook's
post-stop leak check, skipped when the hookscript's post-stop already checked this stop; its
`-` prefix means it never fails the unit. Both are cheap when there is nothing to do (no
NVML, no report).
Lean like the hook: no typer, no proxmoxer on this path.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from . import pveconf, report
from .config import Config, ConfigError, load
from .model import EXIT_ACCESS, EXIT_REFUSE, EXIT_USAGE, PvecleanError

MARKER = "# pveclean systemd drop-in"
DROPIN_NAME = "pveclean.conf"
PHASES = ("start-pre", "stop-post")
_UNSAFE = set(" \t\n\"'\\$%;`")


def dropin_dir(cfg: Config, vmid: int) -> Path:
    return Path(cfg.systemd_dir) / f"pve-container@{vmid}.service.d"


def dropin_path(cfg: Config, vmid: int) -> Path:
    return dropin_dir(cfg, vmid) / DROPIN_NAME


def start_pre_command(vmid: int, bin_path: str, conf: str) -> str:
    """ExecStartPre= through /bin/sh, like the hookscript shim: only the refuse code fails the
    unit; pveclean missing, its Python gone, a crash or a kill is one warning line and the
    container starts. `$$` is systemd's literal `$` (systemd.service, "Command lines")."""
    return (f"/bin/sh -c '{bin_path} unit{conf} {vmid} start-pre; rc=$$?; "
            f"[ $$rc = 0 ] || [ $$rc = {EXIT_REFUSE} ] || {{ echo \"pveclean: WARNING: CT "
            f"{vmid} start-pre: pveclean failed (exit $$rc); starting without its check\"; "
            "rc=0; }; exit $$rc'")


def dropin_text(vmid: int, bin_path: str, config_file: str | None) -> str:
    """The drop-in for one container; paths with characters systemd would interpret refused."""
    for value in (bin_path, config_file or ""):
        if _UNSAFE & set(value):
            raise PvecleanError(f"path {value!r} cannot go into a systemd unit", EXIT_USAGE)
    conf = f" -c {config_file}" if config_file else ""
    return (f"{MARKER}: written by 'pveclean install --systemd', removed by "
            "'pveclean uninstall'.\n"
            f"# Runs pveclean before every start and after every stop of CT {vmid}, the reboot "
            "from inside the guest included (no hookscript phase runs on that one).\n"
            "[Service]\n"
            f"ExecStartPre={start_pre_command(vmid, bin_path, conf)}\n"
            f"ExecStopPost=-{bin_path} unit{conf} {vmid} stop-post\n")


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
        raise PvecleanError(f"cannot write {path}: {exc.strerror}", EXIT_ACCESS) from None


def remove_dropin(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise PvecleanError(f"cannot remove {path}: {exc.strerror}", EXIT_ACCESS) from None
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


def _stamp_path(cfg: Config, vmid: int) -> Path:
    return Path(cfg.state_dir) / "unit" / f"{vmid}.started"


def _hook_checked_this_stop(cfg: Config, vmid: int) -> bool:
    """Did the hookscript's post-stop write a report since this unit run started?"""
    try:
        started = _stamp_path(cfg, vmid).stat().st_mtime
    except OSError:
        return False
    for path in reversed(report.list_reports(cfg.report_dir, vmid)):
        if "-post-stop-" in path.name:
            with contextlib.suppress(OSError):
                return path.stat().st_mtime >= started
            return False
    return False


def start_pre(vmid: int, cfg: Config) -> int:
    from .hook import pre_start

    with contextlib.suppress(OSError):
        stamp = _stamp_path(cfg, vmid)
        stamp.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp.write_text("")
        os.utime(stamp)
    code = pre_start(vmid, cfg, via=via(vmid, "ExecStartPre"))
    return EXIT_REFUSE if code == EXIT_REFUSE else 0


def stop_post(vmid: int, cfg: Config) -> int:
    from .hook import post_stop

    if not _hook_checked_this_stop(cfg, vmid):
        post_stop(vmid, cfg, via=via(vmid, "ExecStopPost"))
    return 0


def via(vmid: int, line: str) -> str:
    """What a drop-in report says ran it: its phase names the hookscript's it stands in for."""
    return f"systemd drop-in (pve-container@{vmid}.service {line}=)"


def from_argv(argv: list[str]) -> int:
    """`pveclean unit [-c FILE] VMID PHASE` without typer (see __main__)."""
    args = list(argv)
    config = None
    if len(args) >= 2 and args[0] in ("-c", "--config"):
        config, args = args[1], args[2:]
    elif args and args[0].startswith("--config="):
        config, args = args[0].split("=", 1)[1], args[1:]
    if args and args[0] in ("-h", "--help"):
        print("usage: pveclean unit [-c FILE] VMID start-pre|stop-post")
        return 0
    return main(args, config)


def main(argv: list[str], config: str | None = None) -> int:
    """`pveclean unit VMID start-pre|stop-post`. Non-zero (EXIT_REFUSE) only for a refusal."""
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
            return start_pre(vmid, cfg)
        return stop_post(vmid, cfg)
    except PvecleanError as exc:
        print(f"pveclean: CT {vmid} unit {phase}: {exc}")
    except Exception as exc:  # the unit must never fail for pveclean's own trouble
        print(f"pveclean: CT {vmid} unit {phase}: internal error: {type(exc).__name__}: {exc}")
    finally:
        sys.stdout.flush()
    return 0
