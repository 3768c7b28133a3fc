"""Adapter for /proc, cgroup v2 and device nodes. Every reader tolerates a process exiting
mid-read (returns None), because the host is live while we look at it."""

from __future__ import annotations

import glob
import os
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .model import GpuDevices, PvecleanError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROC = "/proc"


def cgroup2_root(mounts_file: str = "/proc/self/mounts") -> str:
    """The cgroup v2 mount point: /sys/fs/cgroup on Proxmox, elsewhere /sys/fs/cgroup/unified."""
    best: str | None = None
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    mnt = parts[1].replace("\\040", " ")
                    if best is None or len(mnt) < len(best):
                        best = mnt
    except OSError as exc:
        raise PvecleanError(f"cannot read {mounts_file}: {exc.strerror}") from None
    if best is None:
        raise PvecleanError("no cgroup v2 hierarchy is mounted (Proxmox VE 7+ uses cgroup v2)")
    return best


def container_cgroup(root: str, vmid: int) -> Path:
    return Path(root) / "lxc" / str(vmid)


def monitor_running(root: str, vmid: int) -> bool:
    """The container runs while its LXC monitor (cgroup lxc.monitor/<vmid>) has a process."""
    try:
        with open(Path(root) / "lxc.monitor" / str(vmid) / "cgroup.procs", encoding="ascii") as fh:
            return bool(fh.read().strip())
    except OSError:
        return False


def nothing_left(cgroup_dir: Path, running: bool) -> bool:
    """A stopped container whose cgroup tree is empty: nothing to find there, so a run asks
    NVML nothing (its init can take seconds on a host without nvidia-persistenced)."""
    return not running and not tree_pids(cgroup_dir)


MAX_CGROUPS = 10_000  # a container's root can create cgroups without end below ns/


class CgroupTree(dict[int, str]):
    """PID -> its cgroup relative to the walked root. `truncated` says why part of the tree
    was not walked (too many cgroups, a path too long): processes there were not seen."""

    truncated: str | None = None

    def __bool__(self) -> bool:
        return bool(len(self)) or self.truncated is not None


