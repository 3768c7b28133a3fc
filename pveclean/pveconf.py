"""Reading Proxmox container configs (/etc/pve/lxc/<vmid>.conf) without `pct`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .model import EXIT_ACCESS, EXIT_USAGE, PvecleanError

VMID_MIN, VMID_MAX = 100, 999_999_999
_DEV_KEY = re.compile(r"^dev\d{1,3}$")
_ALLOW = re.compile(r"^\s*c\s+(\d+|\*):(\d+|\*)\s+[rwm]+\s*$")


def parse_vmid(text: str) -> int:
    """A Proxmox VMID: an integer 100..999999999 (pve-common's pve-vmid format)."""
    t = text.strip()
    # ASCII only: str.isdigit() accepts '²' and Arabic-Indic digits, which int() then reads
    if not (t.isascii() and t.isdigit()) or (len(t) > 1 and t.startswith("0")):
        raise PvecleanError(f"invalid VMID {text!r}: expected a number {VMID_MIN}..{VMID_MAX}",
                            EXIT_USAGE)
    vmid = int(t)
    if not VMID_MIN <= vmid <= VMID_MAX:
        raise PvecleanError(f"invalid VMID {vmid}: must be {VMID_MIN}..{VMID_MAX}", EXIT_USAGE)
    return vmid


@dataclass
class CtConfig:
    vmid: int
    lines: list[tuple[str, str]] = field(default_factory=list)

    def get(self, key: str) -> str | None:
        for k, v in self.lines:
            if k == key:
                return v
        return None

    @property
    def hookscript(self) -> str | None:
        return self.get("hookscript")

    def gpu_lines(self, nvidia_majors: frozenset[int] = frozenset()) -> list[str]:
        """The passthrough lines that give this container NVIDIA devices."""
        return [f"{k}: {v}" for k, v in self.lines if is_gpu_line(k, v, nvidia_majors)]

    def gpu_paths(self) -> list[str]:
        """Device paths as the container sees them, from mount entries and devN: lines."""
        paths: list[str] = []
        for k, v in self.lines:
            if k == "lxc.mount.entry":
                parts = v.split()
                if len(parts) >= 2 and "nvidia" in parts[0]:
                    paths.append("/" + parts[1].lstrip("/"))
            elif _DEV_KEY.match(k):
                opts = dict(o.split("=", 1) for o in v.split(",")[1:] if "=" in o)
                src = v.split(",")[0]
                if src.startswith("path="):
                    src = src[5:]
                if "nvidia" in src:
                    paths.append(opts.get("path", src))
        return paths


def is_gpu_line(key: str, value: str, nvidia_majors: frozenset[int] = frozenset()) -> bool:
    if key == "lxc.mount.entry":
        return value.split()[0].startswith("/dev/nvidia") if value.split() else False
    if _DEV_KEY.match(key):
        src = value.split(",")[0]
        return (src[5:] if src.startswith("path=") else src).startswith("/dev/nvidia")
    if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
        m = _ALLOW.match(value)
        return bool(m and m.group(1).isdigit() and int(m.group(1)) in ({195} | nvidia_majors))
    return False


def parse_config(text: str, vmid: int) -> CtConfig:
    """`key: value` lines of the current config; snapshot/pending sections are skipped."""
    cfg = CtConfig(vmid)
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            break
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            key, sep, value = line.partition("=")
        if sep and key.strip():
            cfg.lines.append((key.strip(), value.strip()))
    return cfg


def config_path(config_dir: str, vmid: int) -> Path:
    return Path(config_dir) / f"{vmid}.conf"


def read_config(config_dir: str, vmid: int) -> CtConfig:
    path = config_path(config_dir, vmid)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise PvecleanError(f"CT {vmid} does not exist on this node (no {path})") from None
    except OSError as exc:
        raise PvecleanError(f"cannot read {path}: {exc.strerror}", EXIT_ACCESS) from None
    return parse_config(text, vmid)


def list_vmids(config_dir: str) -> list[int]:
    out = []
    try:
        for p in Path(config_dir).glob("*.conf"):
            if p.stem.isdigit():
                out.append(int(p.stem))
    except OSError:
        return []
    return sorted(out)
