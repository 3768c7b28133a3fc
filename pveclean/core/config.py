"""Configuration: defaults, the search order of config files, and strict validation.

Unknown keys and wrong types are errors naming the key and its line, because a typo in a
config that controls SIGKILL must never silently fall back to a default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace

from pveclean.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The PATH Proxmox runs hooks and `pct exec` under (and pct's own lookup of a bare command).
HOOK_DIRS = ("/sbin", "/bin", "/usr/sbin", "/usr/bin")
HOOK_PATH = ":".join(HOOK_DIRS)
PHASES = ("pre-start", "post-start", "pre-stop", "post-stop")
PRE_START_POLICIES = ("warn", "refuse")
VM_GPU_POLICIES = ("refuse", "stop-containers")
API_BACKENDS = ("local", "https")
DEFAULT_API: dict[str, Any] = {
    "backend": "local", "host": None, "user": "root@pam", "password_file": None,
    "verify_ssl": True,
}

# Linear time on any input (a container chooses its command lines): each pattern starts at
# most once per word (look-behind or \b), finds its keyword with a look-ahead that does not
# backtrack into the rest, and uses possessive quantifiers (Python 3.11+).
DEFAULT_REDACT = [
    r"(?<![\w-])(?=--[\w-]*?(?:token|password|passwd|secret))(--[\w-]*+[= ])\S++",
    r"(--api[-_]?key[= ])\S++",
    r"\b(?=\w*?(?:TOKEN|KEY|SECRET|PASSWORD))(\w*+=)\S++",
    r"(://[^/\s:@]++:)[^@\s/]++(?P<tail>@)",
]


@dataclass(frozen=True)
class Config:
    """pveclean.yaml, validated: every setting with its default (pveclean.yaml(5))."""

    devices: list[str] = field(default_factory=lambda: ["/dev/nvidia*", "/dev/nvidia-caps/*"])
    report_dir: str = "/var/log/pveclean"
    grace_seconds: float = 10.0
    deadline_seconds: float = 30.0
    # how long after the last holder's exit a run waits for its GPU memory to come back
    # (core/release.py), within deadline_seconds
    release_seconds: float = 30.0
    protect: list[str] = field(
        default_factory=lambda: ["nvidia-persistenced", "nv-hostengine", "nvidia-smi"]
    )
    pct_command: str = "pct"
    pve_config_dir: str = "/etc/pve/lxc"
    state_dir: str = "/var/lib/pveclean"
    systemd_dir: str = "/etc/systemd/system"
    nvml_library: str | None = None
    cgroup_root: str | None = None
    probe: bool = True
    chase_rounds: int = 3
    phases: dict[str, bool] = field(default_factory=lambda: {p: True for p in PHASES})
    pre_start_policy: str = "warn"
    lock_wait_seconds: float = 5.0
    unit_start_timeout_seconds: float = 90.0  # the drop-in's TimeoutStartSec= (systemd's default)
    keep_reports: int = 100
    max_report_age_days: float = 90.0
    report_nothing_to_do: bool = False  # a pre-stop that found nothing writes no report
    redact: list[str] = field(default_factory=lambda: list(DEFAULT_REDACT))
    metrics_path: str | None = None
    syslog: bool = True
    syslog_socket: str = "/dev/log"
    journal_socket: str = "/run/systemd/journal/socket"  # the drop-in's output goes there
    strict_permissions: bool = True
    api: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_API))
    # a VM's pre-start with a GPU passed through: refuse while anything holds it, or stop
    # the containers' holders of it; host processes named here may keep it (never stopped)
    vm_gpu_policy: str = "refuse"
    vm_gpu_allow_host: list[str] = field(default_factory=list)
    vm_gpu_rebind: bool = False  # hand the GPU to vfio-pci at pre-start, back at post-stop
    # a backup of a stopped VM starts it paused (vzdump): that pre-start's policy
    vm_gpu_backup: str = "refuse"
    pci_sysfs: str = "/sys/bus/pci"
    qemu_run_dir: str = "/run/qemu-server"  # qemu-server's pidfiles and PCI reservations
    kmsg_path: str = "/dev/kmsg"  # the kernel log the Xid reader reads (core/xid.py)
    reset_command: str = "nvidia-smi"  # the driver's tool `pveclean reset` runs (-r -i N)
    reset_timeout_seconds: float = 60.0  # its deadline
    systemctl_command: str = "systemctl"  # stops and restarts the GPU's host services
    nvidia_version_file: str = "/proc/driver/nvidia/version"  # the loaded module's (doctor)
    lxc_path: str = "/var/lib/lxc"  # <lxc_path>/<vmid>/rootfs: a mounted container's root
    source: str = "built-in defaults"

    def phase_enabled(self, phase: str) -> bool:
        return self.phases.get(phase, True)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}


def _is_number(v: object) -> bool:
    """A finite number: YAML's .nan and .inf are floats too, and every comparison with a
    NaN is false, so range checks alone would let them through."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _str_list(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


