"""`pveclean gpus`: every GPU of this host and who uses it, attributed to its owner.

Owners: a container (VMID, hostname, the systemd unit inside it), the host (process and its
systemd unit), or a VM that the GPU is passed to (bound to vfio-pci, named in a `hostpci`
line). Memory comes from NVML per process and per GPU; what no process accounts for is
shown as a leak.

Fast on a busy host: a container whose config passes no GPU through cannot open a GPU node
(its devices cgroup denies it), so its processes are not read at all. The containers that can
are scanned as `pveclean ct` scans one (discover.scan_host); the host's own processes
(everything outside the `lxc/` cgroup tree) the same way. NVML's PIDs are attributed by their
cgroup, so a process with GPU memory is never missed, wherever it runs.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import procfs, pveconf, report
from .config import Config
from .discover import Scope, doing, stall_for, stall_problem, stalled_on, w_scan
from .model import EXIT_ACCESS, EXIT_OK, GpuDevices, GpuMemory, Holder, PvecleanError
from .nvml import Nvml, NvmlUnavailable
from .text import safe
from .units import unit_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

PCI_DEVICES = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"
LEAK_SLACK_MIB = 64  # as the post-stop hook: allocations NVML shows without a process
_PCI = re.compile(r"(?:([0-9a-f]{4,}):)?([0-9a-f]{2}:[0-9a-f]{2})(?:\.([0-9a-f]))?")
_RDEV = re.compile(r"\((?:mmap )?(\d+):(\d+)\)$")
_NODE = re.compile(r"nvidia(\d+)")
_ALLOW_ANY = re.compile(r"^\s*(a\b|[cb*]\s+\*:\*)")


@dataclass
class Proc:
    """One process that holds a GPU node or GPU memory."""

    host_pid: int
    name: str
    owner: str  # "ct", "host" or "unknown"
    vmid: int | None = None
    ct_pid: int | None = None
    unit: str | None = None
    cgroup: str | None = None
    devices: list[str] = field(default_factory=list)
    minors: set[int] = field(default_factory=set)  # N of each /dev/nvidiaN it holds
    memory: dict[int, int | None] = field(default_factory=dict)  # GPU index -> MiB

    def as_dict(self) -> dict[str, Any]:
        return {"host_pid": self.host_pid, "name": self.name, "owner": self.owner,
                "vmid": self.vmid, "ct_pid": self.ct_pid, "unit": self.unit,
                "cgroup": self.cgroup, "devices": self.devices,
                "gpu_memory_mib": {int(k): v for k, v in sorted(self.memory.items())}}


# ---- what to scan -------------------------------------------------------------------------
def may_use_gpus(conf: pveconf.CtConfig, majors: frozenset[int]) -> bool:
    """Whether the container's devices cgroup can let it open a GPU node: a passthrough
    line, or a devices rule that allows every device (`a`, `c *:* rwm`)."""
    if conf.gpu_lines(majors):
        return True
    return any(k in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
               and _ALLOW_ANY.match(v) for k, v in conf.lines)


def host_pids(root: Path) -> dict[int, str]:
    """PIDs outside the Proxmox containers' cgroups (`lxc/<vmid>`) -> their cgroup path: the
    host's own, and those of cgroups below `lxc/` that are no VMID (plain LXC containers)."""
    found: dict[int, str] = {}

    def add(directory: Path, prefix: str) -> None:
        for pid, rel in procfs.tree_pids(directory).items():
            found[pid] = prefix if rel == "." else f"{prefix}/{rel}"

    for d, prefix in ((root, ""), (root / "lxc", "/lxc")):
        try:
            with open(d / "cgroup.procs", encoding="ascii") as fh:
                found.update((int(ln), prefix or "/") for ln in fh if ln.strip().isdigit())
            entries = [e for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for e in entries:
            if (d == root and e.name == "lxc") or (d != root and e.name.isdigit()):
                continue
            add(Path(e.path), f"{prefix}/{e.name}")
    return found


def _maps_mention(pid: int, needles: tuple[bytes, ...]) -> bool:
    """Cheap pre-check before parsing /proc/PID/maps: does any GPU node's name occur?"""
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return any(n in data for n in needles)


def _needles(devices: GpuDevices) -> tuple[bytes, ...]:
    """What _maps_mention looks for: b"nvidia" and the GPU nodes' names, without a name that
    contains another (nvidia0 and nvidiactl add nothing to nvidia: one search, not eight)."""
    names = {b"nvidia", *(os.path.basename(p).encode() for p in devices.rdevs.values())}
    return tuple(sorted(n for n in names if n and not any(o != n and o in n for o in names)))


def _fds(pid: int, devices: GpuDevices, same_ns: bool, cache: dict[str, str | None],
         mounts: procfs.ScanCache) -> list[str] | None:
    """procfs.device_fds for a host process, with fewer system calls: paths are looked up
    relative to the fd directory, only a path under /dev or naming nvidia is looked at, and
    one of our own mount namespace once for the whole scan (what a path leads to is the same
    for every process that sees the same /dev: `cache` keeps path -> held or None); in
    another mount namespace each such fd is. Looked at as procfs does: never stat()ed on
    FUSE, NFS... None: gone."""
    base = f"{procfs.PROC}/{pid}"
    try:
        dfd = os.open(f"{base}/fd", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    held: list[str] = []
    task_mounts: list[Any] = [None, False]
    try:
        for name in os.listdir(dfd):
            try:
                target = os.readlink(name, dir_fd=dfd)
            except OSError:
                continue
            if not (target.startswith("/dev/") or "nvidia" in target):
                continue  # as procfs (a superset): only what may be a node is looked at
            if same_ns and target in cache:
                hit = cache[target]
            else:
                rdev = procfs.fd_char_rdev(base, name, mounts, task_mounts)
                hit = (f"{target} ({os.major(rdev)}:{os.minor(rdev)})"
                       if rdev is not None and devices.matches(rdev) else None)
                if same_ns:
                    cache[target] = hit
            if hit is not None:
                held.append(hit)
    except OSError:
        return None
    finally:
        os.close(dfd)
    return held


def _mntns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def w_host_share(pids: list[tuple[int, str]], devices: GpuDevices, own_ns: str | None,
                 needles: tuple[bytes, ...], skip: frozenset[int], stall: float | None
                 ) -> list[Proc]:
    """In a reader: the GPU holders among `pids` (host PID, cgroup). Each PID is marked
    before its /proc files are read, so a read that hangs is pinned to its PID (a mark, not a
    note: there are thousands; the reader's receive() bounds each by `stall`)."""
    from . import worker

    out = []
    cache: dict[str, str | None] = {}
    mounts = procfs.ScanCache()
    for pid, cgroup in pids:
        if pid in skip:
            continue  # its reads hung in an earlier try
        worker.mark(pid)
        fds = _fds(pid, devices, own_ns is not None and _mntns(pid) == own_ns, cache, mounts)
        if fds is None:
            continue
        maps = (procfs.device_maps(pid, devices, mounts) if _maps_mention(pid, needles)
                else [])
        if not fds and not maps:
            continue
        st = procfs.read_status(pid)
        if st is None or st.state == "Z":
            continue
        out.append(Proc(pid, full_name(st.name, procfs.cmdline(pid)), "host", cgroup=cgroup,
                        unit=unit_of(cgroup), devices=fds + maps))
    return out


def full_name(comm: str, cmdline: str) -> str:
    """The kernel cuts comm to 15 characters ("nvidia-persiste"): show argv[0]'s base name
    when it continues comm."""
    argv0 = os.path.basename(cmdline.split(" ", 1)[0])
    return argv0 if len(comm) == 15 and argv0.startswith(comm) else comm


READER_PROCESSES = 500  # host processes per forked reader beyond the first
MAX_READERS = 8
UNBOUNDED_READ = 30.0  # s: a reader's bound when the caller sets none (tests, in-process use)


def _left(end: float | None) -> float:
    return UNBOUNDED_READ if end is None else max(end - time.monotonic(), 0.0)


class Reader:
    """A forked reader of /proc for `gpus`, as the scan worker of a run (discover.Reads):
    a PID whose reads stall past `stall` (a process wedged in the GPU driver blocks a read
    of its maps or cmdline; a hung FUSE or NFS mount) is skipped from then on and named, and
    the read is asked again without it, until `end` (monotonic)."""

    def __init__(self, end: float | None, stall: float, problems: list[str]) -> None:
        from .worker import Worker

        self.worker = Worker(marks=True)
        self.end, self.stall, self.problems = end, stall, problems
        self.skip: set[int] = set()
        self._sent: tuple[Callable[..., Any], tuple[Any, ...], str] | None = None

    def send(self, fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> None:
        """Ask fn(*args, skip, stall) and go on; receive() takes the answer."""
        self._sent = (fn, args, what)
        self.worker.send(fn, *args, frozenset(self.skip), self.stall, timeout=_left(self.end),
                         what=what)

    def receive(self) -> Any:
        """The answer to send(), read again without each PID that stalled; None (and a
        problem said) when it did not finish by `end` or failed."""
        from .worker import RemoteError, WorkerError

        if self._sent is None:
            raise RuntimeError("Reader.receive() without a send()")  # a bug of the caller
        fn, args, what = self._sent
        while True:
            try:
                return self.worker.receive(_left(self.end), what, stall=self.stall)
            except WorkerError as exc:
                pid = stalled_on(exc)
                if pid is None:
                    self.problems.append(f"{exc} ({doing(exc.note)})")  # deadline, or it died
                    return None
                self.skip.add(pid)
                self.problems.append(stall_problem(pid, self.stall, "not looked at"))
            except RemoteError as exc:  # a bug, not a hang: said, never a traceback
                self.problems.append(f"{what} failed: {exc}")
                return None
            try:
                self.send(fn, args, what)
            except WorkerError:
                self.problems.append(f"{what} did not finish in time")
                return None

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> Any:
        self.send(fn, args, what)
        return self.receive()

    def close(self) -> None:
        self.worker.close()


class HostScan:
    """The host's own GPU holders (fds and mappings of GPU nodes, matched on the device
    number as scan_host does): how many processes were looked at, and what could not be.

    The host's processes are split between forked Readers, one per 500 and at most one per
    core (and 8): the reads are short system calls into /proc, and threads made them slower
    (each call hands the GIL over: 2 threads took 1.5-2x and 4 threads 2.5x the time of one,
    on 2 cores), where two processes took half. The readers start at once and read while the
    caller does the rest (the containers, NVML); result() takes their answers. A PID whose
    reads hang is skipped and named; a reader that does not finish by `end` (monotonic) is
    given up on and its share named."""

    def __init__(self, root: Path, devices: GpuDevices, exclude: set[int], stall: float,
                 end: float | None = None, readers: int | None = None) -> None:
        needles = _needles(devices)
        pids = [(p, cg) for p, cg in host_pids(root).items() if p not in exclude]
        self.count = len(pids)
        own_ns = _mntns("self")
        n = readers or min(os.cpu_count() or 1, MAX_READERS,
                           max(1, len(pids) // READER_PROCESSES))
        self.shares = [pids[i::n] for i in range(n)]
        self.problems: list[str] = []
        self.readers: list[Reader] = []
        try:
            for share in self.shares:
                reader = Reader(end, stall, self.problems)
                self.readers.append(reader)
                reader.send(w_host_share, (share, devices, own_ns, needles),
                            "reading the host's processes")
        except BaseException:
            self.close()
            raise

    def result(self) -> tuple[list[Proc], int, list[str]]:
        found: list[Proc] = []
        for reader, share in zip(self.readers, self.shares, strict=True):
            got = reader.receive()
            if got is None:
                self.problems.append(f"{len(share)} of the host's processes were not looked "
                                     "at; their holders are shown only as NVML lists them")
            else:
                found += got
        self.close()
        return found, self.count, self.problems

    def close(self) -> None:
        for reader in self.readers:
            reader.close()

    def __enter__(self) -> HostScan:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def scan_host_processes(root: Path, devices: GpuDevices, exclude: set[int],
                        end: float | None = None, readers: int | None = None,
                        stall: float = 1.0) -> tuple[list[Proc], int, list[str]]:
    """HostScan(...).result(): the host's holders, processes looked at, what was not."""
    with HostScan(root, devices, exclude, stall, end, readers) as scan:
        return scan.result()


def _from_holder(h: Holder, vmid: int) -> Proc:
    return Proc(h.host_pid, full_name(h.name, h.cmdline), "ct", vmid, h.ct_pid, h.unit, h.cgroup,
                list(h.devices))


def _minors(p: Proc, devices: GpuDevices) -> set[int]:
    found = set()
    for d in p.devices:
        m = _RDEV.search(d)
        if not m:
            continue
        major, minor = int(m.group(1)), int(m.group(2))
        path = devices.rdevs.get(os.makedev(major, minor))
        n = _NODE.fullmatch(os.path.basename(path)) if path else None
        if n:
            found.add(int(n.group(1)))
        elif path is None and major == 195 and minor < 254:  # /dev/nvidiaN on any host
            found.add(minor)
    return found


# ---- VMs: GPUs bound to vfio-pci ----------------------------------------------------------
def _pci_ids(text: str) -> list[tuple[str, bool]]:
    """(address prefix, whole device) for each id of a hostpci `host` value: `01:00` means
    every function of 0000:01:00 (qemu-server's PCIRE)."""
    out = []
    for part in text.lower().split(";"):
        m = _PCI.fullmatch(part.strip())
        if not m:
            continue
        dom = m.group(1) or "0000"
        addr = f"{dom[-4:]}:{m.group(2)}"
        out.append((f"{addr}.{m.group(3)}", False) if m.group(3) else (addr + ".", True))
    return out


def read_pci_mappings(path: Path, node: str) -> dict[str, list[str]]:
    """Resource mappings (/etc/pve/mapping/pci.cfg): name -> this node's PCI paths."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line and not line[0].isspace():
            name = line.strip()
            continue
        words = line.split(None, 1)
        if name and len(words) == 2 and words[0] == "map":
            props = dict(kv.split("=", 1) for kv in words[1].split(",") if "=" in kv)
            if props.get("node", node) == node and props.get("path"):
                out.setdefault(name, []).append(props["path"])
    return out


def vm_passthrough(qemu_dir: Path, mappings: dict[str, list[str]]
                   ) -> list[tuple[int, str, str, bool]]:
    """(vmid, VM name, address prefix, whole device) for every hostpci line of every VM."""
    out: list[tuple[int, str, str, bool]] = []
    try:
        files = sorted(p for p in qemu_dir.glob("*.conf") if p.stem.isdigit())
    except OSError:
        return out
    for path in files:
        try:
            conf = pveconf.parse_config(path.read_text(encoding="utf-8", errors="replace"),
                                        int(path.stem))
        except OSError:
            continue
        name = conf.get("name") or ""
        for k, v in conf.lines:
            if not re.fullmatch(r"hostpci\d+", k):
                continue
            opts = v.split(",")
            host = next((o for o in opts if "=" not in o), None)
            kv = dict(o.split("=", 1) for o in opts if "=" in o)
            hosts = [host or kv.get("host", "")]
            if "mapping" in kv:
                hosts += mappings.get(kv["mapping"], [])
            for h in hosts:
                for prefix, whole in _pci_ids(h):
                    out.append((conf.vmid, name, prefix, whole))
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def vfio_gpus(pci_root: Path, qemu_dir: Path, mapping_file: Path) -> list[dict[str, Any]]:
    """NVIDIA display devices not driven by the nvidia driver: bound to vfio-pci (passed to
    a VM), another driver, or none. NVML does not see them."""
    out: list[dict[str, Any]] = []
    try:
        devs = sorted(pci_root.iterdir())
    except OSError:
        return out
    refs = None
    for d in devs:
        if _read(d / "vendor") != NVIDIA_VENDOR or not _read(d / "class").startswith("0x03"):
            continue
        try:
            driver: str | None = os.path.basename(os.readlink(d / "driver"))
        except OSError:
            driver = None
        if driver == "nvidia":
            continue
        if refs is None:
            refs = vm_passthrough(qemu_dir, read_pci_mappings(mapping_file, os.uname().nodename))
        addr = d.name.lower()
        vms = sorted({(vmid, name) for vmid, name, prefix, whole in refs
                      if (addr.startswith(prefix) if whole else addr == prefix)})
        out.append({"pci_bus_id": addr, "device": f"10de:{_read(d / 'device')[2:]}",
                    "driver": driver, "vms": [{"vmid": v, "name": n} for v, n in vms]})
    return out


# ---- the command ---------------------------------------------------------------------------
READERS_SHARE = 0.8  # of the deadline: the host's forked readers are given up on by then


def show(cfg: Config, as_json: bool = False, watch: float | None = None, count: int = 0,
         pci_root: Path = PCI_DEVICES) -> int:
    """`pveclean gpus`: read the host in a worker bounded by deadline_seconds, print, and
    with `watch` do it again every `watch` seconds (`count` times; 0: until Ctrl-C).
    Exit code 0, or PvecleanError (exit 3) when the host could not be read in time."""
    import sys

    from .worker import RemoteError, Worker, WorkerError

    tty = sys.stdout.isatty()
    shown = 0
    limit = cfg.deadline_seconds
    with Worker(**Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)) as wk:
        try:
            while True:
                # its forked readers are given up on first, so that the rest is still shown
                end = time.monotonic() + limit * READERS_SHARE
                data = wk.call(w_collect, cfg, pci_root, end, timeout=limit, what="gpus")
                if as_json:
                    import json

                    text = json.dumps(data, indent=2, default=str)
                else:
                    text = render(data)
                if watch and tty and not as_json:
                    text = "\x1b[H\x1b[2J" + text  # redraw in place
                print(text, flush=True)
                shown += 1
                if not watch or (count and shown >= count):
                    break
                if not tty or as_json:
                    print(flush=True)
                time.sleep(watch)
        except KeyboardInterrupt:
            pass
        except WorkerError as exc:
            raise PvecleanError(f"gpus: reading the host did not finish within {limit:.0f} s "
                                f"({str(exc).removeprefix('gpus: ')}); nothing shown",
                                EXIT_ACCESS) from None
        except RemoteError as exc:
            raise PvecleanError(f"gpus: {exc}", EXIT_ACCESS) from None
    return EXIT_OK


# ---- one look at the host -----------------------------------------------------------------
def w_collect(cfg: Config, pci_root: Path, end: float | None = None) -> dict[str, Any]:
    """collect() in a worker (`pveclean gpus`): what can hang there (a pmxcfs that stopped
    answering, /proc/PID/maps of a process wedged in the GPU driver, NVML) hangs the worker,
    which the command gives up on at its deadline, not the command. The NVML session lives
    in the worker's state across --watch refreshes."""
    from . import worker

    return collect(cfg, Nvml.in_worker(worker.state()), pci_root,
                   exclude={os.getpid(), os.getppid()}, end=end)


def collect(cfg: Config, nvml: Nvml | None, pci_root: Path = PCI_DEVICES,
            exclude: set[int] | None = None, end: float | None = None) -> dict[str, Any]:
    """Every GPU, every holder, every owner, as one plain dict (what --json prints).
    `exclude`: pveclean's own processes (default: this one), left out of the host's; `end`
    (monotonic): when the host's forked readers are given up on."""
    t0 = time.monotonic()
    root = Path(cfg.cgroup_root or procfs.cgroup2_root())
    devices = procfs.gpu_devices(cfg.devices)
    warnings: list[str] = []
    host_scan: HostScan | None = None
    try:
        # the host's readers go first: they read while the containers and NVML are asked
        host_scan = HostScan(root, devices, exclude or {os.getpid()}, stall_for(cfg), end)
    except Exception as exc:
        warnings.append(f"the host's cgroups could not be read ({type(exc).__name__}); host "
                        "holders are shown only as NVML lists them")
    ct_reader = Reader(end, stall_for(cfg), warnings)  # the containers', one after another
    try:
        return _collect(cfg, nvml, pci_root, root, devices, host_scan, ct_reader, warnings, t0)
    finally:
        ct_reader.close()
        if host_scan is not None:
            host_scan.close()


def _collect(cfg: Config, nvml: Nvml | None, pci_root: Path, root: Path, devices: GpuDevices,
             host_scan: HostScan | None, ct_reader: Reader, warnings: list[str], t0: float
             ) -> dict[str, Any]:
    majors = procfs.nvidia_majors()
    pve = Path(cfg.pve_config_dir).parent
    procs: dict[int, Proc] = {}
    hostnames: dict[int, str] = {}
    scanned, skipped = [], []
    try:
        ct_dirs = sorted(e.name for e in os.scandir(root / "lxc") if e.is_dir())
    except OSError:
        ct_dirs = []
    for name in ct_dirs:
        if not name.isdigit():
            continue
        vmid = int(name)
        try:
            conf: pveconf.CtConfig | None = pveconf.read_config(cfg.pve_config_dir, vmid)
        except PvecleanError:
            conf = None  # a cgroup without a config here: cannot tell, so look
        if conf is not None:
            hostnames[vmid] = conf.get("hostname") or ""
            if not may_use_gpus(conf, majors):
                skipped.append(vmid)
                continue
        scanned.append(vmid)
        scope = Scope(vmid, root / "lxc" / name, devices, frozenset(),
                      running=procfs.monitor_running(str(root), vmid))
        view = ct_reader.call(w_scan, (scope,), f"reading CT {vmid}")
        if view is None:  # a tree the container made unreadable, or a read past the deadline
            warnings.append(f"CT {vmid}: its cgroup tree could not be read; its holders are "
                            "shown only as NVML lists them")
            continue
        for h in view.holders.values():
            procs[h.host_pid] = _from_holder(h, vmid)
    nvml_state = "ok"
    gpus: list[GpuMemory] = []
    used: dict[int, dict[int, int | None]] = {}
    buses: dict[int, str] = {}
    if nvml is None:
        nvml_state = "disabled"
    else:
        try:
            gpus = nvml.memory()
            used = nvml.processes()
            buses = nvml.pci_bus_ids()
        except NvmlUnavailable as exc:
            nvml_state = f"unavailable: {exc}"
            warnings.append(f"NVML unavailable ({exc}): holders from device nodes only, "
                            "no memory")
    host: list[Proc] = []
    n_host = 0
    if host_scan is not None:
        try:
            host, n_host, unread = host_scan.result()
            warnings += unread
        except Exception as exc:
            warnings.append(f"the host's cgroups could not be read ({type(exc).__name__}); "
                            "host holders are shown only as NVML lists them")
    procs.update((p.host_pid, p) for p in host)
    for pid, per_gpu in used.items():
        p = procs.get(pid) or _attribute(pid)
        p.memory.update(per_gpu)
        procs[pid] = p
    for p in procs.values():
        p.minors = _minors(p, devices)
    qemu_dir = pve / "qemu-server"
    vfio = vfio_gpus(pci_root, qemu_dir, pve / "mapping" / "pci.cfg")
    for p in procs.values():
        if p.vmid is not None and p.vmid not in hostnames:
            hostnames[p.vmid] = ""
    data = {
        "pveclean_gpus": 1,
        "host": os.uname().nodename,
        "time": report.iso(time.time()),
        "gpus": [_gpu_entry(g, buses.get(g.index), procs.values()) for g in gpus],
        "other_holders": [p.as_dict() for p in sorted(procs.values(), key=_order)
                          if not _gpu_indices(p, gpus)],
        "vfio": vfio,
        "containers": {str(v): {"hostname": hostnames.get(v, "")} for v in sorted(hostnames)},
        "scan": {"containers_scanned": scanned, "containers_skipped_no_gpu": skipped,
                 "host_processes": n_host, "host_holders": len(host),
                 "seconds": round(time.monotonic() - t0, 3)},
        "sources": {"host": "ok", "nvml": nvml_state},
        "warnings": warnings,
    }
    return data


def _attribute(pid: int) -> Proc:
    """An NVML process neither scan saw: owner from its cgroup (it may have just started,
    or it runs in a container whose config names no GPU)."""
    cg = procfs.pid_cgroup(pid)
    st = procfs.read_status(pid)
    name = st.name if st else "?"
    if cg is None:
        return Proc(pid, name, "unknown")
    parts = cg.split("/")
    if len(parts) > 2 and parts[1] == "lxc" and parts[2].isdigit():
        ct_pid = st.nspid[1] if st and len(st.nspid) > 1 else None
        return Proc(pid, name, "ct", int(parts[2]), ct_pid, unit_of(cg), cg)
    return Proc(pid, name, "host", cgroup=cg, unit=unit_of(cg))


def _gpu_indices(p: Proc, gpus: list[GpuMemory]) -> set[int]:
    return {g.index for g in gpus if g.index in p.memory or
            (g.minor is not None and g.minor in p.minors)}


def _order(p: Proc) -> tuple[int, int, int]:
    return (0 if p.owner == "ct" else 1, p.vmid or 0, p.host_pid)


def _mem_key(row: dict[str, Any]) -> tuple[int, int]:
    mib = row["memory_mib"]
    return (-(mib if mib is not None else -1), row["host_pid"])


def _gpu_entry(g: GpuMemory, bus: str | None, procs: Any) -> dict[str, Any]:
    rows = []
    accounted, unknown = 0, False
    for p in procs:
        on = g.index in p.memory or (g.minor is not None and g.minor in p.minors)
        if not on:
            continue
        mib = p.memory.get(g.index)
        if g.index in p.memory:
            if mib is None:
                unknown = True
            else:
                accounted += mib
        rows.append({**p.as_dict(), "memory_mib": mib})
    rows.sort(key=_mem_key)
    owners: dict[str, int] = {}
    for r in rows:
        key = owner_label(r)
        owners[key] = owners.get(key, 0) + (r["memory_mib"] or 0)
    unaccounted = None
    if g.reserved_mib is not None and not unknown:
        unaccounted = max(g.used_mib - accounted, 0)
    leak = unaccounted if unaccounted is not None and unaccounted > LEAK_SLACK_MIB else 0
    return {"index": g.index, "name": g.name, "uuid": g.uuid, "pci_bus_id": bus,
            "minor": g.minor, "total_mib": g.total_mib, "used_mib": g.used_mib,
            "reserved_mib": g.reserved_mib, "processes": rows,
            "by_owner_mib": dict(sorted(owners.items(), key=lambda kv: -kv[1])),
            "unaccounted_mib": unaccounted, "leak_mib": leak}


def owner_label(p: dict[str, Any]) -> str:
    if p["owner"] == "ct":
        return f"CT {p['vmid']}"
    return "host" if p["owner"] == "host" else "unknown"


# ---- the terminal view --------------------------------------------------------------------
def _n(mib: int | None) -> str:
    return "-" if mib is None else f"{mib:,}"


def _table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]


def _owner(p: dict[str, Any], hostnames: dict[str, Any]) -> str:
    label = owner_label(p)
    if p["owner"] == "ct":
        hn = (hostnames.get(str(p["vmid"])) or {}).get("hostname")
        return f"{label} {safe(hn, 20)}" if hn else label
    return label


def render(data: dict[str, Any]) -> str:
    hostnames = data.get("containers", {})
    n_gpus = len(data["gpus"])
    lines = [f"GPUs of {safe(data['host'], 40)} at {data['time'][:19].replace('T', ' ')} UTC: "
             f"{n_gpus} GPU(s) on the nvidia driver, {len(data['vfio'])} other"]
    for g in data["gpus"]:
        res = f", {_n(g['reserved_mib'])} reserved" if g["reserved_mib"] is not None else ""
        lines += ["", f"GPU {g['index']}  {safe(g['name'], 40)}  {g['pci_bus_id'] or '?'}  "
                      f"{safe(g['uuid'], 48)}",
                  f"  memory: {_n(g['used_mib'])} of {_n(g['total_mib'])} MiB used{res}"]
        rows: list[tuple[str, ...]] = [("OWNER", "MiB", "HOST PID", "CT PID", "NAME", "UNIT")]
        for p in g["processes"]:
            rows.append((_owner(p, hostnames), _n(p["memory_mib"]), str(p["host_pid"]),
                         str(p["ct_pid"] or "-"), safe(p["name"], 20),
                         safe(p["unit"] or "-", 40)))
        if g["leak_mib"]:
            rows.append(("LEAK: no process", _n(g["leak_mib"]), "-", "-", "-", "-"))
        if len(rows) > 1:
            lines += _table(rows, {1})
        else:
            lines.append("  no process holds this GPU")
        share = [f"{safe(k, 30)} " + (f"{_n(v)} MiB" if v else "nodes only")
                 for k, v in g["by_owner_mib"].items()]
        if g["leak_mib"]:
            share.append(f"leak {_n(g['leak_mib'])} MiB (reset with nvidia-smi -r -i "
                         f"{g['index']} once nothing uses it)")
        elif g["unaccounted_mib"] is None and g["processes"]:
            share.append("unaccounted memory unknown (NVML gives no per-process figure)")
        if share:
            lines.append("  by owner: " + ", ".join(share))
    if data["other_holders"]:
        lines += ["", "Holding GPU nodes but no single GPU (nvidiactl, nvidia-uvm...):"]
        rows = [("OWNER", "HOST PID", "CT PID", "NAME", "UNIT", "DEVICES")]
        for p in data["other_holders"]:
            devs = ",".join(d.split(" ")[0] for d in p["devices"]) or "-"
            rows.append((_owner(p, hostnames), str(p["host_pid"]), str(p["ct_pid"] or "-"),
                         safe(p["name"], 20), safe(p["unit"] or "-", 40), safe(devs, 40)))
        lines += _table(rows, set())
    if data["vfio"]:
        lines += ["", "NVIDIA GPUs not on the nvidia driver (NVML does not see them):"]
        for v in data["vfio"]:
            vms = ", ".join(f"VM {m['vmid']}" + (f" ({safe(m['name'], 30)})" if m["name"] else "")
                            for m in v["vms"])
            if v["driver"] == "vfio-pci":
                who = f"passed to {vms}" if vms else "bound to vfio-pci, named in no VM config"
            else:
                who = f"driver {safe(v['driver'], 20)}" if v["driver"] else "no driver bound"
            lines.append(f"  {v['pci_bus_id']}  NVIDIA {v['device']}  {who}")
    s = data["scan"]
    lines += ["", f"scanned {len(s['containers_scanned'])} container(s) with GPU access "
                  f"(skipped {len(s['containers_skipped_no_gpu'])} without) and the host's "
                  f"processes in {s['seconds'] * 1000:.0f} ms; NVML: {data['sources']['nvml']}"]
    lines += [f"warning: {safe(w, 300)}" for w in data["warnings"]]
    return "\n".join(lines)
