"""Reading Proxmox container configs (/etc/pve/lxc/<vmid>.conf) without `pct`."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from pveclean.core.lazyre import lazy
from pveclean.errors import ExitCode, PvecleanError
from pveclean.proxmox import gpugrant

VMID_MIN, VMID_MAX = 100, 999_999_999
MAX_DEVICES = 256  # dev0..dev255 (PVE::LXC::Config $MAX_DEVICES)

# PVE::LXC::Config::parse_pct_config, line by line: a line is read from its first column
# (Perl's \s is ASCII whitespace: re.ASCII); a section starts only at these headers.
_PENDING = lazy(r"^\[pve:pending\]\s*$", re.IGNORECASE | re.ASCII)
_SNAPSHOT = lazy(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.IGNORECASE | re.ASCII)
_RAW_LINE = lazy(r"^(lxc\.[a-z0-9_\-.]+)(?::|\s*=)\s*(.*?)\s*$", re.ASCII)
_DESCRIPTION = lazy(r"^description:\s*(.*\S)\s*$", re.ASCII)
_SNAPSTATE = lazy(r"snapstate:\s*(prepare|delete)\s*$", re.ASCII)  # not anchored there
_DELETE = lazy(r"^delete:\s*(.*\S)\s*$", re.ASCII)
_KEY_LINE = lazy(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$", re.ASCII)

def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# $confdesc's keys, and its numbered ones (net0..31, mp0..255, unused0..255, dev0..255)
_KEYS = _words("""lock onboot template arch ostype console tty cores cpulimit cpuunits
    memory swap hostname description searchdomain nameserver timezone parent snaptime cmode
    entrypoint protection unprivileged features env hookscript tags debug rootfs""")
_NUMBERED = {"net": 32, "mp": 256, "unused": 256, "dev": MAX_DEVICES}
# is_valid_lxc_conf_key: $valid_lxc_conf_keys, the deprecated names it still accepts, and
# the prefixes it lets through; any other raw key is "unable to parse" and not applied.
_LXC_KEYS = _words("""apparmor.profile apparmor.allow_incomplete apparmor.allow_nesting
    apparmor.raw selinux.context include arch uts.name signal.halt signal.reboot signal.stop
    init.cmd init.cwd init.uid init.gid init.groups pty.max console.logfile console.path tty.max
    devtty.dir hook.autodev autodev kmsg mount.fstab mount.entry mount.auto rootfs.mount
    cap.drop cap.keep seccomp.profile seccomp.notify.proxy seccomp.notify.cookie idmap
    hook.pre-start hook.pre-mount hook.mount hook.start hook.stop hook.post-stop hook.clone
    hook.destroy hook.version log.level log.file start.auto start.delay start.order group
    environment environment.runtime environment.hooks sysctl.fs.mqueue sysctl.kernel.msgmax
    sysctl.kernel.msgmnb sysctl.kernel.msgmni sysctl.kernel.sem sysctl.kernel.shmall
    sysctl.kernel.shmmax sysctl.kernel.shmmni sysctl.kernel.shm_rmid_forced
    aa_profile aa_allow_incomplete console devttydir haltsignal rebootsignal stopsignal id_map
    init_cmd loglevel logfile mount network.type network.flags network.link network.mtu
    network.name network.hwaddr network.ipv4 network.ipv4.gateway network.ipv6
    network.ipv6.gateway network.script.up network.script.down pts se_context seccomp tty
    utsname""")
_LXC_PREFIXES = ("lxc.limit.", "lxc.cgroup.", "lxc.cgroup2.", "lxc.prlimit.", "lxc.net.")
_LXC_REFUSED = {"lxc.rootfs.path": "lxc.rootfs.path is auto generated from rootfs",
                "lxc.rootfs.options": "lxc.rootfs.options is not supported"}


def _known_key(key: str) -> bool:
    """check_type's first test: a key of $confdesc."""
    if key in _KEYS:
        return True
    m = re.fullmatch(r"([a-z]+)(\d+)", key)
    return bool(m and m.group(1) in _NUMBERED and not (len(m.group(2)) > 1
                                                       and m.group(2).startswith("0"))
                and int(m.group(2)) < _NUMBERED[m.group(1)])


