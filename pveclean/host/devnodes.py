"""GPU device nodes: which device numbers count, and which of them a process holds through an
fd, an io_uring fixed file or a mapping; what could not be judged is said, never taken for
"not a GPU". One implementation serves the container scan and `pveclean gpus`' host scan.

An fd or a mapping is judged by the device number behind it: statx(AT_STATX_DONT_SYNC) of
/proc/PID/fd/N or /proc/PID/map_files/..., which FUSE, NFS, CIFS and ceph answer from their
cache, never asking a daemon or a server. A mount whose file system ignores DONT_SYNC (9p,
gfs2, an unknown type: see SAFE_FS) is never stat()ed where mountinfo names it; where no
mountinfo does (a detached mount, a line past the read cap), the statx is made anyway, in
the scan's worker, whose stall policy bounds a hang (the PID is then skipped and named, and
the run is `residual`). Every read is streamed and capped per process (MAX_FDS, MAX_MAPS):
past a cap the process is judged by what was read and the rest is reported as not judged.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pveclean.core.records import DeviceHow, DeviceUse, GpuDevices
from pveclean.host import fstext, procfs, statx
from pveclean.host.procfs import read_text, readlink, thread_bases

# File systems whose getattr answers statx(AT_STATX_DONT_SYNC) from kernel memory: local
# ones, pseudo ones, and FUSE, NFS, CIFS and ceph, which keep to DONT_SYNC. Any other type
# (9p, gfs2, ocfs2, afs, an unknown one) may ask a server: its files are not stat()ed.
SAFE_FS = frozenset({
    "devtmpfs", "tmpfs", "ramfs", "devpts", "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs",
    "overlay", "f2fs", "bcachefs", "jfs", "reiserfs", "squashfs", "erofs", "iso9660", "vfat",
    "msdos", "exfat", "ntfs", "ntfs3", "udf", "nilfs2", "hfsplus", "proc", "sysfs", "cgroup",
    "cgroup2", "mqueue", "hugetlbfs", "securityfs", "debugfs", "tracefs", "bpf", "pstore",
    "configfs", "fusectl", "binfmt_misc", "autofs", "nsfs", "efivarfs", "rpc_pipefs",
    "fuse", "fuseblk", "nfs", "nfs4", "cifs", "smb3", "ceph", "virtiofs",
})
MAX_FDS = 2048  # fds judged per process (one statx each, 10-25 us) ...
EXTRA_FDS = 16384  # ... and beyond it, while the scan has these left; the rest: not judged
PROGRESS_EVERY = 1024  # fds or maps lines between two progress() calls (see judge())
MAX_MAPS = 16 << 20  # bytes of one process's maps read; the mappings past it: not judged
Progress = Callable[[], None] | None
_URING_MAP = fstext.URING.encode()
_MAY_BE_RING = (stat.S_IFREG, 0)  # an anon inode's type (S_IFREG since Linux 6.15)
_IFMT = 0o170000  # the file type bits of a mode (stat.S_IFMT)
_NO_VIEW = memoryview(b"")


def safe_fs(fstype: bytes) -> bool:
    name = fstype.decode("ascii", "replace")
    return name in SAFE_FS or name.startswith("fuse.")


@dataclass(frozen=True)
class Risky:
    """The mounts of one mount namespace whose files are never stat()ed (see SAFE_FS)."""

    ids: frozenset[int]
    devs: frozenset[tuple[int, int]]


NO_RISK = Risky(frozenset(), frozenset())


def read_risky(base: str) -> Risky:
    """The risky mounts in the first fstext.MAX_MOUNTINFO bytes of the task's mountinfo."""
    ids: set[int] = set()
    devs: set[tuple[int, int]] = set()
    cut = [False]
    for m in fstext.mounts(statx.read_capped(f"{base}/mountinfo", fstext.MAX_MOUNTINFO, cut)):
        if not safe_fs(m.fstype):
            ids.add(m.mount_id)
            devs.add(m.dev)
    return Risky(frozenset(ids), frozenset(devs)) if ids else NO_RISK


