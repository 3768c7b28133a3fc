"""`pveclean metrics`: `pveclean gpus`' map of this node written as node_exporter textfile
metrics (core/metrics_gpus.py), for Prometheus and Grafana across a cluster. Run by
pveclean-metrics.timer (shipped off; `systemctl enable --now pveclean-metrics.timer`).

One look at the host, bounded as `pveclean gpus` is by deadline_seconds (everything that can
hang, pmxcfs and NVML included, is read in a forked worker). A look that does not finish
replaces the map with `pveclean_gpus_up 0` (an old map would be shown as current) and keeps
when the map was last read whole, for the staleness alert.

Every 30 s on a host with thousands of processes, reading each one's fds and mappings would
cost more than the 1 % of a core a monitor may take. So a host process that held no GPU node
is read again only every ROLL-th run, at a phase of its own (`(run + pid) % ROLL`: a tenth of
them each run), and at once when it is new; every GPU memory holder is seen each run through
NVML, and the containers' processes are read each run. A host process that opens a GPU node
without allocating memory shows within ROLL runs (5 min at 30 s). The runs' record is
<state_dir>/metrics-host.json; without it every process is read. `make bench` measures it."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pveclean.commands import xids
from pveclean.commands.doctor import write_metrics as write_doctor
from pveclean.commands.gpulook import Seen, collect, nvml_session
from pveclean.commands.gpus import READERS_SHARE
from pveclean.core import metrics, metrics_gpus, metrics_xid
from pveclean.core.config import Config
from pveclean.core.gpumap import GpuMap
from pveclean.core.pci import HostPci
from pveclean.errors import ExitCode, PvecleanError, guarded, need_root
from pveclean.host import cgroupfs, notify, worker
from pveclean.host.nvml import Nvml
from pveclean.host.wholefile import replace_whole
from pveclean.host.worker import RemoteError, Worker, WorkerError
from pveclean.proxmox.passthrough import PCI_DEVICES, read_pci_mappings, this_node, vm_passthrough

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # Debian's prometheus-node-exporter
FILE_NAME = "pveclean_gpus.prom"
ROLL = 10  # runs between two reads of a host process that held no GPU node
SETTLED_FILE = "metrics-host.json"


def load_settled(cfg: Config) -> tuple[int, dict[int, int]]:
    """(this run's number, host PID -> the run it is due again) from the state dir; a missing
    or unreadable record starts afresh (every process read)."""
    try:
        raw = json.loads((Path(cfg.state_dir) / SETTLED_FILE).read_text(encoding="utf-8"))
        due = {int(p): int(r) for p, r in raw["due"].items()}
        return int(raw["run"]) + 1, due
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0, {}


def save_settled(cfg: Config, run: int, due: dict[int, int], clean: list[int],
                 alive: set[int]) -> None:
    """The PIDs read clean this run get their next due run; PIDs gone are dropped."""
    kept = {p: r for p, r in due.items() if p in alive and r > run}
    kept.update({p: run + ROLL - (run + p) % ROLL for p in clean})
    text = json.dumps({"run": run, "due": {str(p): r for p, r in sorted(kept.items())}})
    with contextlib.suppress(OSError):  # a record not kept: the next run reads everything
        replace_whole(Path(cfg.state_dir) / SETTLED_FILE, text, ".metrics-host-")


@dataclass(frozen=True)
class Look:
    """One look for the metrics: the map, whether each container runs, every VM's hostpci
    lines' ids, and what the host's scan read (Seen)."""

    gmap: GpuMap
    running: dict[int, bool]
    refs: list[HostPci]
    seen: Seen


def w_look(cfg: Config, pci_root: Path, end: float, settled: frozenset[int] = frozenset()
           ) -> Look:
    """In the worker: the map, whether each container runs, and every VM's hostpci lines
    (pmxcfs: can hang, so here and not in the command); `settled`: host PIDs not read now."""
    seen = Seen()
    gmap = collect(cfg, nvml_session(worker.state()), pci_root,
                   exclude={os.getpid(), os.getppid()}, end=end, settled=settled, seen=seen)
    root = cfg.cgroup_root or str(cgroupfs.cgroup2_root())
    running = {v: cgroupfs.monitor_running(root, v) for v in sorted(gmap.hostnames)}
    pve = Path(cfg.pve_config_dir).parent
    refs = vm_passthrough(pve / "qemu-server",
                          read_pci_mappings(pve / "mapping" / "pci.cfg", this_node()))
    return Look(gmap, running, refs, seen)


def write_job_map(job_dir: str, jobs: dict[str, list[str]]) -> None:
    """One file per GPU index naming the guests that hold it (core/metrics_gpus.job_map),
    each replaced atomically; the files of GPUs no guest holds now are removed. Only names
    that are GPU indices are touched: the directory may hold other writers' files."""
    d = Path(job_dir)
    d.mkdir(mode=0o755, parents=True, exist_ok=True)
    for entry in os.scandir(d):
        if entry.name.isdigit() and entry.name not in jobs and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
    for index, ids in jobs.items():
        replace_whole(d / index, "".join(f"{i}\n" for i in ids), ".pveclean-", 0o644)


def write(cfg: Config, textfile_dir: str = TEXTFILE_DIR, pci_root: Path = PCI_DEVICES,
          job_dir: str | None = None) -> int:
    """Look once and write `<textfile_dir>/pveclean_gpus.prom` (and, with `job_dir`,
    dcgm-exporter's job mapping files). Exit code 0; or PvecleanError: 3 when the host could
    not be read in time (the file then says pveclean_gpus_up 0), 4 when a file could not be
    written. One worker, one NVML session: the look's, then doctor's (write_doctor)."""
    with Worker(**Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)) as wk:
        return _write(cfg, wk, textfile_dir, pci_root, job_dir)