def _lxc_key_problem(key: str) -> str | None:
    """Why Proxmox does not pass a raw lxc key on to LXC (is_valid_lxc_conf_key), or None."""
    if key in _LXC_REFUSED:
        return _LXC_REFUSED[key]
    if key.removeprefix("lxc.") in _LXC_KEYS or key.startswith(_LXC_PREFIXES):
        return None
    return "unable to parse config"


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
    """The current config's effective lines: a Proxmox key once, where it last occurs (the
    last occurrence wins), raw `lxc.*` keys each in file order (LXC gets them all). Lines
    Proxmox would not apply are in `rejected` ("line N: why"), never in `lines`;
    `pending` holds the [pve:pending] section's lines (applied by Proxmox at the next stop,
    `delete` included)."""

    vmid: int
    lines: list[tuple[str, str]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    pending: list[tuple[str, str]] = field(default_factory=list)
    digest: str | None = None  # the API's: what a change passes back (assert_if_modified)

    def get(self, key: str) -> str | None:
        for k, v in reversed(self.lines):
            if k == key:
                return v
        return None

    def unapplied(self, most: int = 10) -> list[str]:
        """The rejected lines as a report's warnings, at most `most` of them and a count."""
        said = [f"CT {self.vmid} config {r}; Proxmox does not apply it, nor does pveclean"
                for r in self.rejected[:most]]
        more = len(self.rejected) - most
        return said + ([f"... and {more} more such config lines"] if more > 0 else [])

    @property
    def hookscript(self) -> str | None:
        return self.get("hookscript")

    def gpu(self, nvidia_majors: frozenset[int] = frozenset()) -> gpugrant.GpuGrant:
        """What the config grants of NVIDIA GPUs (proxmox/gpugrant.py)."""
        return gpugrant.grant(self.lines, nvidia_majors)

    def gpu_lines(self, nvidia_majors: frozenset[int] = frozenset()) -> list[str]:
        """The lines that give this container NVIDIA devices."""
        return list(self.gpu(nvidia_majors).lines)

    def gpu_paths(self) -> list[str]:
        """Device paths as the container sees them, from mount entries and devN: lines."""
        return gpugrant.node_paths(self.lines)


def is_gpu_line(key: str, value: str, nvidia_majors: frozenset[int] = frozenset()) -> bool:
    return gpugrant.grant([(key, value)], nvidia_majors).any


def may_use_gpus(conf: CtConfig, majors: frozenset[int]) -> bool:
    """Whether the container's devices cgroup can let it open a GPU node: a passthrough
    line, or a devices rule that allows every device (`a`, `c *:* rwm`)."""
    got = conf.gpu(majors)
    return got.any or got.allow_all


def parse_config(text: str, vmid: int) -> CtConfig:
    """The config as PVE::LXC::Config::parse_pct_config reads it (not strict: a line it
    cannot use is warned about and skipped there, kept in `rejected` here). Snapshot
    sections are skipped; [pve:pending] is kept apart."""
    cfg = CtConfig(vmid)
    section: str | None = ""  # "": current config, "pending", None: a snapshot
    keyed: dict[str, tuple[int, str]] = {}  # a Proxmox key -> (position, value), last wins
    raw: list[tuple[int, str, str]] = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip(" \t\r\f\v"):
            continue
        if _PENDING.match(line):
            section = "pending"
            continue
        if _SNAPSHOT.match(line):
            section = None
            continue
        if section is None or line.startswith("#"):
            continue  # a snapshot's line; a comment (the description's text)
        where = cfg.pending if section == "pending" else None
        m = _RAW_LINE.match(line)
        if m:
            problem = _lxc_key_problem(m.group(1))
            if problem is None and m.group(1) != "lxc.environment.runtime":
                if where is not None:
                    where.append((m.group(1), m.group(2)))
                else:
                    raw.append((n, m.group(1), m.group(2)))
            elif problem is not None and where is None:
                cfg.rejected.append(f"line {n}: {m.group(1)}: {problem}")
            continue
        if _DESCRIPTION.match(line) or _SNAPSTATE.search(line):
            continue
        if _DELETE.match(line):
            if where is not None:
                where.append(("delete", _DELETE.match(line).group(1)))  # type: ignore[union-attr]
            else:
                cfg.rejected.append(f"line {n}: 'delete' is only allowed in [pve:pending]")
            continue
        m = _KEY_LINE.match(line)
        if m is None:
            if where is None:
                cfg.rejected.append(f"line {n}: unable to parse: {line[:200]!r}")
            continue
        key, value = m.group(1), m.group(2)
        if where is not None:
            where.append((key, value))
        elif not _known_key(key):
            cfg.rejected.append(f"line {n}: unknown setting '{key}'")
        elif "\r" in value:
            cfg.rejected.append(f"line {n}: {key}: property contains a line feed")
        else:
            keyed[key] = (n, value)
    merged = [(n, k, v) for k, (n, v) in keyed.items()] + raw
    cfg.lines = [(k, v) for _, k, v in sorted(merged, key=lambda e: e[0])]
    return cfg


_VM_SECTION = lazy(r"^\[[^\]]*\]\s*$", re.ASCII)  # [PENDING], [special:...], snapshots
_VM_KEY_LINE = lazy(r"^([a-z][a-z_\-]*\d*):\s*(.+?)\s*$", re.ASCII)


def parse_vm_config(text: str, vmid: int) -> CtConfig:
    """A VM's current config as PVE::QemuServer::parse_vm_config reads it: the lines before
    the first section header, from the first column, the last occurrence of a key winning
    (its keys may hold '-'; their values are not checked here)."""
    keyed: dict[str, str] = {}
    for line in text.split("\n"):
        if _VM_SECTION.match(line):
            break
        m = _VM_KEY_LINE.match(line)
        if m and not line.startswith("#"):
            keyed.pop(m.group(1), None)
            keyed[m.group(1)] = m.group(2)
    return CtConfig(vmid, list(keyed.items()))


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
