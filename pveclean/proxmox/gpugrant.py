"""What a container's config grants of NVIDIA GPUs: the lines that grant it, the nodes the
container sees (its own paths), and the host GPUs (minor N of the host's /dev/nvidiaN).

Read as LXC applies the lines Proxmox passes on (`PVE::LXC::update_lxc_config` writes the raw
`lxc.*` keys verbatim; `devN:` are made by `PVE::LXC::create_passthrough_device_node` at the
same path): a `lxc.mount.entry` names its host source first and its target relative to the
rootfs; a bind of the host's whole /dev and LXC's nvidia mount hook give every GPU. Library
and binary binds (`/usr/lib/.../nvidia`, `/usr/bin/nvidia-smi`) grant no device.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from pveclean.core.lazyre import lazy

NVIDIA_MAJOR = 195  # nvidia's fixed character major; nvidia-uvm's and -caps' are dynamic
_DEV_KEY = lazy(r"dev\d{1,3}")
_ALLOW_KEYS = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
# LXC's device_cgroup_rule_parse: "a" alone, or a type, ONE blank, major:minor, one blank and
# the access characters, of which it reads three: what follows three (an inline "# comment")
# is not read, so the rule applies; fewer than three must end the value. Else: no rule.
_ALLOW_RULE = lazy(r"([abc])[ \t\n\v\f\r](\*|\d+):(\*|\d+)[ \t\n\v\f\r]"
                   r"(?:[rwm]{3}|[rwm]{0,2}$)", re.ASCII)
# A rule that may open every device, for may_use_gpus (whether `gpus` reads a container's
# tree): read wide on purpose, as looking once too often costs a scan, not a holder.
_ALLOW_ANY = lazy(r"^\s*(a\b|[abc*]\s+\*:\*)", re.ASCII)
_GPU_NODE = lazy(r"nvidia(\d+)")
_NVIDIA_HOOK = "nvidia"  # /usr/share/lxc/hooks/nvidia: nvidia-container-cli --device=all


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


def allow_rule(value: str) -> tuple[str, int | None, bool] | None:
    """(type, major or None for '*', whole major) of a devices.allow value, or None when LXC
    would not read it as a rule."""
    if value == "a":
        return "a", None, True
    m = _ALLOW_RULE.match(value)
    if m is None:
        return None
    major, minor = m.group(2), m.group(3)
    return m.group(1), None if major == "*" else int(major), minor == "*"


# The names NVIDIA's driver gives its nodes (nvidia-modprobe, nvidia-caps): a source so named
# is a node wherever it lives (a host may keep bind sources elsewhere); a library directory
# `.../nvidia` or a tool `nvidia-smi` is not one.
_NODE_NAME = lazy(r"nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-caps|-cap\d+)")


def _is_nvidia_source(source: str) -> bool:
    """A host path that is an NVIDIA node or the /dev/nvidia-caps directory."""
    path = posixpath.normpath(source)
    return path.startswith("/dev/nvidia") or bool(_NODE_NAME.fullmatch(posixpath.basename(path)))


def _whole_dev(source: str) -> bool:
    return posixpath.normpath(source or ".") == "/dev"


@dataclass(frozen=True)
class GpuGrant:
    """What the lines grant. `nodes`/`minors` None: every NVIDIA node / GPU the host has."""

    lines: tuple[str, ...]  # "key: value" of each granting line, as in the config
    nodes: frozenset[str] | None  # container paths
    minors: frozenset[int] | None  # host GPUs
    allow_all: bool = False  # a devices rule allows every device ('a', 'c *:* rwm')

    @property
    def any(self) -> bool:
        """The container can open an NVIDIA node."""
        return bool(self.lines)


def grant(lines: Iterable[tuple[str, str]], nvidia_majors: frozenset[int] = frozenset()
          ) -> GpuGrant:
    """The NVIDIA grant of a config's effective lines (pveconf.CtConfig.lines).
    `nvidia_majors`: the host's majors named nvidia* (/proc/devices), besides 195."""
    majors = {NVIDIA_MAJOR} | set(nvidia_majors)
    granting: list[str] = []
    nodes: set[str] | None = set()
    minors: set[int] | None = set()
    allow_all = False
    for key, value in lines:
        sources: list[tuple[str, str]] = []  # (host source, container path)
        everything = False
        if key == "lxc.mount.entry":
            fields = value.split()
            source = fields[0] if fields else ""
            if _whole_dev(source) and len(fields) > 1:
                everything = True
            elif _is_nvidia_source(source) and len(fields) > 1:
                sources.append((source, "/" + fields[1].lstrip("/")))
            elif _is_nvidia_source(source):
                granting.append(f"{key}: {value}")  # no target: LXC refuses it; still said
                continue
        elif _DEV_KEY.fullmatch(key):
            path = dev_path(value)
            if _is_nvidia_source(path):
                sources.append((path, path))  # made at the same path inside
        elif key == "lxc.hook.mount":
            script = value.split()[0] if value.split() else ""
            everything = posixpath.basename(script) == _NVIDIA_HOOK
        elif key in _ALLOW_KEYS:
            rule = allow_rule(value)
            if value.startswith("/"):  # device_cgroup_rule_parse_devpath: "/dev/x rwm"
                if _is_nvidia_source(value.split(" ")[0]):
                    granting.append(f"{key}: {value}")
            elif _ALLOW_ANY.match(value):
                allow_all = True  # may_use_gpus: every device, not a GPU line
            elif rule is not None and rule[0] in "ac" and (rule[1] is None or rule[1] in majors):
                granting.append(f"{key}: {value}")  # 'c *:0' allows nvidia0 too
            continue
        if everything:
            granting.append(f"{key}: {value}")
            nodes = minors = None
        for source, inside in sources:
            granting.append(f"{key}: {value}")
            if nodes is not None:
                nodes.add(posixpath.normpath(inside))
            m = _GPU_NODE.fullmatch(posixpath.basename(posixpath.normpath(source)))
            if m and minors is not None:
                minors.add(int(m.group(1)))
    return GpuGrant(tuple(dict.fromkeys(granting)),
                    None if nodes is None else frozenset(nodes),
                    None if minors is None else frozenset(minors), allow_all)


def node_paths(lines: Iterable[tuple[str, str]]) -> list[str]:
    """The NVIDIA nodes' container paths, in config order (the probe looks for them); a
    whole-/dev grant adds nothing here: the probe always looks at /dev/nvidia*."""
    paths: list[str] = []
    for key, value in lines:
        if key == "lxc.mount.entry":
            fields = value.split()
            if len(fields) > 1 and _is_nvidia_source(fields[0]):
                paths.append("/" + fields[1].lstrip("/"))
        elif _DEV_KEY.fullmatch(key) and _is_nvidia_source(dev_path(value)):
            paths.append(dev_path(value))
    return list(dict.fromkeys(paths))