def _api_ok(v: object) -> bool:
    def text(x: object) -> bool:
        return isinstance(x, str) and bool(x.strip())

    checks = {
        "backend": lambda x: x in API_BACKENDS,
        "host": lambda x: x is None or text(x),
        "user": text,
        "password_file": lambda x: x is None or (isinstance(x, str) and x.startswith("/")),
        "verify_ssl": lambda x: isinstance(x, bool) or (isinstance(x, str) and x.startswith("/")),
    }
    return isinstance(v, dict) and all(k in checks and checks[k](x) for k, x in v.items())


# key -> (description of the expected type, check, extra constraint or None)
_SCHEMA: dict[str, tuple[str, Any]] = {
    "devices": ("a list of path globs", _str_list),
    "report_dir": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "grace_seconds": ("a number >= 0", lambda v: _is_number(v) and 0 <= v <= 3600),
    "deadline_seconds": ("a number > 0", lambda v: _is_number(v) and 0 < v <= 3600),
    "release_seconds": ("a number >= 0", lambda v: _is_number(v) and 0 <= v <= 3600),
    "protect": ("a list of process names", _str_list),
    "pct_command": ("a command name or path", lambda v: isinstance(v, str) and bool(v.strip())),
    "state_dir": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "pve_config_dir": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "systemd_dir": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    # absolute, or a bare name ld.so looks up in the system's dirs: never one relative to
    # the working directory, which a hook's and a shell's differ in
    "nvml_library": ("an absolute path, a library name or null",
                     lambda v: v is None or (isinstance(v, str) and bool(v.strip())
                                             and (v.startswith("/") or "/" not in v))),
    "cgroup_root": ("a path or null", lambda v: v is None or isinstance(v, str)),
    "probe": ("true or false", lambda v: isinstance(v, bool)),
    "chase_rounds": ("an integer 0..20", lambda v: type(v) is int and 0 <= v <= 20),
    "phases": (
        "a mapping of phase name to true/false",
        lambda v: isinstance(v, dict)
        and all(k in PHASES and isinstance(b, bool) for k, b in v.items()),
    ),
    "pre_start_policy": ("'warn' or 'refuse'", lambda v: v in PRE_START_POLICIES),
    "lock_wait_seconds": ("a number >= 0", lambda v: _is_number(v) and 0 <= v <= 3600),
    "unit_start_timeout_seconds": ("a number from 5 to 3600",
                                   lambda v: _is_number(v) and 5 <= v <= 3600),
    "keep_reports": ("an integer >= 1", lambda v: type(v) is int and v >= 1),
    "max_report_age_days": ("a number > 0", lambda v: _is_number(v) and v > 0),
    "report_nothing_to_do": ("true or false", lambda v: isinstance(v, bool)),
    "redact": ("a list of regular expressions", _str_list),
    "metrics_path": ("a path or null", lambda v: v is None or isinstance(v, str)),
    "syslog": ("true or false", lambda v: isinstance(v, bool)),
    "syslog_socket": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "journal_socket": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "strict_permissions": ("true or false", lambda v: isinstance(v, bool)),
    "vm_gpu_policy": ("'refuse' or 'stop-containers'", lambda v: v in VM_GPU_POLICIES),
    "vm_gpu_allow_host": ("a list of process names", _str_list),
    "vm_gpu_rebind": ("true or false", lambda v: isinstance(v, bool)),
    "vm_gpu_backup": ("'refuse' or 'stop-containers'", lambda v: v in VM_GPU_POLICIES),
    "pci_sysfs": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "qemu_run_dir": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "kmsg_path": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "reset_command": ("a command name or path", lambda v: isinstance(v, str) and bool(v.strip())),
    "reset_timeout_seconds": ("a number from 1 to 600", lambda v: _is_number(v) and 1 <= v <= 600),
    "systemctl_command": ("a command name or path",
                          lambda v: isinstance(v, str) and bool(v.strip())),
    "nvidia_version_file": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "lxc_path": ("a path", lambda v: isinstance(v, str) and v.startswith("/")),
    "api": (
        "a mapping with backend ('local' or 'https'), host, user, password_file (a path) and "
        "verify_ssl (true, false or a CA file path)",
        _api_ok,
    ),
}


