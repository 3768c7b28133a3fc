"""A FUSE file system that answers until told to hang: the lab's "NFS server went away".

Speaks the kernel's FUSE protocol on /dev/fuse directly (no libfuse needed): one directory
holding one regular file, attributes never cached (so every stat() of an open fd asks the
server). `hang()` makes the server stop answering: any stat() on the file, through a path or
through /proc/PID/fd/N, then blocks in the kernel until the server dies, as on a hard NFS mount
whose server is gone. `close()` kills the server, which aborts the connection (every waiter
gets ENOTCONN) and unmounts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import struct
import time
from pathlib import Path

LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 18, 25, 26
OPENDIR, RELEASEDIR, INTERRUPT, BATCH_FORGET = 27, 29, 36, 42
NO_REPLY = {FORGET, INTERRUPT, BATCH_FORGET}
IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ROOT, FILE = 1, 2


def _attr(ino: int) -> bytes:
    mode = (stat.S_IFDIR | 0o755) if ino == ROOT else (stat.S_IFREG | 0o644)
    # ino size blocks atime mtime ctime | atimensec mtimensec ctimensec mode nlink uid gid
    # rdev blksize flags
    return struct.pack("<QQQQQQIIIIIIIIII", ino, 4096, 8, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0,
                       4096, 0)


def _serve(fd: int, hang_flag: Path) -> None:
    while True:
        try:
            req = os.read(fd, 1 << 20)
        except OSError:
            return
        if not req:
            return
        length, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(req)
        if opcode in NO_REPLY:
            continue
        if opcode != INIT and hang_flag.exists():
            continue  # the server is gone: the request waits forever
        body, err = b"", 0
        if opcode == INIT:
            # major minor max_readahead flags max_background congestion max_write time_gran
            # max_pages map_alignment flags2 unused[7]
            body = struct.pack("<IIIIHHIIHHI28x", 7, 31, 65536, 0, 16, 12, 65536, 1, 32, 0, 0)
        elif opcode == LOOKUP:
            name = req[IN_HEADER.size:length].rstrip(b"\0")
            if nodeid == ROOT and name == b"nvidia-cache":
                body = struct.pack("<QQQQII", FILE, 0, 0, 0, 0, 0) + _attr(FILE)
            else:
                err = -2  # ENOENT
        elif opcode == GETATTR:
            body = struct.pack("<QII", 0, 0, 0) + _attr(nodeid)
        elif opcode in (OPEN, OPENDIR):
            body = struct.pack("<QII", 0, 0, 0)
        elif opcode in (RELEASE, RELEASEDIR, FLUSH):
            pass
        elif opcode == READ:
            body = b""
        else:
            err = -38  # ENOSYS
        with contextlib.suppress(OSError):
            os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), err, unique) + body)


class HangFs:
    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        self.flag = mountpoint.parent / f".{mountpoint.name}.hang"
        self.flag.unlink(missing_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        fd = os.open("/dev/fuse", os.O_RDWR)
        libc = ctypes.CDLL(None, use_errno=True)
        opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
        if libc.mount(b"pveclean-hangfs", str(mountpoint).encode(), b"fuse", 0, opts) != 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"mount fuse on {mountpoint}: {os.strerror(err)}")
        self.pid = os.fork()
        if self.pid == 0:
            try:
                _serve(fd, self.flag)
            finally:
                os._exit(0)
        os.close(fd)

    @property
    def file(self) -> Path:
        return self.mountpoint / "nvidia-cache"

    def hang(self) -> None:
        self.flag.touch()

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(50):
            if libc.umount2(str(self.mountpoint).encode(), 2) == 0:  # MNT_DETACH
                break
            if ctypes.get_errno() in (22, 2):  # not mounted any more
                break
            time.sleep(0.02)
        self.flag.unlink(missing_ok=True)
