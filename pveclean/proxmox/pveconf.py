"""Reading Proxmox container configs (/etc/pve/lxc/<vmid>.conf) without `pct`."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from pveclean.errors import ExitCode, PvecleanError

VMID_MIN, VMID_MAX = 100, 999_999_999
_DEV_KEY = re.compile(r"^dev\d{1,3}$")
_ALLOW_ANY = re.compile(r"^\s*(a\b|[cb*]\s+\*:\*)")  # every device
_ALLOW = re.compile(r"^\s*c\s+(\d+|\*):(\d+|\*)\s+[rwm]+\s*$")
# PVE::LXC::Config::parse_pct_config: raw lxc keys as `lxc.key: value` or `lxc.key = value`,
# the others as `key: value`.
_RAW_LINE = re.compile(r"^(lxc\.[a-z0-9_\-.]+)(?::|\s*=)\s*(.*?)\s*$")
_KEY_LINE = re.compile(r"^([a-z][a-z_]*\d*):\s*(.*?)\s*$")


def dev_path(value: str) -> str:
    """The host path of a `devN:` value: `path` is the property string's default key, so
    `/dev/nvidia0,gid=44` and `mode=0666,path=/dev/nvidia0` both name /dev/nvidia0
    (PVE::LXC::Config's dev format, parsed by PVE::JSONSchema::parse_property_string)."""
    bare = ""
    for opt in value.split(","):
        opt = opt.strip()
        if opt.startswith("path="):
            return opt[5:]
        if opt and "=" not in opt and not bare:
            bare = opt
    return bare


def parse_vmid(text: str) -> int:
    """A Proxmox VMID: an integer 100..999999999 (pve-common's pve-vmid format)."""
    t = text.strip()
    # ASCII only: str.isdigit() accepts '²' and Arabic-Indic digits, which int() then reads
    if not (t.isascii() and t.isdigit()) or (len(t) > 1 and t.startswith("0")):
        raise PvecleanError(f"invalid VMID {text!r}: expected a number {VMID_MIN}..{VMID_MAX}",
                            ExitCode.USAGE)
    vmid = int(t)
    if not VMID_MIN <= vmid <= VMID_MAX:
        raise PvecleanError(f"invalid VMID {vmid}: must be {VMID_MIN}..{VMID_MAX}", ExitCode.USAGE)
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
                src = dev_path(v)
                if "nvidia" in src:
                    paths.append(src)  # bind-mounted at the same path inside
        return paths


def is_gpu_line(key: str, value: str, nvidia_majors: frozenset[int] = frozenset()) -> bool:
    if key == "lxc.mount.entry":
        return value.split()[0].startswith("/dev/nvidia") if value.split() else False
    if _DEV_KEY.match(key):
        return dev_path(value).startswith("/dev/nvidia")
    if key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
        m = _ALLOW.match(value)
        return bool(m and m.group(1).isdigit() and int(m.group(1)) in ({195} | nvidia_majors))
    return False


def may_use_gpus(conf: CtConfig, majors: frozenset[int]) -> bool:
    """Whether the container's devices cgroup can let it open a GPU node: a passthrough
    line, or a devices rule that allows every device (`a`, `c *:* rwm`)."""
    if conf.gpu_lines(majors):
        return True
    return any(k in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
               and _ALLOW_ANY.match(v) for k, v in conf.lines)


def parse_config(text: str, vmid: int) -> CtConfig:
    """`key: value` lines of the current config; snapshot/pending sections are skipped."""
    cfg = CtConfig(vmid)
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            break
        if not line or line.startswith("#"):
            continue
        m = _RAW_LINE.match(line) or _KEY_LINE.match(line)
        if m:
            cfg.lines.append((m.group(1), m.group(2)))
            continue
        key, sep, value = line.partition(":")  # a key Proxmox would reject: kept as is
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
        msg, code = not_here(config_dir, vmid)
        raise PvecleanError(msg, code) from None
    except OSError as exc:
        raise PvecleanError(f"cannot read {path}: {exc.strerror}", ExitCode.ACCESS) from None
    return parse_config(text, vmid)


def w_read_config(config_dir: str, vmid: int) -> CtConfig | tuple[str, int]:
    """read_config in a worker (see cleanup.read_ct_config): the config, or (why, exit code)."""
    try:
        return read_config(config_dir, vmid)
    except PvecleanError as exc:
        return str(exc), exc.exit_code


def elsewhere(config_dir: str, vmid: int) -> tuple[str, str] | None:
    """Where a VMID that has no container config here lives: ("vm", node or "") for a
    QEMU VM, ("ct", node) for a container on another node. Every node's configs are
    visible under /etc/pve/nodes/<node>/{lxc,qemu-server}/ (pmxcfs); /etc/pve/lxc and
    /etc/pve/qemu-server are links to this node's directories."""
    pve = Path(config_dir).parent
    with contextlib.suppress(OSError):
        if (pve / "qemu-server" / f"{vmid}.conf").is_file():
            return "vm", ""
    here = None
    with contextlib.suppress(OSError):
        here = Path(config_dir).resolve()
    try:
        nodes = sorted(pve.joinpath("nodes").iterdir())
    except OSError:
        return None
    for node in nodes:
        with contextlib.suppress(OSError):
            if (node / "qemu-server" / f"{vmid}.conf").is_file():
                return "vm", node.name
            ct = node / "lxc" / f"{vmid}.conf"
            if ct.is_file() and (node / "lxc").resolve() != here:
                return "ct", node.name
    return None


def not_here(config_dir: str, vmid: int) -> tuple[str, int]:
    """Why a VMID has no container config on this node and what to run instead, with the
    exit code: ExitCode.USAGE (2) for a VM, ExitCode.ACCESS (3) for a container not on this node."""
    where = elsewhere(config_dir, vmid)
    if where is None:
        return (f"CT {vmid} does not exist on this node "
                f"(no {config_path(config_dir, vmid)})", ExitCode.ACCESS)
    kind, node = where
    if kind == "vm":
        on = f" on node {node}" if node else ""
        return (f"VMID {vmid} is a virtual machine (QEMU){on}, not a container: pveclean "
                "handles LXC containers only; a VM's passed-through GPU is freed when the "
                f"VM stops (qm stop {vmid})", ExitCode.USAGE)
    return f"CT {vmid} is on node {node}: run 'pveclean ct {vmid}' there", ExitCode.ACCESS


def list_vmids(config_dir: str) -> list[int]:
    out = []
    try:
        for p in Path(config_dir).glob("*.conf"):
            if p.stem.isdigit():
                out.append(int(p.stem))
    except OSError:
        return []
    return sorted(out)
