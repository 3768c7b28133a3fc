"""What a container started with: its GPU lines as pre-start saw them, for post-stop's leak
check. `lxc-pve-poststop-hook` applies pending config changes (vmconfig_apply_pending)
before the hookscript's post-stop runs, so by then the config file is the next run's: a
`devN` changed or deleted while the container ran would point the check at the wrong GPUs.
`vm_start` applies pending changes before pre-start, so what pre-start reads is what runs.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pveclean.core.config import Config
from pveclean.proxmox import pveconf

MAX_RECORD = 1 << 20  # bytes read back: the state directory is root's, but stay bounded


def record_path(cfg: Config, vmid: int) -> Path:
    return Path(cfg.state_dir) / "started" / f"{vmid}"


def write(cfg: Config, vmid: int, gpu_lines: list[str]) -> None:
    """Best effort: a start never fails for it (post-stop then reads the config)."""
    p = record_path(cfg, vmid)
    with contextlib.suppress(OSError):
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = p.with_name(f".{vmid}.{os.getpid()}.tmp")
        tmp.write_text("".join(f"{line}\n" for line in gpu_lines), encoding="utf-8")
        os.replace(tmp, p)


def started_with(cfg: Config, vmid: int) -> pveconf.CtConfig | None:
    """The GPU lines the container's current (or last) run started with, as a config; None
    when no start was recorded (pveclean came after the start)."""
    try:
        with open(record_path(cfg, vmid), encoding="utf-8", errors="replace") as fh:
            text = fh.read(MAX_RECORD)
    except OSError:
        return None
    return pveconf.parse_config(text, vmid)
