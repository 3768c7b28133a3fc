"""Chained hookscripts: a container's previous hookscript, kept by `pveclean install --chain`
and run by the hook in every phase (its exit code counts in pre-start)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from .config import Config, ConfigError, check_permissions


def record_path(cfg: Config, vmid: int) -> Path:
    return Path(cfg.state_dir) / "chain" / f"{vmid}"


def read_record(cfg: Config, vmid: int) -> tuple[str, str] | None:
    """(volume id, resolved path) of the chained script, or None."""
    try:
        text = record_path(cfg, vmid).read_text(encoding="utf-8")
    except OSError:
        return None
    parts = text.strip().split("\n")
    if len(parts) != 2 or not parts[1].startswith("/"):
        return None
    return parts[0], parts[1]


def write_record(cfg: Config, vmid: int, volid: str, path: str) -> None:
    p = record_path(cfg, vmid)
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(f"{volid}\n{path}\n", encoding="utf-8")
    os.chmod(tmp, 0o600)
    os.replace(tmp, p)


def remove_record(cfg: Config, vmid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        record_path(cfg, vmid).unlink()


def run_chained(vmid: int, phase: str, cfg: Config) -> int:
    """Run the chained script as Proxmox would; returns its exit code (0 when none)."""
    rec = read_record(cfg, vmid)
    if rec is None:
        return 0
    volid, path = rec
    try:
        st = os.stat(path)
        if cfg.strict_permissions:
            check_permissions(Path(path), st)
    except FileNotFoundError:
        print(f"pveclean: CT {vmid} {phase}: chained hookscript {volid} ({path}) is missing")
        return 1 if phase == "pre-start" else 0
    except ConfigError as exc:
        print(f"pveclean: CT {vmid} {phase}: chained hookscript refused: {exc}")
        return 1 if phase == "pre-start" else 0
    try:
        proc = subprocess.run([path, str(vmid), phase], stdin=subprocess.DEVNULL,
                              timeout=cfg.deadline_seconds, check=False)
    except subprocess.TimeoutExpired:
        print(f"pveclean: CT {vmid} {phase}: chained hookscript {volid} timed out after "
              f"{cfg.deadline_seconds:.0f} s")
        return 1
    except OSError as exc:
        print(f"pveclean: CT {vmid} {phase}: chained hookscript {volid} failed: {exc.strerror}")
        return 1
    if proc.returncode != 0:
        print(f"pveclean: CT {vmid} {phase}: chained hookscript {volid} exited "
              f"{proc.returncode}")
    return proc.returncode
