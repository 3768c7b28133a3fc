"""The host's own GPU holders for `pveclean gpus`: every process outside the containers'
cgroups, read by forked readers that share the work (see HostScan)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from pveclean.core.bounds import cap_devices, cut, cut_device
from pveclean.core.gpumap import GpuProc, full_name
from pveclean.core.owners import HOST, Layout, OwnerKind, is_ct_dir, owner_of
from pveclean.core.records import GpuDevices
from pveclean.core.units import unit_of
from pveclean.host import cgroupfs, devnodes, procfs, worker
from pveclean.host.procscan import judge_each
from pveclean.host.reads import Reader, Unread
from pveclean.host.worker import Worker


def host_pids(root: Path) -> dict[int, str]:
    """PIDs outside the Proxmox containers' cgroups (`lxc/<vmid>`) -> their cgroup path: the
    host's own, and those of cgroups below `lxc/` that are no VMID (plain LXC containers)."""
    found: dict[int, str] = {}

    def add(directory: Path, prefix: str) -> None:
        for pid, rel in cgroupfs.tree_pids(directory).items():
            found[pid] = prefix if rel == "." else f"{prefix}/{rel}"

    for d, prefix in ((root, ""), (root / Layout.PVE, f"/{Layout.PVE}")):
        try:
            with open(d / "cgroup.procs", encoding="ascii") as fh:
                found.update((int(ln), prefix or "/") for ln in fh if ln.strip().isdigit())
            entries = [e for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for e in entries:
            if (d == root and e.name == Layout.PVE) or (d != root and is_ct_dir(e.name)):
                continue
            add(Path(e.path), f"{prefix}/{e.name}")
    return found


def _announce(pid: int) -> devnodes.Progress:
    """A mark, not a note: there are thousands; the reader's receive() bounds each."""
    worker.mark(pid)
    return partial(worker.mark, pid)


def w_host_share(pids: list[tuple[int, str]], devices: GpuDevices,
                 skip: frozenset[int], stall: float | None
                 ) -> tuple[list[GpuProc], list[str], list[int]]:
    """In a reader: the GPU holders among `pids` (host PID, cgroup), judged as a container's
    processes are (devnodes.judge), one line per process that could not be judged whole,
    and the PIDs judged whole to hold nothing. Each PID is marked before its /proc files are
    read, so a read that hangs is pinned to its PID (a mark, not a note: there are
    thousands; the reader's receive() bounds each by `stall`)."""
    out = []
    unjudged: list[str] = []
    clean: list[int] = []
    cgroups = dict(pids)
    for pid, got in judge_each(cgroups, devices, skip, _announce, tenant=False):
        if got.unjudged:
            unjudged.append(f"host PID {pid}: {'; '.join(got.unjudged[:3])}")
        if not got.held:
            if not got.unjudged:
                clean.append(pid)
            continue
        st = procfs.read_status(pid)
        if st is None or st.state == "Z":
            continue
        cgroup = cgroups[pid]
        # its strings cut where read, as a container's holders' (bounds: the report's caps)
        kept, more = cap_devices(got.held)
        out.append(GpuProc(pid, cut(full_name(st.name, procfs.argv(pid))), HOST,
                           cgroup=cut(cgroup), unit=unit_of(cgroup),
                           devices=tuple(cut_device(d) for d in kept),
                           rdevs=frozenset(got.rdevs), devices_more=more))
    return out, unjudged, clean


READER_PROCESSES = 50  # host processes per forked reader beyond the first (see HostScan)
MAX_READERS = 8


class HostScan:
    """The host's own GPU holders (fds and mappings of GPU nodes, matched on the device
    number as scan_host does): how many processes were looked at, and what could not be.

    The host's processes are split between forked Readers, one per 50 and at most one per
    core (and 8): a reader costs 1-2 ms to fork and answer and a real host process 0.2-2 ms
    to read, so two cores halve a host of 100 (issue 42, 2 cores: gpus at ~110 host
    processes 254 vs 308 ms with one reader). The reads are short system calls into /proc,
    and threads made them slower (each call hands the GIL over: 2 threads took 1.5-2x and 4
    threads 2.5x the time of one, on 2 cores), where two processes took half. The readers
    start at once and read while the caller does the rest (the containers, NVML); result()
    takes their answers. A PID whose reads hang is skipped and named; a reader that does
    not finish by `end` (monotonic) is given up on and its share named.

    `settled`: host PIDs not read this time (`pveclean metrics` reads a host process that held
    nothing again only every few runs, see commands/metrics.py); `clean` after result(): the
    PIDs read whole this time that hold nothing; `alive`: every host PID listed."""

    def __init__(self, root: Path, devices: GpuDevices, exclude: set[int], stall: float,
                 end: float | None = None, readers: int | None = None,
                 settled: frozenset[int] = frozenset()) -> None:
        every = [(p, cg) for p, cg in host_pids(root).items() if p not in exclude]
        self.count = len(every)
        self.alive = {p for p, _cg in every}
        pids = [(p, cg) for p, cg in every if p not in settled]
        self.settled = self.count - len(pids)
        self.clean: list[int] = []
        n = readers or min(os.cpu_count() or 1, MAX_READERS,
                           max(1, len(pids) // READER_PROCESSES))
        self.shares = [pids[i::n] for i in range(n)]
        self.problems: list[str] = []
        self.readers: list[Reader] = []
        try:
            for share in self.shares:
                reader = Reader(Worker(marks=True), stall, self.problems, "not looked at")
                self.readers.append(reader)
                reader.send(w_host_share, share, devices, end=end,
                            what="reading the host's processes")
        except BaseException:
            self.close()
            raise

    def result(self) -> tuple[list[GpuProc], int, list[str]]:
        found: list[GpuProc] = []
        for reader, share in zip(self.readers, self.shares, strict=True):
            try:
                procs, unjudged, clean = reader.receive()
                found += procs
                self.clean += clean
                self.problems += unjudged[:20]
            except Unread as unread:
                self.problems.append(str(unread))
                self.problems.append(f"{len(share)} of the host's processes were not looked "
                                     "at; their holders are shown only as NVML lists them")
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
                        stall: float = 1.0) -> tuple[list[GpuProc], int, list[str]]:
    """HostScan(...).result(): the host's holders, processes looked at, what was not."""
    with HostScan(root, devices, exclude, stall, end, readers) as scan:
        return scan.result()


def attribute_pid(pid: int) -> GpuProc:
    """An NVML process neither scan saw: owner from its cgroup (it may have just started,
    or it runs in a container whose config names no GPU)."""
    cg = cgroupfs.pid_cgroup(pid)
    st = procfs.read_status(pid)
    name = st.name if st else "?"
    owner = owner_of(cg)
    if cg is None:
        return GpuProc(pid, name, owner)
    ct_pid = st.nspid[1] if owner.kind is OwnerKind.CT and st and len(st.nspid) > 1 else None
    return GpuProc(pid, name, owner, ct_pid, unit_of(cg), cg)
