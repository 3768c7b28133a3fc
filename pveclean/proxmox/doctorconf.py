"""A container config as `pveclean doctor` reads it: each effective line with its number, and
the lines that put NVIDIA nodes into the container or allow them (core/doctor's records).

The effective lines are pveconf.parse_config's (what Proxmox applies: the last of a key, every
raw `lxc.*` line); their numbers are found again in the file's current section. Only the
cgroup2 keys allow a device on a cgroup2 host (Proxmox VE 7 and later): LXC ignores
`lxc.cgroup.devices.allow` there, so a node bound under a v1 rule alone is denied.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from pathlib import Path

from pveclean.core.doctor import (
    NVIDIA_MAJOR,
    AllowRule,
    BindVia,
    ConfLine,
    CtGrantConf,
    NodeBind,
    VmRef,
)
from pveclean.proxmox import gpugrant, pveconf

_SECTION = re.compile(r"^\[[^\]]*\]\s*$", re.ASCII)
_KEYED = re.compile(r"^(lxc\.[a-z0-9_\-.]+|[a-z][a-z_]*\d*)(?::|\s*=)\s*(.*?)\s*$", re.ASCII)
_RULE = re.compile(r"([abc])\s(\*|\d+):(\*|\d+)", re.ASCII)
_NODE = re.compile(r"nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-caps|-cap\d+)")
_CGROUP2_ALLOW = "lxc.cgroup2.devices.allow"
_DEV_KEY = re.compile(r"dev\d{1,3}")


def numbered(text: str, cfg: pveconf.CtConfig) -> list[ConfLine]:
    """cfg.lines (parsed from `text`) with their line numbers: a Proxmox key's last
    occurrence, a raw lxc key's occurrences in order."""
    where: dict[tuple[str, str], list[int]] = {}
    for n, line in enumerate(text.split("\n"), 1):
        if _SECTION.match(line):
            break
        m = _KEYED.match(line)
        if m and not line.startswith("#"):
            where.setdefault((m.group(1), m.group(2)), []).append(n)
    out = []
    for key, value in cfg.lines:
        ns = where.get((key, value), [0])
        n = ns.pop(0) if key.startswith("lxc.") and len(ns) > 1 else ns[-1]
        out.append(ConfLine(n, key, value))
    return out


def _host_node(source: str) -> str | None:
    """The source as a name under /dev when it is an NVIDIA node there ("nvidia-uvm",
    "nvidia-caps/nvidia-cap1"), else None."""
    path = posixpath.normpath(source)
    rel = path.removeprefix("/dev/")
    if rel == path or not rel.startswith("nvidia"):
        return None
    parts = rel.split("/")
    return rel if all(_NODE.fullmatch(p) for p in parts) and len(parts) <= 2 else None


def _mount(line: ConfLine) -> NodeBind | None:
    fields = line.value.split()
    if len(fields) < 2:
        return None
    source, target = fields[0], "/" + fields[1].lstrip("/")
    name = posixpath.basename(posixpath.normpath(target))
    whole = posixpath.normpath(source) == "/dev"
    node = _host_node(source)
    if not (whole or node or _NODE.fullmatch(name)):
        return None  # a library directory at a library path: no node
    optional = len(fields) > 3 and "optional" in fields[3].split(",")
    return NodeBind(line, source, posixpath.normpath(target), BindVia.MOUNT, node, whole,
                    optional, name)


def _dev(line: ConfLine) -> NodeBind | None:
    path = gpugrant.dev_path(line.value)
    node = _host_node(path)
    if node is None:
        return None
    return NodeBind(line, path, posixpath.normpath(path), BindVia.DEV, node, False, False,
                    posixpath.basename(path))


def _rule(line: ConfLine) -> AllowRule | None:
    if line.value == "a":
        return AllowRule(line, "a", None, None)
    if gpugrant.allow_rule(line.value) is None:
        return None
    m = _RULE.match(line.value)
    if m is None:
        return None
    major, minor = (None if x == "*" else int(x) for x in (m.group(2), m.group(3)))
    return AllowRule(line, m.group(1), major, minor)


def grant_conf(text: str, vmid: int) -> CtGrantConf:
    """The NVIDIA lines of container `vmid`'s config text, numbered."""
    cfg = pveconf.parse_config(text, vmid)
    binds: list[NodeBind] = []
    allows: list[AllowRule] = []
    every = False
    for line in numbered(text, cfg):
        bind = None
        if line.key == "lxc.mount.entry":
            bind = _mount(line)
        elif _DEV_KEY.fullmatch(line.key):
            bind = _dev(line)
        elif line.key == _CGROUP2_ALLOW:
            rule = _rule(line)
            if rule is not None:
                allows.append(rule)
        elif line.key == "lxc.hook.mount":
            every = every or gpugrant.grant([(line.key, line.value)]).nodes is None
        if bind is not None:
            binds.append(bind)
            every = every or bind.whole_dev
    g = cfg.gpu()
    allow_all = any(r.kind == "a" or (r.major is None and r.minor is None) for r in allows)
    return CtGrantConf(vmid, tuple(binds), tuple(allows), allow_all, every, g.minors,
                       cfg.get("rootfs"))


def read_conf(config_dir: str, vmid: int) -> tuple[str, CtGrantConf | None]:
    """(why not, None) or ("", the container's grant)."""
    path = pveconf.config_path(config_dir, vmid)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
    except FileNotFoundError:
        return pveconf.not_here(config_dir, vmid)[0], None
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}", None
    return "", grant_conf(text, vmid)


def gpu_containers(config_dir: str) -> Iterator[tuple[int, CtGrantConf]]:
    """Every container of this node whose config binds or allows an NVIDIA node."""
    for vmid in pveconf.list_vmids(config_dir):
        _why, conf = read_conf(config_dir, vmid)
        if conf is not None and (conf.grants or any(r.major == NVIDIA_MAJOR
                                                    for r in conf.allows)):
            yield vmid, conf


def vm_refs(pve_dir: str) -> list[VmRef]:
    """Each PCI id every VM's hostpci lines name (by address or resource mapping)."""
    from pveclean.proxmox import passthrough  # (not at a container's pre-start)

    pve = Path(pve_dir)
    refs = passthrough.vm_passthrough(pve / "qemu-server", passthrough.read_pci_mappings(
        pve / "mapping" / "pci.cfg", passthrough.this_node()))
    return [VmRef(r.vmid, r.name, r.address) for r in refs]
