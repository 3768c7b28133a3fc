"""cgroup v2: where it is mounted, a container's cgroup tree and its processes, the freezer.
A container's root can create cgroups without end below its own: every walk is bounded."""

from __future__ import annotations

import errno
import os
import select
import time
from pathlib import Path

from pveclean.core.cgpaths import Layout
from pveclean.core.lazyre import lazy
from pveclean.errors import PvecleanError
from pveclean.host import procfs
from pveclean.host.procfs import read_text

_OCTAL = lazy(rb"\\([0-7]{3})")


def parse_mounts(raw: bytes) -> list[tuple[str, str, str]]:
    r"""(mount point, type, options) of each line of /proc/PID/mounts, as the kernel writes
    them (fs/proc_namespace.c show_vfsmnt): "dev point type opts 0 0\n", lines ending at \n
    only, fields split at single spaces, and a space, tab, \n or backslash in a field
    written as \ooo (octal). Any other byte is raw. A line not of six fields is left out."""
    out = []
    for line in raw.split(b"\n"):
        fields = line.split(b" ")
        if len(fields) != 6:
            continue
        point, fstype, opts = (procfs.decode(_OCTAL.sub(lambda m: bytes([int(m[1], 8)]), f))
                               for f in fields[1:4])
        out.append((point, fstype, opts))
    return out


def cgroup2_root(mounts_file: str | None = None) -> str:
    """The cgroup v2 mount point: /sys/fs/cgroup on Proxmox, elsewhere /sys/fs/cgroup/unified
    (hybrid hosts, where v1 hierarchies sit beside it). `mounts_file`: /proc/self/mounts."""
    mounts_file = mounts_file or procfs.path("self", "mounts")
    try:
        with open(mounts_file, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise PvecleanError(f"cannot read {mounts_file}: {exc.strerror}") from None
    best: str | None = None
    for mnt, fstype, _opts in parse_mounts(raw):
        if fstype == "cgroup2" and (best is None or len(mnt) < len(best)):
            best = mnt
    if best is None:
        raise PvecleanError("no cgroup v2 hierarchy is mounted (Proxmox VE 7+ uses cgroup v2)")
    return best


PARKING = "pveclean.stuck"  # at the hierarchy's root, beside LXC's lxc/ and lxc.monitor/


def park(pid: int, root: str | None = None) -> str | None:
    """Move a process pveclean gave up on (SIGKILLed, still stuck in the kernel: a GPU driver,
    a hung FUSE or NFS server) out of the cgroup it shares with pveclean, into
    <root>/pveclean.stuck. Under the drop-in that cgroup is the unit's, and after
    ExecStopPost= systemd SIGKILLs what is left there and waits for it to empty, up to
    TimeoutStopSec= (120 s) before it fails the unit; under the hookscript's post-stop it is
    the container's lxc.monitor/<vmid>, which Proxmox removes before the next start. The
    process dies where it is parked once the kernel lets it go. Returns the cgroup, or None
    where it could not be moved (no cgroup v2, gone already)."""
    try:
        target = Path(root or cgroup2_root()) / PARKING
        target.mkdir(mode=0o755, exist_ok=True)
        with open(target / "cgroup.procs", "w", encoding="ascii") as fh:
            fh.write(str(pid))
    except (OSError, PvecleanError):
        return None
    return str(target)


def container_cgroup(root: str, vmid: int) -> Path:
    return Path(root) / Layout.PVE / str(vmid)


def monitor_running(root: str, vmid: int) -> bool:
    """The container runs while its LXC monitor (cgroup lxc.monitor/<vmid>) has a process."""
    try:
        with open(Path(root) / Layout.MONITOR / str(vmid) / "cgroup.procs",
                  encoding="ascii") as fh:
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


def tree_pids(cgroup_dir: Path, limit: int | None = None, until: float | None = None
              ) -> CgroupTree:
    """PIDs of every process in a cgroup and all cgroups below it -> their relative cgroup.
    A threaded cgroup's cgroup.procs cannot be read (EOPNOTSUPP, by design: see the kernel's
    cgroup-v2.rst, "Threads"): its cgroup.threads is, each thread counted as its process.
    Walked by file descriptor (each cgroup opened from its parent's fd), so a chain past
    PATH_MAX is walked whole; a branch that cannot be read is skipped and named, the rest
    walked (`truncated` says what was not). `until` (monotonic): no cgroup listed after it."""
    found = CgroupTree()
    try:
        top = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return found  # no such tree (a stopped container): no process
    except OSError as exc:
        found.truncated = f"cannot read cgroup {_where(cgroup_dir, '.')}: {exc.strerror}"
        return found
    limit = MAX_CGROUPS if limit is None else limit
    problems: list[str] = []
    # (the parent's fd, shared by its children; the name; the relative path): opened when
    # popped, so the fds open at once are at most the depth (each with children pending),
    # whatever the width
    stack: list[tuple[_Fd | None, str, str]] = [(None, "", ".")]
    seen = 0
    while stack:
        parent, name, rel = stack.pop()
        if seen >= limit or (until is not None and seen % 64 == 63
                             and time.monotonic() >= until):
            _drop(parent, stack)
            problems.insert(0, _cut_short(seen, limit))
            break
        fd = top if parent is None else _open_child(parent, name, rel, cgroup_dir, problems)
        if fd is None:
            continue
        seen += 1
        names = _visit(fd, rel, cgroup_dir, found, problems)
        if not names:
            os.close(fd)
            continue
        own = _Fd(fd, len(names))  # its children's parent now: closed after the last
        for child in sorted(names, reverse=True):
            stack.append((own, child, child if rel == "." else f"{rel}/{child}"))
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        found.truncated = "; ".join(problems[:3]) + more
    return found


class _Fd:
    """A directory fd its children share; closed when the last of them is opened."""

    def __init__(self, fd: int, left: int) -> None:
        self.fd, self.left = fd, left

    def done(self) -> None:
        self.left -= 1
        if self.left == 0:
            os.close(self.fd)


def _drop(parent: _Fd | None, stack: list[tuple[_Fd | None, str, str]]) -> None:
    for p in [parent, *(s[0] for s in stack)]:
        if p is not None:
            p.done()
    stack.clear()


def _cut_short(seen: int, limit: int) -> str:
    if seen >= limit:
        return (f"the cgroup tree has more than {limit} cgroups; processes in the cgroups "
                f"past the first {limit} were not looked at")
    return (f"the walk of the cgroup tree ran out of time after {seen} cgroups; processes in "
            "the rest were not looked at")


def _where(cgroup_dir: Path, rel: str) -> str:
    d = str(cgroup_dir) if rel == "." else f"{cgroup_dir}/{rel}"
    return d if len(d) <= 200 else f"{d[:100]}…{d[-100:]}"


def _open_child(parent: _Fd, name: str, rel: str, cgroup_dir: Path,
                problems: list[str]) -> int | None:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW,
                       dir_fd=parent.fd)
    except FileNotFoundError:
        return None  # removed while we walked
    except OSError as exc:
        problems.append(f"cannot read cgroup {_where(cgroup_dir, rel)}: {exc.strerror}")
        return None
    finally:
        parent.done()


