"""Where a stopped container's root directory is on the host without mounting anything: a
ZFS subvolume (`zfspool` storage, `subvol-<vmid>-disk-N`: mounted by ZFS itself) or a
directory storage's subvolume (`<vmid>/subvol-<vmid>-disk-N.subvol`). A raw image (dir's
`.raw`, LVM, Ceph RBD) needs a mount first (`pct mount`), so it has no directory here.

Mirrors PVE::Storage::ZFSPoolPlugin::path (`mountpoint` or `/<pool>`, then the volume name)
and PVE::Storage::Plugin::filesystem_path (`<path>/images/<vmid>/<name>`)."""

from __future__ import annotations

import re
from pathlib import Path

_SECTION = re.compile(r"^([a-z][a-z0-9]*):\s*(\S+)\s*$", re.ASCII)
_ZFS_SUBVOL = re.compile(r"subvol-\d+-disk-\d+", re.ASCII)
_DIR_SUBVOL = re.compile(r"(\d+)/(subvol-\d+-disk-\d+\.subvol)", re.ASCII)
DIR_TYPES = ("dir", "nfs", "cifs", "glusterfs", "cephfs")


def storage_section(text: str, storage: str) -> tuple[str, dict[str, str]] | None:
    """(type, options) of one storage of storage.cfg's text; None if it has no section."""
    found: tuple[str, dict[str, str]] | None = None
    for line in text.split("\n"):  # as PVE::SectionConfig splits
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SECTION.match(line)
        if m:
            if found is not None:
                break
            if m.group(2) == storage:
                found = (m.group(1), {})
        elif found is not None:
            key, _, value = line.strip().partition(" ")
            found[1][key] = value.strip()
    return found


def volid_of(rootfs: str) -> str:
    """The volume of a `rootfs:` value (`local-zfs:subvol-129-disk-0,size=8G`, or
    `volume=...` in any position)."""
    parts = rootfs.split(",")
    named = [p[7:] for p in parts if p.startswith("volume=")]
    return named[0] if named else parts[0]


def rootfs_dir(storage_cfg: str, rootfs: str) -> str | None:
    """The host directory of a container's root volume, or None (an image to mount first,
    a storage this does not know)."""
    storage, _, volname = volid_of(rootfs).partition(":")
    section = storage_section(storage_cfg, storage) if storage else None
    if section is None:
        return None
    kind, opts = section
    if kind == "zfspool" and _ZFS_SUBVOL.fullmatch(volname) and opts.get("pool"):
        base = opts.get("mountpoint") or "/" + opts["pool"]
        return str(Path(base) / volname)
    m = _DIR_SUBVOL.fullmatch(volname)
    if kind in DIR_TYPES and m and opts.get("path"):
        return str(Path(opts["path"]) / "images" / m.group(1) / m.group(2))
    return None


def read_rootfs_dir(pve_dir: str, rootfs: str | None) -> str | None:
    """rootfs_dir from /etc/pve/storage.cfg (read in the caller's worker)."""
    if not rootfs:
        return None
    try:
        with open(Path(pve_dir) / "storage.cfg", encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
    except OSError:
        return None
    return rootfs_dir(text, rootfs)
