"""GPU device nodes: which device numbers count, and which of them a process holds through an
fd or a mapping, never stat()ing a file on FUSE, NFS or another file system that can hang."""

from __future__ import annotations

import glob
import os
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from pveclean.core.records import GpuDevices
from pveclean.host import procfs
from pveclean.host.procfs import listdir, read_bytes, read_text, readlink, thread_bases

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# File systems whose inodes stat() answers from memory, without a server or a user-space
# daemon: device nodes live on these (devtmpfs, tmpfs for a container's /dev, the host's
# disk for nodes made by hand). Everything else -- fuse.*, nfs, cifs/smb3, 9p, ceph,
# virtiofs, glusterfs, unknown types -- is never stat()ed: a hung server or a malicious FUSE
# daemon in the container would hang pveclean. A GPU node cannot live on those anyway
# (they refuse or ignore mknod), so nothing is missed.
LOCAL_FS = frozenset({
    "devtmpfs", "tmpfs", "ramfs", "devpts", "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs",
    "overlay", "f2fs", "bcachefs", "jfs", "reiserfs",
})
MAX_MOUNTINFO = 4 << 20  # bytes read of one process's mountinfo


@dataclass
class Mounts:
    """One mount namespace's mounts as a process sees them: mount ID and st_dev -> fs type."""

    by_id: dict[int, str]
    by_dev: dict[str, str]  # "major:minor" -> fs type (st_dev, as /proc/PID/maps shows it)


def parse_mountinfo(text: str) -> Mounts:
    by_id: dict[int, str] = {}
    by_dev: dict[str, str] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields_l, fields_r = left.split(), right.split()
        if not sep or len(fields_l) < 5 or not fields_r or not fields_l[0].isdigit():
            continue
        by_id[int(fields_l[0])] = fields_r[0]
        by_dev.setdefault(fields_l[2], fields_r[0])
    return Mounts(by_id, by_dev)


def read_mounts(base: str) -> Mounts:
    """Mounts of the namespace of the task at `base` (/proc/PID or /proc/PID/task/TID)."""
    raw = read_bytes(f"{base}/mountinfo", MAX_MOUNTINFO)
    if raw is None:
        return Mounts({}, {})
    return parse_mountinfo(raw.decode("utf-8", "replace"))


def _fd_mnt_id(base: str, fd: str) -> int | None:
    """The mount ID of fd `fd` of the task at `base` (fdinfo's third line)."""
    raw = read_bytes(f"{base}/fdinfo/{fd}", 512, one_read=True)
    if raw is None:
        return None
    at = raw.find(b"mnt_id:")
    if at < 0:
        return None
    value = raw[at + 7 : raw.find(b"\n", at)].strip()
    return int(value) if value.isdigit() else None


AT_FDCWD = -100
AT_STATX_DONT_SYNC = 0x4000
STATX_TYPE_MODE = 0x3
_statx_fn: Any = None
_statx_buf: Any = None  # struct statx; scans are single-threaded


def _libc_statx() -> Any:
    """statx() through ctypes, loaded on the first scan: scans run in the worker, so the
    parent of a run never imports ctypes."""
    global _statx_fn, _statx_buf
    if _statx_fn is None:
        import ctypes

        try:
            _statx_buf = ctypes.create_string_buffer(256)
            fn = ctypes.CDLL(None, use_errno=True).statx
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint,
                           ctypes.c_char_p]
            fn.restype = ctypes.c_int
            _statx_fn = fn
        except (AttributeError, OSError):
            _statx_fn = False
    return _statx_fn


def stat_nosync(path: str) -> tuple[int, int] | None:
    """(st_mode, st_rdev) of the file `path` leads to, by statx(AT_STATX_DONT_SYNC): FUSE,
    NFS, CIFS, 9p and ceph answer from their cache instead of asking a daemon or a server.
    The mount-type check before it is the first guard; this one holds when the container
    swaps what an fd number points to between that check and this call. None: gone."""
    fn = _libc_statx()
    if fn is False:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_mode, st.st_rdev
    buf = _statx_buf
    if fn(AT_FDCWD, path.encode(), AT_STATX_DONT_SYNC, STATX_TYPE_MODE, buf) != 0:
        return None
    (mode,) = struct.unpack_from("<H", buf, 28)  # struct statx: stx_mode
    major, minor = struct.unpack_from("<II", buf, 128)  # stx_rdev_major, stx_rdev_minor
    return mode, os.makedev(major, minor)


class ScanCache:
    """What one scan may share between the processes it looks at: each mount namespace's
    mounts (the container's processes share one), and (st_dev, inode) -> st_rdev of mapped
    files (they map the same libraries). A mount ID missing from the cached table is
    looked up again (a mount made during the scan)."""

    def __init__(self) -> None:
        self.rdevs: dict[tuple[str, str], int] = {}
        self._mounts: dict[str, Mounts] = {}

    def mounts(self, base: str, fresh: bool = False) -> Mounts:
        ns = readlink(f"{base}/ns/mnt")
        if ns is None:
            return read_mounts(base)
        if fresh or ns not in self._mounts:
            self._mounts[ns] = read_mounts(base)
        return self._mounts[ns]


