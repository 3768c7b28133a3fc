"""Adapter for /proc, cgroup v2 and device nodes. Every reader tolerates a process exiting
mid-read (returns None), because the host is live while we look at it."""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .model import GpuDevices, PvecleanError

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


def tree_pids(cgroup_dir: Path) -> dict[int, str]:
    """PIDs of every process in a cgroup and all cgroups below it -> their relative cgroup."""
    found: dict[int, str] = {}
    if not cgroup_dir.is_dir():
        return found
    for dirpath, _dirnames, _files in os.walk(cgroup_dir):
        rel = os.path.relpath(dirpath, cgroup_dir)
        try:
            with open(os.path.join(dirpath, "cgroup.procs"), encoding="ascii") as fh:
                for line in fh:
                    if line.strip().isdigit():
                        found[int(line)] = rel
        except OSError:
            continue  # removed while we walked
    return found


def remove_empty_cgroups(cgroup_dir: Path) -> list[str]:
    """rmdir the empty cgroups of a stopped container's tree, deepest first. LXC refuses to
    start a container whose cgroup is still there; rmdir of a cgroup with a process fails
    (EBUSY), so this can never remove a live process's cgroup."""
    removed: list[str] = []
    if not cgroup_dir.is_dir():
        return removed
    dirs = sorted((d for d, _s, _f in os.walk(cgroup_dir)), key=len, reverse=True)
    for d in dirs:
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
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except (OSError, ValueError):
        return None


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


def parse_status(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
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
    st = parse_status(status_text)
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


def _looks_like_device(target: str) -> bool:
    # Only fds that point into a /dev are stat()ed: a stat through a fd on a hung network
    # file system could block, and GPU nodes live in /dev in every Proxmox layout.
    return target.startswith("/dev/") or os.path.basename(target).startswith("nvidia")


def device_fds(pid: int, devices: GpuDevices) -> list[str] | None:
    """Paths (as the process sees them) of open fds on GPU devices; None if the process is gone."""
    fd_dir = f"{PROC}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except FileNotFoundError:
        return None
    except OSError:
        return None
    held: list[str] = []
    for name in names:
        link = f"{fd_dir}/{name}"
        try:
            target = os.readlink(link)
            if not _looks_like_device(target):
                continue
            st = os.stat(link)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and devices.matches(st.st_rdev):
            held.append(f"{target} ({os.major(st.st_rdev)}:{os.minor(st.st_rdev)})")
    return held


def device_maps(pid: int, devices: GpuDevices) -> list[str]:
    """Mappings of GPU devices, matched on the device number behind /proc/PID/map_files."""
    text = _read(f"{PROC}/{pid}/maps")
    if not text:
        return []
    held: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5]
        if not _looks_like_device(path) or path in seen:
            continue
        try:
            st = os.stat(f"{PROC}/{pid}/map_files/{parts[0]}")
            rdev = st.st_rdev if stat.S_ISCHR(st.st_mode) else -1
        except OSError:
            rdev = -1
        host_paths = {os.path.basename(p) for p in devices.rdevs.values()}
        if (rdev >= 0 and devices.matches(rdev)) or (
            rdev < 0 and os.path.basename(path) in host_paths
        ):
            seen.add(path)
            label = f"{os.major(rdev)}:{os.minor(rdev)}" if rdev >= 0 else "path"
            held.append(f"{path} (mmap {label})")
    return held


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
