"""io_uring fixed files: a file registered with a ring (IORING_REGISTER_FILES) stays open while
the fd it came from is closed, so a GPU node held that way is in no fd table. The ring's
fdinfo lists the registered files by path; each is looked up in the holder's own root and
judged by the device number behind it."""

from __future__ import annotations

import os
import stat

from pveclean.core.records import DeviceHow, DeviceUse, GpuDevices
from pveclean.host import fstext, statx

MAX_RING_INFO = 8 << 20  # bytes of a ring's fdinfo: its SQ and CQ entries come first
MAX_RING_FILES = 4096  # distinct registered paths judged per process
URING = fstext.URING


def ring_files(base: str, fd: str) -> fstext.UringFiles | str:
    """The registered files of ring fd `fd` of the task at `base`, or why they cannot be
    known. The kernel lists them only when it gets the ring's lock at once (a trylock: a
    thread inside io_uring_enter or io_uring_register holds it); asked twice."""
    for _ in range(2):
        cut = [False]
        files = fstext.uring_files(fstext.lines(statx.read_capped(f"{base}/fdinfo/{fd}",
                                                            MAX_RING_INFO, cut)))
        if files is not None and (files.complete or not cut[0]):
            return files
        if cut[0]:
            return (f"its fdinfo is longer than {MAX_RING_INFO >> 20} MiB before the end of "
                    "its registered files")
    return "the kernel did not list its registered files (the ring's lock was taken)"


# why a registered file could not be told a GPU node or not (text, as ring_files' why: a
# record here cost every run's import for a rare finding)
NotJudged = str


def judge_ring(base: str, fd: str, devices: GpuDevices, held: list[DeviceUse],
               unjudged: list[str], done: dict[bytes, DeviceUse | NotJudged | None],
               rdevs: set[int] | None = None) -> None:
    """Add to `held` the GPU nodes registered with ring fd `fd` (and their device numbers to
    `rdevs`), to `unjudged` why some registered file could not be judged. `done`: path ->
    finding, for the whole process."""
    files = ring_files(base, fd)
    if isinstance(files, str):
        unjudged.append(f"io_uring fd {fd}: {files}")
        return
    todo = [p for _slot, p in files.paths if p not in done]
    if not todo:
        return
    try:
        root = os.open(f"{base}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        unjudged.append(f"io_uring fd {fd}: its root cannot be opened to look its files up")
        return
    try:
        for path in todo:
            if len(done) >= MAX_RING_FILES:
                unjudged.append(f"io_uring fd {fd}: more than {MAX_RING_FILES} registered "
                                "files; the rest not judged")
                return
            done[path] = finding = _judge(root, path, devices)
            if isinstance(finding, str):
                unjudged.append(f"io_uring fd {fd}: {finding}")
            elif finding is not None:
                if rdevs is not None and finding.major is not None and finding.minor is not None:
                    rdevs.add(os.makedev(finding.major, finding.minor))
                if finding not in held:
                    held.append(finding)
    finally:
        os.close(root)


def _judge(root: int, path: bytes, devices: GpuDevices) -> DeviceUse | NotJudged | None:
    """The GPU node registered at `path`, None when `path` is no GPU node, or why it cannot
    be told. A path that is not absolute is a pseudo file (socket:[..], anon_inode:..): never
    a device node. A path that no longer resolves, resolves to a directory (a detached mount
    shows as "/") or was deleted cannot be told."""
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
    return None
