"""The system calls devnodes judges files with: statx(AT_STATX_DONT_SYNC) and
openat2(RESOLVE_IN_ROOT) through ctypes, loaded on the first scan (scans run in the worker, so
the parent of a run never imports ctypes), and a capped, chunked read of a /proc file."""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

AT_FDCWD = -100
AT_NO_AUTOMOUNT = 0x800
AT_EMPTY_PATH = 0x1000
AT_STATX_DONT_SYNC = 0x4000
STATX_TYPE_MODE_INO = 0x1 | 0x2 | 0x100
SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x02, 0x10
FLAGS = AT_STATX_DONT_SYNC | AT_NO_AUTOMOUNT
MASK = STATX_TYPE_MODE_INO
_libc: Any = None
_buf: Any = None  # struct statx; scans are single-threaded
BUF: Any = None  # the same, once loaded: raw() callers read it with mode(), rdev(), dev()
# ... or, in a loop over thousands of fds, through these views of it (one index each, no call):
# U16[MODE] is stx_mode; U32[RDEV], U32[RDEV + 1] stx_rdev_major, _minor; U32[DEV], U32[DEV + 1]
# stx_dev_major, _minor (struct statx, include/uapi/linux/stat.h, in the machine's own byte
# order as the kernel writes it)
U16: memoryview | None = None
U32: memoryview | None = None
MODE, RDEV, DEV = 28 // 2, 128 // 4, 136 // 4
_H, _II = struct.Struct("<H"), struct.Struct("<II")


def mode(buf: Any) -> int:
    return int(_H.unpack_from(buf, 28)[0])  # stx_mode


def rdev(buf: Any) -> tuple[int, int]:
    return _II.unpack_from(buf, 128)  # stx_rdev_major, _minor


def dev(buf: Any) -> tuple[int, int]:
    return _II.unpack_from(buf, 136)  # stx_dev_major, _minor


def raw() -> Any:
    """libc's statx itself, for a loop over thousands of fds: fn(dir_fd, name, FLAGS, MASK,
    BUF) == 0, then mode(BUF)...; None without it."""
    lib = _load()
    return None if lib is False else lib.statx


_QUICK: list[Callable[..., int]] = []


def quick() -> tuple[Callable[..., int], memoryview, memoryview] | None:
    """libc's statx for the tightest loop (devnodes' over every fd), called as raw() is,
    and the views U16 and U32 of BUF it writes; None without statx. Its handle converts no
    argument by declared types (ints, bytes and BUF pass as they are): a third less time
    per call. quick_errno() says why its last call failed."""
    if _load() is False or U16 is None or U32 is None:
        return None
    if not _QUICK:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).statx
        fn.restype = ctypes.c_int
        _QUICK.append(fn)
    return _QUICK[0], U16, U32


def quick_errno() -> int:
    """The errno quick()'s last failed call left (EIO when it left none)."""
    import ctypes

    return ctypes.get_errno() or errno.EIO


@dataclass(frozen=True)
class Stat:
    """What statx() says of a file: its mode, device and file system."""

    mode: int
    rdev: int
    dev: tuple[int, int]  # the file system's st_dev, major and minor
    ino: int


def _load() -> Any:
    global _libc, _buf, BUF, U16, U32
    if _libc is None:
        import ctypes

        try:
            lib = ctypes.CDLL(None, use_errno=True)
            fn = lib.statx
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint,
                           ctypes.c_char_p]
            fn.restype = ctypes.c_int
            lib.syscall.restype = ctypes.c_long
            _buf = BUF = ctypes.create_string_buffer(256)
            U16, U32 = memoryview(BUF).cast("B").cast("H"), memoryview(BUF).cast("B").cast("I")
            _libc = lib
        except (AttributeError, OSError):
            _libc = False
    return _libc


def statx(path: str | bytes, dir_fd: int = AT_FDCWD, flags: int = 0) -> Stat | int:
    """The file `path` (relative to `dir_fd`) leads to, by statx(AT_STATX_DONT_SYNC |
    AT_NO_AUTOMOUNT): FUSE, NFS, CIFS and ceph answer from their cache instead of asking a
    daemon or a server. An int: the errno it failed with (ENOENT: gone)."""
    lib = _load()
    if lib is False:  # a libc without statx: plain stat (no DONT_SYNC)
        try:
            st = os.stat(path, dir_fd=None if dir_fd == AT_FDCWD else dir_fd,
                         follow_symlinks=True)
        except OSError as exc:
            return exc.errno or errno.EIO
        return Stat(st.st_mode, st.st_rdev, (os.major(st.st_dev), os.minor(st.st_dev)),
                    st.st_ino)
    import ctypes

    name = path.encode("utf-8", "surrogateescape") if isinstance(path, str) else path
    if lib.statx(dir_fd, name, FLAGS | flags, MASK, _buf) != 0:
        return ctypes.get_errno() or errno.EIO
    (mode,) = struct.unpack_from("<H", _buf, 28)  # stx_mode
    (ino,) = struct.unpack_from("<Q", _buf, 32)  # stx_ino
    rmaj, rmin, dmaj, dmin = struct.unpack_from("<IIII", _buf, 128)  # stx_rdev_*, stx_dev_*
    return Stat(mode, os.makedev(rmaj, rmin), (dmaj, dmin), ino)


def open_in_root(root_fd: int, path: bytes) -> int | None:
    """An O_PATH fd of `path` resolved inside `root_fd` as if it were "/" (openat2
    RESOLVE_IN_ROOT: "..", absolute symlinks and magic links cannot leave it), the last
    component not followed; None when it does not resolve. Never opens the file itself."""
    lib = _load()
    if lib is False:
        return None
    import ctypes

    how = struct.pack("<QQQ", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, 0,
                      RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = lib.syscall(SYS_OPENAT2, ctypes.c_int(root_fd), ctypes.c_char_p(path),
                     ctypes.c_char_p(how), ctypes.c_size_t(len(how)))
    return None if fd < 0 else int(fd)


_anon_dev: tuple[int, int] | None = None


def anon_inode_dev() -> tuple[int, int]:
    """st_dev of the kernel's anon_inode file system (eventfd, epoll, io_uring rings...)."""
    global _anon_dev
    if _anon_dev is None:
        try:
            fd = os.eventfd(0)
        except (AttributeError, OSError):
            _anon_dev = (-1, -1)
        else:
            try:
                st = os.fstat(fd)
                _anon_dev = (os.major(st.st_dev), os.minor(st.st_dev))
            finally:
                os.close(fd)
    return _anon_dev


def read_capped(path: str, limit: int, cut: list[bool], refused: list[int] | None = None
                ) -> Iterator[bytes]:
    """A file's bytes in chunks, at most `limit`; cut[0] is set when there was more. Gone or
    unreadable: nothing (why it could not be opened appended to `refused`, an errno)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if refused is not None:
            refused.append(exc.errno or 0)
        return
    try:
        got = 0
        while True:
            chunk = os.read(fd, min(1 << 18, limit + 1 - got))
            if not chunk:
                return
            got += len(chunk)
            if got > limit:
                cut[0] = True
                chunk = chunk[: len(chunk) - (got - limit)]
                yield chunk[: chunk.rfind(b"\n") + 1]  # no line cut in two
                return
            yield chunk
    except OSError:
        return
    finally:
        os.close(fd)