def _write(cfg: Config, wk: Worker, textfile_dir: str, pci_root: Path, job_dir: str | None
           ) -> int:
    node = os.uname().nodename
    limit = cfg.deadline_seconds
    t0 = time.monotonic()
    look: Look | None = None
    why = ""
    run, due = load_settled(cfg)
    settled = frozenset(p for p, r in due.items() if r > run)
    try:
        look = wk.call(w_look, cfg, pci_root, time.monotonic() + limit * READERS_SHARE,
                       settled, timeout=limit, what="gpus")
    except WorkerError as exc:
        why = f"reading the host did not finish within {limit:.0f} s ({exc})"
    except RemoteError as exc:
        why = str(exc)
    seconds = time.monotonic() - t0
    now = time.time()
    if look is not None:
        save_settled(cfg, run, due, look.seen.clean, look.seen.alive)
    xlog = xids.xid_pass(cfg, look.gmap if look is not None else None)[0]

    def text(old: str) -> str:
        xfams = metrics_xid.families(xlog, look.gmap.gpus if look is not None else (), node)
        if look is None:
            last = metrics_gpus.last_success(metrics.parse(old))
            return metrics.render(metrics_gpus.failed(node, seconds, last) + xfams)
        return metrics.render(metrics_gpus.families(look.gmap, node, look.running,
                                                    look.refs, now) + xfams)

    path = Path(textfile_dir) / FILE_NAME
    try:
        notify.update_textfile(str(path), text)
    except OSError as exc:
        raise PvecleanError(f"metrics: {path} not written: {exc.strerror or exc}",
                            ExitCode.REPORT) from None
    doctor_not_written = write_doctor(cfg, textfile_dir, wk)  # pveclean_doctor.prom beside it
    if look is None:
        raise PvecleanError(f"metrics: {why}; {path} says pveclean_gpus_up 0",
                            ExitCode.ACCESS)
    if job_dir:
        try:
            write_job_map(job_dir, metrics_gpus.job_map(look.gmap))
        except OSError as exc:
            raise PvecleanError(f"metrics: job mapping files in {job_dir} not written: "
                                f"{exc.strerror or exc}", ExitCode.REPORT) from None
    if doctor_not_written:
        raise PvecleanError(f"metrics: {doctor_not_written}", ExitCode.REPORT)
    return ExitCode.OK


def from_timer(textfile_dir: str) -> int:
    """`pveclean metrics --textfile-dir DIR` as pveclean-metrics.service runs it, without
    typer (__main__.timer_argv): the typer command's root check, config, exit codes and
    one-line errors (errors.guarded), without importing typer and click and building the
    app every 30 s (about 30 ms of CPU a run on a 2-core VM, issue 42)."""
    from pveclean.host.configfile import load

    def go() -> int:
        need_root()
        return write(load(), textfile_dir)

    return guarded(go)
