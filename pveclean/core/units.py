"""The systemd units behind GPU holders: read from cgroup paths, stopped through `pct exec`.

A holder's unit is read the way systemd's `cg_path_get_unit` reads it: the first component
of its cgroup path that is not a slice (`/lxc/129/ns/system.slice/sglang.service/...` ->
`sglang.service`; for a container only what lies below its `ns/`). Cgroup names below `ns/`
are made by the container's root, so a unit name is container-controlled text: it is
accepted only in systemd's unit-name syntax, never decides what is signalled, and reaches
`systemctl` only as a separate argv element after `--`, inside the container.
"""

from __future__ import annotations

from pveclean.core.lazyre import lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    pass


# systemd's unit_name_is_valid(): prefix of [A-Za-z0-9:_.\-], at most one "@" with a
# non-empty instance (a template itself never runs), a unit type suffix, at most 255 bytes.
_CHARS = r"[A-Za-z0-9:_.\\-]"
_UNIT = lazy(rf"(?:{_CHARS}+)(?:@{_CHARS}+)?\.([a-z]+)")
UNIT_TYPES = ("service", "socket", "target", "device", "mount", "automount", "swap", "timer",
              "path", "slice", "scope")
PROCESS_TYPES = ("service", "scope", "socket", "mount", "swap")  # units that hold processes
UNIT_NAME_MAX = 255


def unit_type(name: str) -> str | None:
    """The type of a valid unit name (`service`, `scope`, ...), None for anything else."""
    if not name or len(name) > UNIT_NAME_MAX or name.startswith("-"):
        return None
    m = _UNIT.fullmatch(name)
    return m.group(1) if m and m.group(1) in UNIT_TYPES else None


def unit_of(cgroup: str | None) -> str | None:
    """The systemd unit a process runs in, from its cgroup v2 path on the host.

    `/lxc/<vmid>/ns/...` is a container's process: its unit is read below `ns/` (the
    container's own systemd tree); any other path is the host's. None where the path is not
    systemd's layout (a container without systemd, `pct exec`'s `ns/.lxc`, LXC's monitor) or
    the first non-slice component is not a valid unit name of a type that holds processes.
    """
    if not cgroup:
        return None
    parts = [p for p in cgroup.split("/") if p and p != "."]
    if parts and parts[0] == "lxc":
        if len(parts) < 3 or parts[2] != "ns":
            return None
        parts = parts[3:]
    for part in parts:
        kind = unit_type(part)
        if kind == "slice":
            continue
        return part if kind in PROCESS_TYPES else None
    return None


def unit_cgroup(cgroup: str, unit: str) -> str | None:
    """The cgroup path of `unit` itself, cut out of a member's path (the unit's components
    and everything above them), or None if the path does not contain it."""
    parts = cgroup.split("/")
    start = 3 if len(parts) > 3 and parts[1] == "lxc" else 0
    for i in range(start, len(parts)):
        if parts[i] == unit:
            return "/".join(parts[: i + 1])
    return None


def refusal(unit: str, init_unit: str | None = None) -> str | None:
    """Why pveclean never stops this unit, or None when it may."""
    kind = unit_type(unit)
    if kind is None:
        return "not a valid systemd unit name"
    if unit == "init.scope" or (init_unit is not None and unit == init_unit):
        return "it holds the container's init (PID 1)"
    if kind == "slice":
        return "a slice (a group of units), never stopped as a whole"
    if kind != "service":
        return f"a {kind} unit: it restarts nothing, and the cleanup ends its holders"
    if unit.startswith("user@"):
        return "a user's service manager: stopping it ends every service of that user"
    return None


def stop_command(vmid: int, units: list[str]) -> list[str]:
    """The `pct` arguments that stop `units` inside the container (each its own argv)."""
    return ["exec", str(vmid), "--", "systemctl", "stop", "--", *units]


def shell_command(vmid: int, units: list[str]) -> str:
    """The line an admin types (names are validated: no quoting or `--` is needed)."""
    return f"pct exec {vmid} -- systemctl stop {' '.join(units)}"
