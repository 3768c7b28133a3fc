"""io_uring fixed files: a file registered with a ring (IORING_REGISTER_FILES) stays open while
the fd it came from is closed, so a GPU node held that way is in no fd table. The ring's
fdinfo lists the registered files by path; each is looked up in the holder's own root and
judged by the device number behind it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from pveclean.core.records import DeviceHow, DeviceUse, GpuDevices
from pveclean.host import fstext, statx

MAX_RING_INFO = 8 << 20  # bytes of a ring's fdinfo: its SQ and CQ entries come first
MAX_RING_FILES = 4096  # distinct registered paths judged per process
URING = fstext.URING


@dataclass
class RingText:
    """What a ring's fdinfo says: its registered files (or why they cannot be known), its
    inode (the one its mappings in maps name) and its requests in flight that hold a file
    the kernel does not name (the pending polls of "PollList:")."""

    files: fstext.UringFiles | str
    ino: int | None = None
    polls: int = 0
    polls_unread: bool = False  # the text ended (the cap) before the poll list did


def _read_ring(base: str, fd: str) -> tuple[RingText, bool]:
    cut = [False]
    it = iter(fstext.lines(statx.read_capped(f"{base}/fdinfo/{fd}", MAX_RING_INFO, cut)))
    head: list[bytes] = []

    def watched() -> Iterator[bytes]:
        for line in it:
            if len(head) < 4:
                head.append(line)
            yield line

    files = fstext.uring_files(watched())
    info = fstext.parse_fdinfo(b"\n".join(head))
    ring = RingText("", None if info is None else info.ino)
    ring.polls = fstext.uring_polls(it)  # what follows the file list
    ring.polls_unread = cut[0]
    if files is not None and (files.complete or not cut[0]):
        ring.files = files
        return ring, False
    ring.files = (f"its fdinfo is longer than {MAX_RING_INFO >> 20} MiB before the end of "
                  "its registered files") if cut[0] else ""
    return ring, not cut[0]


def ring_files(base: str, fd: str) -> RingText:
    """What the fdinfo of ring fd `fd` of the task at `base` says, or why its files cannot be
    known. The kernel lists them only when it gets the ring's lock at once (a trylock: a
    thread inside io_uring_enter or io_uring_register holds it); asked twice."""
    ring, again = _read_ring(base, fd)
    if again:
        ring, again = _read_ring(base, fd)
    if again:
        ring.files = "the kernel did not list its registered files (the ring's lock was taken)"
    return ring


# why a registered file could not be told a GPU node or not (text, as ring_files' why: a
# record here cost every run's import for a rare finding)
NotJudged = str


def judge_ring(base: str, fd: str, devices: GpuDevices, held: list[DeviceUse],
               unjudged: list[str], done: dict[bytes, DeviceUse | NotJudged | None],
               tenant: bool = False) -> tuple[int | None, list[DeviceUse], str | None]:
    """Add to `held` the GPU nodes registered with ring fd `fd`, to `unjudged` why some
    registered file, or a request in flight, could not be judged. `done`: path -> finding,
    for the whole process. Returns the ring's inode, the GPU nodes it holds (for a process
    that has the ring only mapped, see devnodes.judge), and why its requests in flight cannot
    be judged (None: it has none), for the caller to count or not (devnodes.ScanCache.tenant).
    `tenant`: a registered path that leads to no GPU node is not judged (see _judge_paths)."""
    ring = ring_files(base, fd)
    in_flight = None
    if ring.polls:
        in_flight = (f"io_uring fd {fd}: {ring.polls} request(s) in flight (pending polls) "
                     "on files the kernel does not name: not judged")
    elif ring.polls_unread:
        in_flight = (f"io_uring fd {fd}: its fdinfo is cut before its requests in flight: "
                     "not judged")
    files = ring.files
    if isinstance(files, str):
        unjudged.append(f"io_uring fd {fd}: {files}")
        return ring.ino, [], in_flight
    paths = [p for _slot, p in files.paths]
    todo = [p for p in paths if p not in done]
    for finding in _judge_paths(base, todo, devices, done, tenant) if todo else ():
        if isinstance(finding, str):
            unjudged.append(f"io_uring fd {fd}: {finding}")
        elif finding is not None and finding not in held:
            held.append(finding)
    mine = [f for p in paths if isinstance(f := done.get(p), DeviceUse)]
    return ring.ino, mine, in_flight


def _judge_paths(base: str, todo: list[bytes], devices: GpuDevices,
                 done: dict[bytes, DeviceUse | NotJudged | None], tenant: bool = False
                 ) -> list[DeviceUse | NotJudged | None]:
    """What each of `todo` is (kept in `done` too), or the one reason none can be judged.
    The kernel names a registered file by its path alone, never by its device: for the
    tenant, whose root mounts and unmounts at will, a path that leads to no GPU node now is
    not judged (a mount stacked over the path after registering, or a tree detached since
    with a plain file put at the path the kernel shows from the tree's top, would pass for
    innocent). Pseudo files (sockets, pipes, anon inodes: no absolute path) stay innocent."""
    roots = _roots(base)
    if isinstance(roots, str):
        return [roots]
    out: list[DeviceUse | NotJudged | None] = []
    covers = _Covers(base)
    try:
        for path in todo:
            if len(done) >= MAX_RING_FILES:
                out.append(f"more than {MAX_RING_FILES} registered files; the rest not judged")
                break
            finding = _judge_in(roots, path, devices, tenant)
            if tenant and isinstance(finding, str):
                finding = covers.judge(path, devices) or finding
            done[path] = finding
            out.append(finding)
    finally:
        for r in set(roots):
            os.close(r)
    return out


def _roots(base: str) -> list[int] | str:
    """Where a registered path is looked up: the top of the task's mount namespace first
    (the kernel names a registered file from there, not from the task's chroot: a tenant
    that chroots into a tree with a plain file at the same path hides nothing), then the
    task's own root when it is another directory. O_PATH fds, or why there are none."""
    try:
        root = os.open(f"{base}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return "its root cannot be opened to look its files up"
    top = _ns_top(root)
    if top is None:
        os.close(root)
        return "the top of its mount namespace cannot be reached to look its files up"
    if _same_dir(top, root):
        os.close(root)
        return [top]
    return [top, root]


def _mounts(path: str) -> list[fstext.Mount]:
    return list(fstext.mounts(statx.read_capped(path, fstext.MAX_MOUNTINFO, [False])))


class _Covers:
    """Judge by its device number a registered path the task's mountinfo lists as a mount
    point, when the path leads elsewhere now (a file bind mount of the node that a later
    mount covers: LXC's own /dev/nvidia0 under a tmpfs the tenant stacked on /dev). The
    covered mount's file is looked up on the host through a host mount of the same file
    system (its `root` below that mount's `root`). Mountinfo is read once, when first asked."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.at: dict[bytes, list[fstext.Mount]] | None = None
        self.host: list[fstext.Mount] = []

    def judge(self, path: bytes, devices: GpuDevices) -> DeviceUse | None:
        if self.at is None:
            self.at = {}
            for m in _mounts(f"{self.base}/mountinfo"):
                self.at.setdefault(m.mount_point, []).append(m)
            self.host = _mounts("/proc/self/mountinfo") if self.at else []
        for m in self.at.get(path, []):
            for h in self.host:
                found = _on_host(m, h, devices) if h.dev == m.dev else None
                if found is not None:
                    return DeviceUse(path.decode("utf-8", "replace"), found.major,
                                     found.minor, DeviceHow.URING)
        return None


def _on_host(m: fstext.Mount, h: fstext.Mount, devices: GpuDevices) -> DeviceUse | None:
    """The GPU node at mount `m`'s root, seen through host mount `h` of its file system."""
    top = h.root.rstrip(b"/")
    if m.root != h.root and not m.root.startswith(top + b"/"):
        return None
    try:
        root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        got = _judge(root, h.mount_point.rstrip(b"/") + m.root[len(top):], devices)
    finally:
        os.close(root)
    return got if isinstance(got, DeviceUse) else None


def _unproven(path: bytes) -> NotJudged:
    shown = path.decode("utf-8", "replace")[:200]
    return (f"registered file {shown} leads to no GPU node now; the kernel names it by its "
            "path only, which a mount stacked over it or a detached tree can lead elsewhere: "
            "not judged")


UP = "/".join([".."] * 1000)  # one openat climbs 1,000 levels
MAX_CLIMBS = 64


def _ns_top(root: int) -> int | None:
    """The topmost directory above `root` in its mount namespace: ".." from there leads back
    to it (the kernel's follow_dotdot stops at a namespace's root mount)."""
    cur = os.dup(root)
    for _ in range(MAX_CLIMBS):
        try:
            up = os.open(UP, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=cur)
        except OSError:
            os.close(cur)
            return None
        if _same_dir(up, cur):
            os.close(up)
            return cur
        os.close(cur)
        cur = up
    os.close(cur)
    return None


def _same_dir(a: int, b: int) -> bool:
    sa = statx.statx(b"", a, statx.AT_EMPTY_PATH)
    sb = statx.statx(b"", b, statx.AT_EMPTY_PATH)
    if isinstance(sa, int) or isinstance(sb, int):
        return False
    return (sa.dev, sa.ino) == (sb.dev, sb.ino)


def _judge_in(roots: list[int], path: bytes, devices: GpuDevices, tenant: bool = False
              ) -> DeviceUse | NotJudged | None:
    """The first root where `path` is a GPU node decides; else the namespace top's answer."""
    first: DeviceUse | NotJudged | None = None
    for i, root in enumerate(roots):
        got = _judge(root, path, devices, tenant)
        if isinstance(got, DeviceUse):
            return got
        if i == 0:
            first = got
    return first


def _judge(root: int, path: bytes, devices: GpuDevices, tenant: bool = False
           ) -> DeviceUse | NotJudged | None:
    """The GPU node registered at `path`, None when `path` is no GPU node, or why it cannot
    be told. A path that is not absolute is a pseudo file (socket:[..], anon_inode:..): never
    a device node. A path that no longer resolves, resolves to a directory (a detached mount
    shows as "/") or was deleted cannot be told; for the `tenant`, neither can one that
    leads to anything but a GPU node (see _judge_paths)."""
    shown = path.decode("utf-8", "replace")
    if not path.startswith(b"/"):
        return None
    if path.endswith(b" (deleted)"):
        return f"registered file {shown[:200]} was deleted: not judged"
    fd = statx.open_in_root(root, path)
    if fd is None:
        return f"registered file {shown[:200]} cannot be looked up: not judged"
    try:
        st = statx.statx(b"", fd, statx.AT_EMPTY_PATH)
    finally:
        os.close(fd)
    if isinstance(st, int) or stat.S_ISDIR(st.mode):
        return (f"registered file {shown[:200]} cannot be told from a directory: "
                "not judged")
    if stat.S_ISCHR(st.mode) and devices.matches(st.rdev):
        return DeviceUse(shown, os.major(st.rdev), os.minor(st.rdev), DeviceHow.URING)
    return _unproven(path) if tenant else None