class ScanCache:
    """What one scan shares between the processes it looks at: each mount namespace's risky
    mounts (the container's processes share one), and (st_dev, inode) -> st_rdev of mapped
    files, -1 for no device (processes map the same libraries)."""

    def __init__(self, tenant: bool = True) -> None:
        self.extra_fds = EXTRA_FDS  # fds past MAX_FDS that may still be judged, scan-wide
        # a container's processes (the tenant's: hostile) or the host's own (the admin's):
        # what io_uring hides (requests in flight, a ring kept by its mapping) is a finding
        # only for the tenant's; QEMU's iothreads keep polls in flight on every PVE host. So
        # is an fd or a maps file root is refused (EACCES): host root in the init namespaces
        # reads every container's; a host process it cannot read means pveclean runs without
        # the host's full privilege (a sandbox: the lab's PID 1), which only the admin can do
        self.tenant = tenant
        self.rings: dict[int, list[DeviceUse]] = {}  # ring inode -> GPU nodes it holds
        self.rdevs: dict[tuple[tuple[int, int], int], int] = {}
        self._risky: dict[str, Risky] = {}

    def risky(self, base: str) -> Risky:
        ns = readlink(f"{base}/ns/mnt")
        if ns is None:
            return read_risky(base)
        if ns not in self._risky:
            self._risky[ns] = read_risky(base)
        return self._risky[ns]


@dataclass
class Judged:
    """What one process holds, and why part of it could not be judged (empty: all was)."""

    held: list[DeviceUse] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)
    capped: bool = False  # a cap (MAX_FDS, MAX_MAPS) cut the reading
    rdevs: set[int] = field(default_factory=set)  # the device numbers `held` names
    rings: set[int] = field(default_factory=set)  # inodes of the io_uring rings read by fd
    mapped_rings: dict[int, str] = field(default_factory=dict)  # ring inode -> its mapping


def _fd_info(base: str, fd: str) -> fstext.FdInfo | None:
    raw = procfs.read_bytes(f"{base}/fdinfo/{fd}", 512, one_read=True)
    return None if raw is None else fstext.parse_fdinfo(raw)


class _FdTable:
    """One task's fd table, judged fd by fd (see judge_fds)."""

    def __init__(self, base: str, dfd: int, devices: GpuDevices, cache: ScanCache,
                 out: Judged) -> None:
        self.base, self.dfd, self.devices, self.cache, self.out = base, dfd, devices, cache, out
        self.seen: set[tuple[tuple[int, int], int]] = set()  # GPU files already held
        self.ring_done: dict[bytes, DeviceUse | str | None] = {}  # uring.judge_ring's
        self.risky: Risky | None = None

    def judge(self, name: str) -> None:
        if self.risky is None:
            self.risky = self.cache.risky(self.base)
        if self.risky.ids:  # only here is fdinfo read before the statx
            info = _fd_info(self.base, name)
            if info is not None and info.mnt_id in self.risky.ids:
                return
        st = statx.statx(name, self.dfd)
        if isinstance(st, int):
            self._failed(name, st)
        elif stat.S_ISCHR(st.mode):
            if self.devices.matches(st.rdev) and (st.dev, st.ino) not in self.seen:
                info = _fd_info(self.base, name)
                if info is not None and info.flags & fstext.O_PATH:
                    return  # an O_PATH fd never opened the device
                self.seen.add((st.dev, st.ino))
                link = self._link(name) or None  # None: the fd's number names it
                self.out.held.append(DeviceUse(link, os.major(st.rdev), os.minor(st.rdev),
                                               DeviceHow.FD, None if link else name))
                self.out.rdevs.add(st.rdev)
        elif st.dev == statx.anon_inode_dev() and self._link(name) == fstext.URING:
            self._ring(name)

    def _failed(self, name: str, err: int) -> None:
        try:
            target = os.readlink(name, dir_fd=self.dfd)
        except FileNotFoundError:
            return  # closed since it was listed
        except OSError as exc:  # root refused both (EACCES): unknown, not innocent
            if self.cache.tenant:  # see ScanCache.tenant
                self.out.unjudged.append(f"fd {name}: statx ({os.strerror(err)}) and readlink "
                                         f"({exc.strerror}) refused; not judged")
            return
        if target == fstext.URING:
            self._ring(name)
        elif target.startswith("/"):
            self.out.unjudged.append(f"fd {name} ({target[:200]}): statx failed "
                                     f"({os.strerror(err)}); not judged")

    def _link(self, name: str) -> str | None:
        try:
            return os.readlink(name, dir_fd=self.dfd)
        except OSError:
            return None

    def _ring(self, name: str) -> None:
        from pveclean.host import uring  # a ring's registered files: rare, so judged apart
        ino, mine, in_flight = uring.judge_ring(self.base, name, self.devices, self.out.held,
                                                self.out.unjudged, self.ring_done,
                                                self.cache.tenant)
        self.out.rdevs.update(os.makedev(d.major, d.minor) for d in mine
                              if d.major is not None and d.minor is not None)
        if in_flight and self.cache.tenant:  # see ScanCache.tenant
            self.out.unjudged.append(in_flight)
        if ino is not None:
            self.out.rings.add(ino)
            self.cache.rings[ino] = mine