def _visit(fd: int, rel: str, cgroup_dir: Path, found: CgroupTree,
           problems: list[str]) -> list[str]:
    """Read one cgroup's processes into `found`; its child cgroups' names."""
    try:
        for pid in _members_at(fd):
            found[pid] = rel
    except FileNotFoundError:
        pass  # removed while we walked (its listing is then empty too)
    except OSError as exc:
        problems.append(f"cannot read {_where(cgroup_dir, rel)}/cgroup.procs: {exc.strerror}")
    try:
        with os.scandir(fd) as it:
            return [e.name for e in it if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    except OSError as exc:
        problems.append(f"cannot read cgroup {_where(cgroup_dir, rel)}: {exc.strerror}")
        return []


def _members_at(fd: int) -> list[int]:
    """The processes of the cgroup open as `fd`: cgroup.procs, or in a threaded cgroup the
    thread group of each thread in cgroup.threads (a thread that is gone by then is left
    out)."""
    try:
        return _ids_at(fd, "cgroup.procs")
    except OSError as exc:
        if exc.errno != errno.EOPNOTSUPP:
            raise
    pids: dict[int, None] = {}
    for tid in _ids_at(fd, "cgroup.threads"):
        tgid = thread_group(tid)
        if tgid is not None:
            pids[tgid] = None
    return list(pids)


def _ids_at(fd: int, name: str) -> list[int]:
    with open(os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd), encoding="ascii") as fh:
        return [int(line) for line in fh if line.strip().isdigit()]


