"""The kernel's text about files, parsed as the kernel writes it: /proc/PID/mountinfo,
/proc/PID/maps and /proc/PID/fdinfo/N (an io_uring ring's registered files too).

Lines end at "\\n" only: a mount point, a mapped file's path or a FUSE subtype may hold any
other byte (\\f, \\r, \\v, \\x1c-\\x1e, \\x85 ...), which str.splitlines() would take for a line
break. Each parser reads every field of its line and keeps the bytes: a path is undone from
the kernel's escapes only where the kernel escapes (mangle(): "\\ooo" for space, tab, newline
and backslash in mountinfo and io_uring's file list; maps escapes only a newline, as \\012,
and leaves a backslash alone, so its paths stay as shown).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_OCTAL = re.compile(rb"\\([0-7]{3})")


def unescape(field: bytes) -> bytes:
    """Undo the kernel's mangle()/seq_escape(): "\\ooo" back to its byte."""
    if b"\\" not in field:
        return field
    return _OCTAL.sub(lambda m: bytes((int(m.group(1), 8) & 0xFF,)), field)


def lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a stream of chunks, split on b"\\n" only; a last line without its
    newline is yielded too (a read cut by a cap: the caller knows it was cut)."""
    rest = b""
    for chunk in chunks:
        if not chunk:
            continue
        parts = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


# ---- mountinfo (fs/proc_namespace.c show_mountinfo) --------------------------------------
@dataclass(frozen=True)
class Mount:
    """One line of /proc/PID/mountinfo."""

    mount_id: int
    parent_id: int
    dev: tuple[int, int]  # st_dev of the file system, major and minor
    root: bytes
    mount_point: bytes
    options: bytes
    optional: tuple[bytes, ...]  # shared:N, master:N, propagate_from:N, unbindable
    fstype: bytes  # "fuse.<subtype>" whole
    source: bytes
    super_options: bytes


def parse_mount(line: bytes) -> Mount | None:
    """One mountinfo line; None when it is not one (a line the kernel did not write).
    Every field is split on a single space: the kernel escapes a space inside a field."""
    f = line.split(b" ")
    try:
        sep = f.index(b"-", 6)
        if len(f) < sep + 3:
            return None
        major, minor = f[2].split(b":")
        return Mount(int(f[0]), int(f[1]), (int(major), int(minor)), unescape(f[3]),
                     unescape(f[4]), f[5], tuple(f[6:sep]), unescape(f[sep + 1]),
                     unescape(f[sep + 2]), b" ".join(f[sep + 3:]))
    except ValueError:
        return None


# ---- maps (fs/proc/task_mmu.c show_map_vma) ----------------------------------------------
@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: bytes
    offset: int
    dev: tuple[int, int]
    inode: int
    name: bytes  # the path (a newline in it shown as \012), [heap], [anon:...], or b""

    @property
    def map_file(self) -> str:
        """Its entry in /proc/PID/map_files ("%lx-%lx": no leading zeros, unlike maps)."""
        return f"{self.start:x}-{self.end:x}"


MAX_MOUNTINFO = 4 << 20  # bytes of one mount namespace's mountinfo read


def mounts(chunks: Iterable[bytes]) -> Iterator[Mount]:
    """The mounts of a mountinfo read in chunks (statx.read_capped), parsed line by line (a
    mount point may hold any byte but a newline); a line the kernel did not write passed."""
    for line in lines(chunks):
        m = parse_mount(line)
        if m is not None:
            yield m


def parse_mapping(line: bytes) -> Mapping | None:
    """One maps line: "start-end perms offset major:minor inode", padding, then the name.
    The name is what follows the padding: the kernel writes none that starts with a space."""
    f = line.split(b" ", 5)
    if len(f) < 5:
        return None
    try:
        start, end = f[0].split(b"-")
        major, minor = f[3].split(b":")
        return Mapping(int(start, 16), int(end, 16), f[1], int(f[2], 16),
                       (int(major, 16), int(minor, 16)), int(f[4]),
                       f[5].lstrip(b" ") if len(f) > 5 else b"")
    except ValueError:
        return None


# ---- fdinfo (fs/proc/fd.c seq_show, io_uring/fdinfo.c) -----------------------------------
O_PATH = 0o10000000


@dataclass(frozen=True)
class FdInfo:
    """/proc/PID/fdinfo/N: the fields pveclean reads."""

    pos: int
    flags: int
    mnt_id: int
    ino: int | None  # since Linux 5.14


def parse_fdinfo(text: bytes) -> FdInfo | None:
    """The head every fdinfo starts with: pos, flags (octal), mnt_id, ino."""
    head: dict[bytes, bytes] = {}
    for line in text.split(b"\n", 4)[:4]:
        key, sep, value = line.partition(b":\t")
        if sep:
            head[key] = value
    try:
        return FdInfo(int(head[b"pos"]), int(head[b"flags"], 8), int(head[b"mnt_id"]),
                      int(head[b"ino"]) if b"ino" in head else None)
    except (KeyError, ValueError):
        return None


URING = "anon_inode:[io_uring]"  # the link of an io_uring fd (host/uring.py judges its files)


@dataclass(frozen=True)
class UringFiles:
    """An io_uring ring's registered files, from its fdinfo. `count` is the table's size
    ("UserFiles:"); `paths` the files it holds (an empty slot is not listed), as the reader
    of fdinfo would reach them, unescaped. None for a ring whose lock the kernel did not get
    (it prints nothing then), see uring_files()."""

    count: int
    paths: tuple[tuple[int, bytes], ...]  # (slot, path)
    complete: bool  # False: the text ended (a read cap) before the list did


def uring_files(lines_: Iterable[bytes]) -> UringFiles | None:
    """The "UserFiles:" section of an io_uring fdinfo: "UserFiles:\\t<n>", then one line
    "%5u: <path>" per registered file, the path escaped (" \\t\\n\\\\" as \\ooo), then
    "UserBufs:". None when there is no such section (the kernel's trylock of the ring
    failed: it then writes nothing of the ring)."""
    count: int | None = None
    paths: list[tuple[int, bytes]] = []
    for line in lines_:
        if count is None:
            if line.startswith(b"UserFiles:\t"):
                try:
                    count = int(line[11:])
                except ValueError:
                    return None
            continue
        slot, sep, path = line.partition(b": ")
        if not sep or not slot.strip().isdigit():
            return UringFiles(count, tuple(paths), True)  # "UserBufs:\t..."
        paths.append((int(slot), unescape(path)))
    if count is None:
        return None
    return UringFiles(count, tuple(paths), False)


def uring_polls(lines_: Iterable[bytes]) -> int:
    """How many requests in flight an io_uring fdinfo's "PollList:" section lists (one line
    "  op=%d, task_works=%d" each, io_uring/fdinfo.c): each holds a file it does not name."""
    n, inside = 0, False
    for line in lines_:
        if line.startswith(b"PollList:"):
            inside = True
        elif inside and line.startswith(b"  op="):
            n += 1
        else:
            inside = False
    return n
