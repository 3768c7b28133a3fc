"""What a container started with: its GPU lines as pre-start saw them, for post-stop's leak
check. `lxc-pve-poststop-hook` applies pending config changes (vmconfig_apply_pending)
before the hookscript's post-stop runs, so by then the config file is the next run's: a
`devN` changed or deleted while the container ran would point the check at the wrong GPUs.
`vm_start` applies pending changes before pre-start, so what pre-start reads is what runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from pveclean.core.config import Config
from pveclean.host.wholefile import replace_whole
from pveclean.proxmox import pveconf

MAX_RECORD = 1 << 20  # bytes read back: the state directory is root's, but stay bounded


def record_path(cfg: Config, vmid: int) -> Path:
    return Path(cfg.state_dir) / "started" / f"{vmid}"


BY_HOOK = "# by the hookscript's pre-start"


def write(cfg: Config, vmid: int, gpu_lines: list[str], by_hook: bool) -> None:
    """Best effort: a start never fails for it (post-stop then reads the config). `by_hook`:
    the hookscript's pre-start wrote it (the drop-in's start-pre then need not look again)."""
    head = f"{BY_HOOK}\n" if by_hook else ""
    with contextlib.suppress(OSError):
        replace_whole(record_path(cfg, vmid), head + "".join(f"{line}\n" for line in gpu_lines),
                      f".{vmid}.")


def hook_checked(cfg: Config, vmid: int, within: float) -> bool:
    """Did the hookscript's pre-start check this start? Its record is then younger than
    `within` seconds: vm_start runs pre-start, then `systemctl start`, whose ExecStartPre=
    follows at once (a restart after a reboot inside the guest runs no pre-start)."""
    p = record_path(cfg, vmid)
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            first = fh.readline().rstrip("\n")
        age = time.time() - os.stat(p).st_mtime
    except OSError:
        return False
    return first == BY_HOOK and 0 <= age < within


def started_with(cfg: Config, vmid: int) -> pveconf.CtConfig | None:
    """The GPU lines the container's current (or last) run started with, as a config; None
    when no start was recorded (pveclean came after the start)."""
    try:
        with open(record_path(cfg, vmid), encoding="utf-8", errors="replace") as fh:
            text = fh.read(MAX_RECORD)
    except OSError:
        return None
    return pveconf.parse_config(text, vmid)
