"""Chained hookscripts: a container's previous hookscript, kept by `pveclean install --chain`
and run by the hook in every phase (its exit code counts in pre-start).

It runs as Proxmox would run it (PVE::GuestHelpers::exec_hookscript): the path is resolved
from the volume id on every run (check_hookscript: -f and -x, no owner or mode check) and
there is no timeout (run_command without one), so a script on NFS with root_squash or CIFS
works as it did before `install --chain`. pveclean's own deadline starts after it returns.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pveclean.core.config import Config
from pveclean.host.wholefile import replace_whole
from pveclean.proxmox.snippets import path_in_storage_cfg


def record_path(cfg: Config, vmid: int) -> Path:
    return Path(cfg.state_dir) / "chain" / f"{vmid}"


def read_record(cfg: Config, vmid: int) -> tuple[str, str] | None:
    """(volume id, path at install time) of the chained script, or None."""
    try:
        text = record_path(cfg, vmid).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    parts = text.strip().split("\n")
    if len(parts) != 2 or not parts[1].startswith("/"):
        return None
    return parts[0], parts[1]


def write_record(cfg: Config, vmid: int, volid: str, path: str) -> None:
    replace_whole(record_path(cfg, vmid), f"{volid}\n{path}\n", f".{vmid}.")


def remove_record(cfg: Config, vmid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        record_path(cfg, vmid).unlink()


def _storage_cfg_path(cfg: Config) -> Path:
    """storage.cfg next to the configs' /etc/pve (the lab keeps its own /etc/pve)."""
    d = Path(cfg.pve_config_dir)
    for up in (d, *d.parents):
        if up.name == "pve":
            return up / "storage.cfg"
    return Path("/etc/pve/storage.cfg")


def resolve(cfg: Config, volid: str) -> Path | None:
    """The chained script's path as Proxmox resolves its volume id today; None if unknown."""
    try:
        text = _storage_cfg_path(cfg).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return path_in_storage_cfg(text, volid)


def run_chained(vmid: int, phase: str, cfg: Config, guest: str = "CT") -> int:
    """Run the chained script as Proxmox would; returns its exit code (0 when none).

    A script that is missing, not executable or unreadable is said in one line; in
    pre-start that fails the start, as Proxmox's own check would have (exit 1). `guest`:
    how the lines name the guest (CT, VM)."""
    rec = read_record(cfg, vmid)
    if rec is None:
        return 0
    volid, recorded = rec
    path = str(resolve(cfg, volid) or recorded)
    fail = 1 if phase == "pre-start" else 0
    try:
        if not os.path.isfile(path):
            print(f"pveclean: {guest} {vmid} {phase}: chained hookscript {volid} ({path}) does "
                  "not exist", flush=True)
            return fail
        if not os.access(path, os.X_OK):
            print(f"pveclean: {guest} {vmid} {phase}: chained hookscript {volid} ({path}) is not "
                  "executable", flush=True)
            return fail
        import subprocess  # here: most hooks chain nothing

        proc = subprocess.run([path, str(vmid), phase], stdin=subprocess.DEVNULL, check=False)
    except OSError as exc:
        print(f"pveclean: {guest} {vmid} {phase}: chained hookscript {volid} ({path}) cannot run: "
              f"{exc.strerror or exc}", flush=True)
        return fail
    if proc.returncode != 0:
        print(f"pveclean: {guest} {vmid} {phase}: chained hookscript {volid} exited "
              f"{proc.returncode}", flush=True)
    return proc.returncode