def thread_group(tid: int) -> int | None:
    """The process a thread belongs to: the Tgid of /proc/TID/status, read by procfs's one
    status parser; None if it is gone or its status is not as the kernel writes it."""
    raw = procfs.read_bytes(procfs.path(tid, "status"))
    try:
        value = procfs.parse_status(procfs.decode(raw)).get("Tgid", "") if raw else ""
    except ValueError:
        return None
    return int(value) if value.strip().isdigit() else None


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


def parse_cgroups(text: str) -> list[tuple[str, str, str]] | None:
    r"""(hierarchy id, controllers, path) of each line of /proc/PID/cgroup, as the kernel
    writes them (kernel/cgroup/cgroup.c proc_cgroup_show): "id:controllers:path\n", the path
    raw. A cgroup name may hold any byte but "/", NUL and \n (mkdir refuses a \n), so lines
    end at \n only and the path is all after the second colon: a v1 cgroup named
    "a\f0::/lxc/130/ns" stays in its own line. None where the text is not so: the kernel
    ends every line, and writes the v2 line ("0::") once at most."""
    if not text.endswith("\n"):
        return None
    out = []
    for line in text[:-1].split("\n"):
        num, sep1, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2 and num.isdigit()):
            return None
        out.append((num, controllers, path))
    if sum(1 for num, ctl, _ in out if num == "0" and not ctl) > 1:
        return None
    return out


def read_cgroups(pid: int) -> list[tuple[str, str, str]] | None:
    raw = procfs.read_bytes(procfs.path(pid, "cgroup"))
    return None if raw is None else parse_cgroups(procfs.decode(raw))


def pid_cgroup(pid: int) -> str | None:
    """The cgroup v2 path of a process (the "0::" line), or None if it is gone or its text
    is not as the kernel writes it (see parse_cgroups: then it is in no container's tree)."""
    for num, controllers, path in read_cgroups(pid) or ():
        if num == "0" and not controllers:
            return path
    return None


def _mount_of(fstype: str, option: str | None = None) -> str | None:
    raw = procfs.read_bytes(procfs.path("self", "mounts")) or b""
    for mnt, kind, opts in parse_mounts(raw):
        if kind == fstype and (option is None or option in opts.split(",")):
            return mnt
    return None


def frozen(pid: int) -> bool:
    """Frozen by the cgroup v2 freezer, or by a v1 freezer on hybrid hosts (where, unlike v2,
    even SIGKILL waits until the cgroup is thawed)."""
    for num, controllers, path in read_cgroups(pid) or ():
        if num == "0" and not controllers:
            try:
                root: str | None = cgroup2_root()
            except PvecleanError:
                root = None
            events = read_text(f"{root}{path}/cgroup.events") if root else None
            if events and "frozen 1" in events:
                return True
        elif "freezer" in controllers.split(","):
            root = _mount_of("cgroup", "freezer")
            state = read_text(f"{root}{path}/freezer.state") if root else None
            if state and state.strip() in ("FROZEN", "FREEZING"):
                return True
    return False


# ---- the cgroup v2 freezer of a host-owned level (host/freezer.py sequences it) ------------
def freeze_file(cgroup_dir: Path) -> str | None:
    """cgroup.freeze's value ("0" or "1"); None where there is none (no such cgroup, a
    kernel before 5.2, the root cgroup)."""
    text = read_text(str(cgroup_dir / "cgroup.freeze"))
    return None if text is None else text.strip()


def set_frozen(cgroup_dir: Path, on: bool) -> None:
    """Write cgroup.freeze (OSError as the kernel says it). The freezer is hierarchical:
    a cgroup below (the tenant's ns/) cannot thaw what this level froze."""
    fd = os.open(cgroup_dir / "cgroup.freeze", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"1" if on else b"0")
    finally:
        os.close(fd)


def wait_frozen(cgroup_dir: Path, bound: float) -> bool:
    """Wait up to `bound` s for cgroup.events to say "frozen 1" (every task of the tree
    stopped). A task in uninterruptible sleep in a driver freezes only when it leaves the
    kernel, which may be never: the caller goes on after `bound` and says so."""
    end = time.monotonic() + bound
    try:
        fd = os.open(cgroup_dir / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI)  # kernfs wakes pollers when the file changes
        while True:
            if b"\nfrozen 1" in b"\n" + os.pread(fd, 4096, 0):
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            poller.poll(min(left, 0.002) * 1000)  # polled too: a missed wake costs 2 ms
    except OSError:
        return False
    finally:
        os.close(fd)
