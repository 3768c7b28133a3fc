"""The host's side of `pveclean doctor`: the loaded NVIDIA module's version, its device nodes
(name and number) and the character majors every driver has now."""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Iterable

from pveclean.core.doctor import HostNode
from pveclean.host import procfs

VERSION_FILE = "/proc/driver/nvidia/version"
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue ..." and the open
# module's "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.05  Release ..."
_NVRM = re.compile(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s",
                   re.ASCII)


def module_version(path: str = VERSION_FILE) -> str | None:
    """The loaded kernel module's version, None when no module is loaded (or the file says
    no version)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    m = _NVRM.search(head + " ")
    return m.group(1) if m else None


def char_majors(proc_devices: str | None = None) -> frozenset[int]:
    """Every character driver's major (/proc/devices' first section)."""
    text = procfs.read_text(proc_devices or procfs.path("devices")) or ""
    out: set[int] = set()
    in_char = False
    for line in text.split("\n"):
        if line.startswith("Character"):
            in_char = True
        elif line.startswith("Block"):
            in_char = False
        elif in_char and line.split()[:1] and line.split()[0].isdigit():
            out.add(int(line.split()[0]))
    return frozenset(out)


def _name(path: str) -> str:
    """The node's name relative to its /dev ("nvidia0", "nvidia-caps/nvidia-cap1")."""
    return path.rpartition("/dev/")[2] if "/dev/" in path else os.path.basename(path)


def host_nodes(patterns: Iterable[str]) -> list[HostNode]:
    """The NVIDIA nodes the host has (the config's `devices` globs): character devices with
    their numbers, the nvidia-caps directory with none (-1)."""
    out: dict[str, HostNode] = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                node = HostNode(_name(path), os.major(st.st_rdev), os.minor(st.st_rdev))
            elif stat.S_ISDIR(st.st_mode):
                node = HostNode(_name(path), -1, -1)
            else:
                continue
            out.setdefault(node.name, node)
    return list(out.values())