def _cgroup_dirs(cgroup_dir: Path, limit: int) -> tuple[list[str], str | None]:
    """Every cgroup below `cgroup_dir` (itself first), iteratively: no recursion limit, at
    most `limit` of them. Deepest last, as a stack walk finds them."""
    root = str(cgroup_dir)
    found: list[str] = []
    stack = [root]
    while stack:
        d = stack.pop()
        if len(found) >= limit:
            return found, (f"the cgroup tree has more than {limit} cgroups; processes in "
                           f"the cgroups past the first {limit} were not looked at")
        found.append(d)
        try:
            with os.scandir(d) as it:
                subdirs = [e.path for e in it if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            continue  # removed while we walked
        except OSError as exc:
            where = d if len(d) <= 200 else f"{d[:100]}…{d[-100:]}"
            return found, f"cannot read cgroup {where}: {exc.strerror}"
        stack.extend(sorted(subdirs, reverse=True))
    return found, None


def tree_pids(cgroup_dir: Path, limit: int | None = None) -> CgroupTree:
    """PIDs of every process in a cgroup and all cgroups below it -> their relative cgroup."""
    found = CgroupTree()
    if not cgroup_dir.is_dir():
        return found
    dirs, found.truncated = _cgroup_dirs(cgroup_dir, MAX_CGROUPS if limit is None else limit)
    root = str(cgroup_dir)
    for d in dirs:
        rel = "." if d == root else d[len(root) + 1 :]
        try:
            with open(os.path.join(d, "cgroup.procs"), encoding="ascii") as fh:
                for line in fh:
                    if line.strip().isdigit():
                        found[int(line)] = rel
        except FileNotFoundError:
            continue  # removed while we walked
        except OSError as exc:
            where = d if len(d) <= 200 else f"{d[:100]}…{d[-100:]}"
            found.truncated = found.truncated or (f"cannot read {where}/cgroup.procs: "
                                                  f"{exc.strerror}")
    return found


def remove_empty_cgroups(cgroup_dir: Path) -> list[str]:
    """rmdir the empty cgroups of a stopped container's tree, deepest first. LXC refuses to
    start a container whose cgroup is still there; rmdir of a cgroup with a process fails
    (EBUSY), so this can never remove a live process's cgroup."""
    removed: list[str] = []
    if not cgroup_dir.is_dir():
        return removed
    dirs, _ = _cgroup_dirs(cgroup_dir, MAX_CGROUPS)
    for d in sorted(dirs, key=len, reverse=True):
        try:
            os.rmdir(d)
            removed.append(d)
        except OSError:
            continue
    return removed


def pid_cgroup(pid: int) -> str | None:
    """The cgroup v2 path of a process (the "0::" line), or None if it is gone."""
    text = _read(f"{PROC}/{pid}/cgroup")
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def in_tree(cgroup_path: str | None, vmid: int) -> bool:
    return cgroup_path is not None and (
        cgroup_path == f"/lxc/{vmid}" or cgroup_path.startswith(f"/lxc/{vmid}/")
    )


def _read(path: str) -> str | None:
    """A whole /proc or /sys file as text; None if it cannot be read. Plain os.read: a scan
    reads several files of every process, and a text-mode open() costs three times as much."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


@dataclass(frozen=True)
class ProcStatus:
    pid: int
    name: str
    state: str
    ppid: int
    uid: int
    nspid: tuple[int, ...]
    starttime: int


def parse_stat(text: str) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) from /proc/PID/stat; comm may hold spaces and ')'."""
    end = text.rfind(")")
    if end < 0:
        return None
    rest = text[end + 2 :].split()
    if len(rest) < 20:
        return None
    try:
        return rest[0], int(rest[1]), int(rest[19])
    except ValueError:
        return None


STATUS_KEYS = frozenset({"Name", "Uid", "NSpid"})


def parse_status(text: str, keys: frozenset[str] | None = None) -> dict[str, str]:
    """/proc/PID/status as key -> value; only `keys` if given (it stops once it has them:
    the kernel writes each key once, and escapes a newline in a process's name)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and (keys is None or key in keys):
            out[key] = value.strip()
            if keys is not None and len(out) == len(keys):
                break
    return out


def read_status(pid: int) -> ProcStatus | None:
    stat_text = _read(f"{PROC}/{pid}/stat")
    status_text = _read(f"{PROC}/{pid}/status")
    if stat_text is None or status_text is None:
        return None
    parsed = parse_stat(stat_text)
    if parsed is None:
        return None
    state, ppid, starttime = parsed
    st = parse_status(status_text, STATUS_KEYS)
    try:
        uid = int(st.get("Uid", "0").split()[0])
        nspid = tuple(int(x) for x in st.get("NSpid", str(pid)).split())
    except ValueError:
        return None
    return ProcStatus(pid, st.get("Name", "?"), state, ppid, uid, nspid or (pid,), starttime)


def cmdline(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            raw = fh.read(8192)
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")


def exe(pid: int) -> str | None:
    try:
        return os.readlink(f"{PROC}/{pid}/exe")
    except OSError:
        return None


def wchan(pid: int) -> str | None:
    text = _read(f"{PROC}/{pid}/wchan")
    return text.strip() if text and text.strip() not in ("", "0") else None


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
    try:
        with open(f"{base}/mountinfo", "rb") as fh:
            raw = fh.read(MAX_MOUNTINFO)
    except OSError:
        return Mounts({}, {})
    return parse_mountinfo(raw.decode("utf-8", "replace"))


def _fd_mnt_id(base: str, fd: str) -> int | None:
    """The mount ID of fd `fd` of the task at `base` (fdinfo's third line)."""
    try:
        f = os.open(f"{base}/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(f, 512)
    except OSError:
        return None
    finally:
        os.close(f)
    at = raw.find(b"mnt_id:")
    if at < 0:
        return None
    value = raw[at + 7 : raw.find(b"\n", at)].strip()
    return int(value) if value.isdigit() else None


def live_threads(pid: int) -> int:
    """Threads of `pid` that have not exited, the leader excluded (a zombie leader's
    process lives on while one of them runs)."""
    n = 0
    for base in _bases(pid, "task"):
        text = _read(f"{base}/stat")
        parsed = parse_stat(text) if text else None
        if parsed and parsed[0] not in ("Z", "X"):
            n += 1
    return n


def _bases(pid: int, kind: str) -> list[str]:
    """Where to read a process's `kind` (fd, maps): /proc/PID, and when the leader has
    exited (a zombie whose fd/ and maps are empty) each live thread's /proc/PID/task/TID."""
    try:
        tids = [t for t in os.listdir(f"{PROC}/{pid}/task") if t.isdigit() and t != str(pid)]
    except OSError:
        return []
    return [f"{PROC}/{pid}/task/{t}" for t in sorted(tids, key=int)]


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
        try:
            ns = os.readlink(f"{base}/ns/mnt")
        except OSError:
            return read_mounts(base)
        if fresh or ns not in self._mounts:
            self._mounts[ns] = read_mounts(base)
        return self._mounts[ns]


def _fd_holds(base: str, name: str, devices: GpuDevices, cache: ScanCache,
              mounts: list[Any]) -> str | None:
    """The GPU node fd `name` of the task at `base` holds, matched by device number only."""
    try:
        target = os.readlink(f"{base}/fd/{name}")  # never touches the file's own file system
    except OSError:
        return None
    if not target.startswith("/"):
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
    base = f"{PROC}/{pid}"
    try:
        names = os.listdir(f"{base}/fd")
    except OSError:
        return None
    held: list[str] = []
    todo = [(base, names)] if names else []
    if not names:
        for tbase in _bases(pid, "fd"):
            try:
                todo.append((tbase, os.listdir(f"{tbase}/fd")))
            except OSError:
                continue
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
    base = f"{PROC}/{pid}"
    text = _read(f"{base}/maps")
    if not text:
        for tbase in _bases(pid, "maps"):  # zombie leader: its threads share the mappings
            text = _read(f"{tbase}/maps")
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


def nvidia_majors(proc_devices: str = f"{PROC}/devices") -> frozenset[int]:
    """Majors of character drivers named nvidia* (nvidia, nvidia-uvm, nvidia-caps, ...)."""
    text = _read(proc_devices) or ""
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


def gpu_devices(patterns: Iterable[str], proc_devices: str = f"{PROC}/devices") -> GpuDevices:
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


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)



def _mount_of(fstype: str, option: str | None = None) -> str | None:
    text = _read("/proc/self/mounts") or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == fstype and (
            option is None or option in parts[3].split(",")
        ):
            return parts[1]
    return None


def frozen(pid: int) -> bool:
    """Frozen by the cgroup v2 freezer, or by a v1 freezer on hybrid hosts (where, unlike v2,
    even SIGKILL waits until the cgroup is thawed)."""
    text = _read(f"{PROC}/{pid}/cgroup") or ""
    for line in text.splitlines():
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if num == "0" and not controllers:
            try:
                root: str | None = cgroup2_root()
            except PvecleanError:
                root = None
            events = _read(f"{root}{path}/cgroup.events") if root else None
            if events and "frozen 1" in events:
                return True
        elif "freezer" in controllers.split(","):
            root = _mount_of("cgroup", "freezer")
            state = _read(f"{root}{path}/freezer.state") if root else None
            if state and state.strip() in ("FROZEN", "FREEZING"):
                return True
    return False