def _judge_table(base: str, devices: GpuDevices, cache: ScanCache, out: Judged,
                 progress: Progress, first: bool = False) -> int | None:
    """Judge the fd table of the task at `base` into `out`, streamed (os.scandir), at most
    MAX_FDS fds; how many it has, None if it is gone."""
    try:
        dfd = os.open(f"{base}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    table = _FdTable(base, dfd, devices, cache, out)
    table.risky = cache.risky(base)
    # most fds are settled by one raw statx, read through views of its buffer (statx.U16,
    # U32): a character device that is no GPU node, or anything that cannot be a ring
    fast = None if table.risky.ids else statx.quick()
    quick, m16, m32 = fast or (None, _NO_VIEW, _NO_VIEW)
    amaj, amin = statx.anon_inode_dev()
    rdevs, majors, makedev = devices.rdevs, devices.majors, os.makedev
    n = 0
    try:
        with os.scandir(dfd) as entries:
            for entry in entries:
                if n >= MAX_FDS:
                    if cache.extra_fds <= 0:
                        out.unjudged.append(f"more than {n} open fds: those past the first "
                                            f"{n} not judged")
                        out.capped = True
                        break
                    cache.extra_fds -= 1
                n += 1
                if progress is not None and n % PROGRESS_EVERY == 0:
                    progress()
                name = entry.name
                if quick is None:
                    table.judge(name)
                elif quick(dfd, name.encode(), statx.FLAGS, statx.MASK, statx.BUF) != 0:
                    table._failed(name, statx.quick_errno())  # why, without a second statx
                else:
                    kind = m16[statx.MODE] & _IFMT
                    if kind == stat.S_IFCHR:  # GpuDevices.matches(), inline
                        major = m32[statx.RDEV]
                        if ((major & 0xFFF) not in majors
                                and makedev(major, m32[statx.RDEV + 1]) not in rdevs):
                            continue
                    elif (kind not in _MAY_BE_RING or m32[statx.DEV] != amaj
                          or m32[statx.DEV + 1] != amin):
                        continue
                    table.judge(name)
                if first and out.held:
                    break
    except OSError:
        return n or None  # gone while listed
    finally:
        os.close(dfd)
    return n


def judge_fds(pid: int, devices: GpuDevices, cache: ScanCache | None = None,
              progress: Progress = None, first: bool = False) -> Judged | None:
    """The GPU nodes `pid` holds through fds and io_uring fixed files, at any path (a bind
    mount of /dev/nvidia0 at /opt/g counts), and what could not be judged; None if the
    process is gone. Every distinct fd table of the thread group is read once: a thread
    with a table of its own (unshare(CLONE_FILES)), the threads of a zombie leader (whose
    /proc/PID/fd is empty), see fdtables.py."""
    cache = cache or ScanCache()
    out = Judged()
    n = _judge_table(procfs.path(pid), devices, cache, out, progress, first)
    if n is None:
        return None
    if n and procfs.one_task(pid):  # (an empty table, as a zombie leader's: its threads listed)
        return out  # no thread of it can have a table of its own (one stat, no listing)
    from pveclean.host import fdtables

    try:
        others = fdtables.other_tables(pid, out.unjudged)
    except fdtables.NoKcmp:  # tables cannot be told apart: the leader's, or its threads'
        others = thread_bases(pid, "fd") if n == 0 else []
    for tbase in others:
        if first and out.held:
            break
        _judge_table(tbase, devices, cache, out, progress, first)
    return out


def device_fds(pid: int, devices: GpuDevices, cache: ScanCache | None = None
               ) -> list[DeviceUse] | None:
    """judge_fds()'s GPU nodes alone; None if the process is gone."""
    got = judge_fds(pid, devices, cache)
    return None if got is None else got.held


def _judge_maps(base: str, devices: GpuDevices, cache: ScanCache, out: Judged,
                progress: Progress) -> int:
    """Judge the mappings of the task at `base` into `out`; how many lines maps had. Read in
    chunks, parsed line by line, each (st_dev, inode) judged once; at most MAX_MAPS bytes."""
    cut = [False]
    seen: set[tuple[bytes, bytes]] = set()  # (dev, inode) as maps shows them
    risky: Risky | None = None
    n = 0
    refused: list[int] = []
    for line in fstext.lines(statx.read_capped(f"{base}/maps", MAX_MAPS, cut, refused)):
        n += 1
        if progress is not None and n % PROGRESS_EVERY == 0:
            progress()
        f = line.split(b" ", 5)
        if len(f) < 5 or f[4] == b"0" or (f[3], f[4]) in seen:
            continue  # anonymous, [heap], [stack], [anon:...]; or judged above
        seen.add((f[3], f[4]))
        m = fstext.parse_mapping(line)
        if m is None:
            continue
        if m.name == _URING_MAP:  # a ring kept by its mapping: judged in judge()
            out.mapped_rings[m.inode] = m.map_file
            continue
        key = (m.dev, m.inode)
        rdev = cache.rdevs.get(key)
        if rdev is None:
            if risky is None:
                risky = cache.risky(base)
            rdev = -1
            if m.dev not in risky.devs:
                st = statx.statx(f"{base}/map_files/{m.map_file}")
                if isinstance(st, int):
                    if st != errno.ENOENT:  # unmapped since
                        out.unjudged.append(f"mapping {m.map_file}: statx failed "
                                            f"({os.strerror(st)}); not judged")
                    continue
                rdev = st.rdev if stat.S_ISCHR(st.mode) else -1
            cache.rdevs[key] = rdev
        if rdev >= 0 and devices.matches(rdev):
            out.held.append(DeviceUse(m.name.decode("utf-8", "replace"), os.major(rdev),
                                      os.minor(rdev), DeviceHow.MMAP))
            out.rdevs.add(rdev)
    if refused and refused[0] not in (errno.ENOENT, errno.ESRCH) and cache.tenant:
        out.unjudged.append(f"maps could not be read ({os.strerror(refused[0])}): its "
                            "mappings not judged")
    if cut[0]:
        out.unjudged.append(f"maps longer than {MAX_MAPS >> 20} MiB: the mappings past it "
                            "not judged")
        out.capped = True
    return n


def judge_maps(pid: int, devices: GpuDevices, cache: ScanCache | None = None,
               progress: Progress = None) -> Judged:
    """Mappings of GPU devices at any path, matched on the device number behind
    /proc/PID/map_files, and what could not be judged. A zombie leader's threads share its
    mappings: the first live thread's maps are read then."""
    cache = cache or ScanCache()
    out = Judged()
    if _judge_maps(procfs.path(pid), devices, cache, out, progress) == 0:
        for tbase in thread_bases(pid, "maps"):
            if _judge_maps(tbase, devices, cache, out, progress):
                break
    return out


def device_maps(pid: int, devices: GpuDevices, cache: ScanCache | None = None
                ) -> list[DeviceUse]:
    """judge_maps()'s GPU nodes alone."""
    return judge_maps(pid, devices, cache).held


def judge(pid: int, devices: GpuDevices, cache: ScanCache, progress: Progress = None
          ) -> Judged | None:
    """fds, io_uring fixed files and mappings of `pid` together; None if it is gone.
    `progress`: called every PROGRESS_EVERY fds or maps lines, to tell the worker's stall
    policy that a long table is being read, not hung on (worker.note or worker.mark)."""
    got = judge_fds(pid, devices, cache, progress)
    if got is None:
        return None
    maps = judge_maps(pid, devices, cache, progress)
    got.held += maps.held
    got.rdevs |= maps.rdevs
    got.unjudged += maps.unjudged
    got.capped |= maps.capped
    if cache.tenant:  # see ScanCache.tenant
        mapped_rings(got, maps.mapped_rings, cache)
    return got


def mapped_rings(got: Judged, mapped: dict[int, str], cache: ScanCache) -> None:
    """An io_uring ring the process keeps only by its SQ/CQ mapping (its fd closed, or
    registered with IORING_REGISTER_RING_FDS and closed) still holds its registered files
    and requests. The kernel shows such a ring's files only through an fd of it: one read
    through another process's fd in this scan lends its finding; else it is not judged."""
    for ino, where in sorted(mapped.items()):
        if ino in got.rings:
            continue
        lent = cache.rings.get(ino)
        if lent is None:
            got.unjudged.append(f"io_uring ring (inode {ino}) kept by its mapping {where} in no "
                                "fd table read: its registered files and requests cannot be "
                                "read; not judged")
            continue
        for d in lent:
            if d not in got.held:
                got.held.append(d)
                if d.major is not None and d.minor is not None:
                    got.rdevs.add(os.makedev(d.major, d.minor))


def still_holds(pid: int, devices: GpuDevices) -> bool:
    """For the identity check just before a signal: does `pid`, found holding by the scan
    (or named by the probe), hold a GPU node still, or can that not be ruled out (part of it
    not judged)? Stops at the first GPU node; reads as many fds as discovery could (MAX_FDS
    and EXTRA_FDS): a process discovery read whole and found holding nothing is read whole
    again, so the probe's word alone never makes it "may hold" past a cap."""
    cache = ScanCache()
    got = judge_fds(pid, devices, cache, first=True)
    if got is None:
        return False
    if not got.held:
        maps = judge_maps(pid, devices, cache)
        got.held, got.unjudged = maps.held, got.unjudged + maps.unjudged
        mapped_rings(got, maps.mapped_rings, cache)
    return bool(got.held or got.unjudged)


def nvidia_majors(proc_devices: str | None = None) -> frozenset[int]:
    """Majors of character drivers named nvidia* (nvidia, nvidia-uvm, nvidia-caps, ...), from
    `proc_devices` (/proc/devices by default)."""
    text = read_text(proc_devices or procfs.path("devices")) or ""
    majors: set[int] = set()
    in_char = False
    for line in text.split("\n"):
        if line.startswith("Character"):
            in_char = True
        elif line.startswith("Block"):
            in_char = False
        elif in_char:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].startswith("nvidia"):
                majors.add(int(parts[0]))
    return frozenset(majors)


def only_minors(devices: GpuDevices, minors: Iterable[int]) -> GpuDevices:
    """Only the /dev/nvidiaN nodes of these N, by device number, no whole major: a holder of
    nvidiactl or nvidia-uvm alone holds no GPU."""
    nodes = {f"nvidia{m}" for m in minors}
    return GpuDevices({r: p for r, p in devices.rdevs.items()
                       if os.path.basename(p) in nodes}, frozenset())


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