def _fd_holds(base: str, name: str, devices: GpuDevices, cache: ScanCache,
              mounts: list[Any]) -> str | None:
    """The GPU node fd `name` of the task at `base` holds, matched by device number only."""
    target = readlink(f"{base}/fd/{name}")  # never touches the file's own file system
    if target is None or not target.startswith("/"):
        return None  # socket:[..], pipe:[..], anon_inode:..
    rdev = fd_char_rdev(base, name, cache, mounts)
    if rdev is not None and devices.matches(rdev):
        return f"{target} ({os.major(rdev)}:{os.minor(rdev)})"
    return None


def fd_char_rdev(base: str, name: str, cache: ScanCache, mounts: list[Any]) -> int | None:
    """The device number behind fd `name` of the task at `base` if it is a character device
    on a local file system; None otherwise. Never stat()s a file on FUSE, NFS, CIFS, 9p...
    (it could hang): the fd's mount (fdinfo's mnt_id) is looked up first. `mounts`: the
    task's [Mounts or None, refreshed once], shared by the calls for one task."""
    mnt_id = _fd_mnt_id(base, name)
    if mnt_id is None:
        return None
    known = mounts[0]
    if known is None:
        known = mounts[0] = cache.mounts(base)
    if mnt_id not in known.by_id and not mounts[1]:  # once per process: a lazily
        known = mounts[0] = cache.mounts(base, fresh=True)  # unmounted one stays unknown
        mounts[1] = True
    if known.by_id.get(mnt_id) not in LOCAL_FS:
        return None
    st = stat_nosync(f"{base}/fd/{name}")
    return st[1] if st is not None and stat.S_ISCHR(st[0]) else None


def device_fds(pid: int, devices: GpuDevices, cache: ScanCache | None = None
               ) -> list[str] | None:
    """Paths (as the process sees them) of open fds on GPU devices, at any path (a bind mount
    of /dev/nvidia0 at /opt/g counts); None if the process is gone. A process whose main
    thread exited shows no fds on /proc/PID/fd: its live threads' fd tables are read then."""
    base = procfs.path(pid)
    names = listdir(f"{base}/fd")
    if names is None:
        return None
    held: list[str] = []
    todo = [(base, names)] if names else []
    if not names:
        for tbase in thread_bases(pid, "fd"):
            tnames = listdir(f"{tbase}/fd")
            if tnames is not None:
                todo.append((tbase, tnames))
    cache = cache or ScanCache()
    for where, fds in todo:
        mounts: list[Any] = [None, False]  # this task's Mounts, and refreshed once
        for name in fds:
            hit = _fd_holds(where, name, devices, cache, mounts)
            if hit and hit not in held:
                held.append(hit)
    return held


def device_maps(pid: int, devices: GpuDevices, cache: ScanCache | None = None) -> list[str]:
    """Mappings of GPU devices at any path, matched on the device number behind
    /proc/PID/map_files; only files on local file systems are stat()ed."""
    base = procfs.path(pid)
    text = read_text(f"{base}/maps")
    if not text:
        for tbase in thread_bases(pid, "maps"):  # zombie leader: its threads share the mappings
            text = read_text(f"{tbase}/maps")
            if text:
                base = tbase
                break
        if not text:
            return []
    cache = cache or ScanCache()
    rdevs = cache.rdevs
    mounts: Mounts | None = None
    refreshed = False
    held: list[str] = []
    seen: set[tuple[str, str]] = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or parts[4] == "0" or not parts[5].startswith("/"):
            continue  # anonymous, [heap], [stack], [vdso]
        key = (parts[3], parts[4])  # st_dev of the file's file system, inode
        if key in seen:
            continue
        seen.add(key)
        rdev = rdevs.get(key)
        if rdev is None:
            if mounts is None:
                mounts = cache.mounts(base)
            dev = _dev_key(parts[3])
            if dev not in mounts.by_dev and not refreshed:
                mounts, refreshed = cache.mounts(base, fresh=True), True
            rdev = -1
            if mounts.by_dev.get(dev) in LOCAL_FS:
                st = stat_nosync(f"{base}/map_files/{parts[0]}")
                rdev = st[1] if st is not None and stat.S_ISCHR(st[0]) else -1
            rdevs[key] = rdev
        if rdev >= 0 and devices.matches(rdev):
            held.append(f"{parts[5]} (mmap {os.major(rdev)}:{os.minor(rdev)})")
    return held


def _dev_key(maps_dev: str) -> str:
    """maps shows st_dev as hex "fd:01", mountinfo as decimal "253:1"."""
    major, _, minor = maps_dev.partition(":")
    try:
        return f"{int(major, 16)}:{int(minor, 16)}"
    except ValueError:
        return maps_dev


def nvidia_majors(proc_devices: str | None = None) -> frozenset[int]:
    """Majors of character drivers named nvidia* (nvidia, nvidia-uvm, nvidia-caps, ...), from
    `proc_devices` (/proc/devices by default)."""
    text = read_text(proc_devices or procfs.path("devices")) or ""
    majors: set[int] = set()
    in_char = False
    for line in text.splitlines():
        if line.startswith("Character"):
            in_char = True
        elif line.startswith("Block"):
            in_char = False
        elif in_char:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].startswith("nvidia"):
                majors.add(int(parts[0]))
    return frozenset(majors)


def gpu_devices(patterns: Iterable[str], proc_devices: str | None = None) -> GpuDevices:
    rdevs: dict[int, str] = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                rdevs.setdefault(st.st_rdev, path)
    return GpuDevices(rdevs, nvidia_majors(proc_devices))
