"""The container's NVIDIA userspace, read from the host side and never trusted.

The container's root is the running container's `/proc/<init>/root`, or its rootfs directory
when it is stopped and mounted (`pct mount`). Every path below it is opened with openat2(2)
and RESOLVE_IN_ROOT, so a symlink in the container resolves inside the container, never on the
host; only directories are opened. A library directory is listed, not read: the versioned
file names (`libnvidia-ml.so.550.127.05`, `libcuda.so.550.127.05`) say the version. An entry
that is a symlink, a FIFO or anything but a plain file, a file over MAX_FILE, a name that is
not a clean version, too many entries or too long a look: each is one "could not judge" line,
and nothing of it is followed or opened. Nothing runs inside the container.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import time
from pathlib import Path

from pveclean.core.cgpaths import Layout
from pveclean.core.doctor import LibFile, Userspace
from pveclean.core.text import safe
from pveclean.host import cgroupfs, procfs

SYS_OPENAT2 = 437  # x86_64 and aarch64 alike
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
            "lib/x86_64-linux-gnu", "lib64")
LIBRARIES = ("libnvidia-ml.so", "libcuda.so")
MAX_ENTRIES = 100_000  # per directory
MAX_FILE = 1 << 30  # a driver library is tens of MiB
MAX_UNJUDGED = 8
_VERSION = re.compile(r"\d{1,4}\.\d{1,4}(?:\.\d{1,4})?", re.ASCII)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def open_in_root(root_fd: int, path: str) -> int:
    """A directory below the container's root, every component resolved inside it."""
    how = _OpenHow(os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0,
                   RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, root_fd, os.fsencode(path), ctypes.byref(how),
                       ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def init_pid(cgroup_root: str, vmid: int) -> int | None:
    """The running container's init: the process of its cgroup tree that is PID 1 inside."""
    tree = cgroupfs.tree_pids(Path(cgroup_root) / Layout.PVE / str(vmid), 1000)
    for pid in sorted(tree):
        st = procfs.read_status(pid)
        if st is not None and len(st.nspid) >= 2 and st.nspid[1] == 1:
            return pid
    return None


def open_root(cgroup_root: str, roots: list[str], vmid: int, running: bool
              ) -> tuple[int | None, str]:
    """The container's root directory fd (a stopped one's: the first of `roots` that holds a
    usr/ directory), or None and why not."""
    if running:
        pid = init_pid(cgroup_root, vmid)
        if pid is None:
            return None, "its init process was not found"
        roots = [procfs.path(pid, "root")]
    why = ""
    for where in roots:
        try:
            fd = os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
                         | (0 if running else os.O_NOFOLLOW))
        except OSError as exc:
            why = why or f"{where}: {exc.strerror}"
            continue
        if running or _has_usr(fd):
            return fd, ""
        os.close(fd)
    return None, why or "stopped and its rootfs is not mounted (pct mount)"


def _has_usr(root_fd: int) -> bool:
    try:
        os.close(open_in_root(root_fd, "usr"))
    except OSError:
        return False
    return True


class _Look:
    def __init__(self, end: float) -> None:
        self.end = end
        self.libs: list[LibFile] = []
        self.unjudged: list[str] = []
        self.seen: set[tuple[int, int]] = set()

    def unjudge(self, why: str) -> None:
        if len(self.unjudged) < MAX_UNJUDGED:
            self.unjudged.append(why)

    def directory(self, root_fd: int, rel: str) -> None:
        try:
            fd = open_in_root(root_fd, rel)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                self.unjudge(f"/{rel}: {exc.strerror}")
            return
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in self.seen:
                return  # /lib is /usr/lib (merged /usr)
            self.seen.add((st.st_dev, st.st_ino))
            self._entries(fd, rel)
        finally:
            os.close(fd)

    def _entries(self, fd: int, rel: str) -> None:
        with os.scandir(fd) as it:
            for n, entry in enumerate(it):
                if n >= MAX_ENTRIES or (n % 1000 == 0 and time.monotonic() > self.end):
                    self.unjudge(f"/{rel}: more than {n} entries or too long to list: not "
                                 "all were looked at")
                    return
                lib = next((x for x in LIBRARIES if entry.name.startswith(x + ".")), None)
                if lib is not None:
                    self._entry(entry, rel, lib)

    def _entry(self, entry: os.DirEntry[str], rel: str, lib: str) -> None:
        version = entry.name[len(lib) + 1:]
        shown = f"/{rel}/{safe(entry.name, 120)}"
        if version == "1":
            return  # the SONAME link to the versioned file
        if not _VERSION.fullmatch(version):
            self.unjudge(f"{shown}: a name that is no version")
            return
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            self.unjudge(f"{shown}: {exc.strerror}")
            return
        if stat.S_ISLNK(st.st_mode):
            self.unjudge(f"{shown}: a symlink (not followed)")
        elif not stat.S_ISREG(st.st_mode):
            self.unjudge(f"{shown}: not a plain file (a FIFO, a device or a directory)")
        elif st.st_size > MAX_FILE:
            self.unjudge(f"{shown}: {st.st_size} bytes, too large for a library")
        else:
            self.libs.append(LibFile(f"/{rel}/{entry.name}", lib, version))


def userspace(cgroup_root: str, roots: list[str], vmid: int, running: bool,
              seconds: float = 2.0) -> Userspace:
    """The container's NVIDIA libraries and what could not be judged, within `seconds`;
    `roots`: where a stopped container's root may be (a mount, its subvolume)."""
    root_fd, why = open_root(cgroup_root, roots, vmid, running)
    if root_fd is None:
        return Userspace(why_not=why)
    look = _Look(time.monotonic() + seconds)
    try:
        for rel in LIB_DIRS:
            look.directory(root_fd, rel)
    finally:
        os.close(root_fd)
    return Userspace(tuple(sorted(look.libs, key=lambda x: x.path)), tuple(look.unjudged))