def _check_redact(patterns: list[str], where: str) -> None:

    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ConfigError(
                f"{where}: 'redact' pattern {p!r} is not a valid regex: {exc}"
            ) from None


def parse(text: str, source: str = "<string>") -> Config:
    """Parse and validate config text; raises ConfigError with key and line."""
    values: dict[str, Any] = {}
    for key, line, value in _pyyaml_entries(text, source):
        if key not in _SCHEMA:
            import difflib  # only for the error message

            close = difflib.get_close_matches(key, list(_SCHEMA), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{source} line {line}: unknown key {key!r}{hint}")
        if key in values:
            raise ConfigError(f"{source} line {line}: key '{key}' given twice")
        expected, check = _SCHEMA[key]
        if not check(value):
            raise ConfigError(f"{source} line {line}: '{key}' must be {expected}, got {value!r}")
        if key in ("grace_seconds", "deadline_seconds", "lock_wait_seconds",
                   "unit_start_timeout_seconds", "release_seconds"):
            value = float(value)
        values[key] = value
    if "phases" in values:
        values["phases"] = {**{p: True for p in PHASES}, **values["phases"]}
    if "api" in values:
        values["api"] = {**DEFAULT_API, **values["api"]}
    _check_redact(values.get("redact", []), source)
    return replace(Config(), source=source, **values)


def _pyyaml_entries(text: str, source: str) -> list[tuple[str, int, Any]]:
    """The top-level (key, line, value) entries as PyYAML reads them. The value of a key that
    parse() rejects anyway (unknown, or given twice) is not read: that error comes first."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        node = yaml.compose(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}{line}: {problem}") from None
    if node is None:
        return []
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{source} line {node.start_mark.line + 1}: top level must be a mapping")
    entries: list[tuple[str, int, Any]] = []
    constructor = yaml.constructor.SafeConstructor()
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if not isinstance(key, str):
            raise ConfigError(f"{source} line {line}: unknown key {key!r}")
        value = None
        if key in _SCHEMA and all(k != key for k, _, _ in entries):
            try:
                value = constructor.construct_object(value_node, deep=True)
            except yaml.YAMLError:
                raise ConfigError(
                    f"{source} line {line}: '{key}' has an unreadable value") from None
        entries.append((key, line, value))
    return entries


def dump(cfg: Config) -> str:
    import yaml

    header = f"# effective configuration (from {cfg.source})\n"
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return header + yaml.dump(cfg.as_dict(), Dumper=dumper, sort_keys=False,
                              default_flow_style=False)
