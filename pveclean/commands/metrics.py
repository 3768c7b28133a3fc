"""`pveclean metrics`: `pveclean gpus`' map of this node written as node_exporter textfile
metrics (core/metrics_gpus.py), for Prometheus and Grafana across a cluster. Run by
pveclean-metrics.timer (shipped off; `systemctl enable --now pveclean-metrics.timer`).

One look at the host, bounded as `pveclean gpus` is by deadline_seconds (everything that can
hang, pmxcfs and NVML included, is read in a forked worker). A look that does not finish
replaces the map with `pveclean_gpus_up 0` (an old map would be shown as current) and keeps
when the map was last read whole, for the staleness alert."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from pveclean.commands.gpus import READERS_SHARE, w_collect
from pveclean.core import metrics, metrics_gpus
from pveclean.core.config import Config
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import cgroupfs, notify
from pveclean.host.nvml import Nvml
from pveclean.host.reportfiles import exclusive_temp
from pveclean.host.worker import RemoteError, Worker, WorkerError
from pveclean.proxmox.passthrough import PCI_DEVICES, read_pci_mappings, vm_passthrough

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # Debian's prometheus-node-exporter
FILE_NAME = "pveclean_gpus.prom"


def w_look(cfg: Config, pci_root: Path, end: float) -> dict[str, Any]:
    """In the worker: the map, whether each container runs, and every VM's hostpci lines
    (pmxcfs: can hang, so here and not in the command)."""
    data = w_collect(cfg, pci_root, end)
    root = cfg.cgroup_root or str(cgroupfs.cgroup2_root())
    running = {int(v): cgroupfs.monitor_running(root, int(v)) for v in data["containers"]}
    pve = Path(cfg.pve_config_dir).parent
    refs = vm_passthrough(pve / "qemu-server",
                          read_pci_mappings(pve / "mapping" / "pci.cfg", os.uname().nodename))
    return {"data": data, "running": running,
            "refs": [(vmid, prefix, whole) for vmid, _name, prefix, whole in refs]}


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
        fd, tmp = exclusive_temp(d, ".pveclean-", ".tmp", 0o644)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write("".join(f"{i}\n" for i in ids))
            os.replace(tmp, d / index)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def write(cfg: Config, textfile_dir: str = TEXTFILE_DIR, pci_root: Path = PCI_DEVICES,
          job_dir: str | None = None) -> int:
    """Look once and write `<textfile_dir>/pveclean_gpus.prom` (and, with `job_dir`,
    dcgm-exporter's job mapping files). Exit code 0; or PvecleanError: 3 when the host could
    not be read in time (the file then says pveclean_gpus_up 0), 4 when a file could not be
    written."""
    node = os.uname().nodename
    limit = cfg.deadline_seconds
    t0 = time.monotonic()
    look: dict[str, Any] | None = None
    why = ""
    with Worker(**Nvml.settings(cfg.nvml_library, limit)) as wk:
        try:
            look = wk.call(w_look, cfg, pci_root, time.monotonic() + limit * READERS_SHARE,
                           timeout=limit, what="gpus")
        except WorkerError as exc:
            why = f"reading the host did not finish within {limit:.0f} s ({exc})"
        except RemoteError as exc:
            why = str(exc)
    seconds = time.monotonic() - t0
    now = time.time()

    def text(old: str) -> str:
        if look is None:
            last = metrics_gpus.last_success(metrics.parse(old))
            return metrics.render(metrics_gpus.failed(node, seconds, last))
        return metrics.render(metrics_gpus.families(look["data"], node, look["running"],
                                                    look["refs"], now))

    path = Path(textfile_dir) / FILE_NAME
    try:
        notify.update_textfile(str(path), text)
    except OSError as exc:
        raise PvecleanError(f"metrics: {path} not written: {exc.strerror or exc}",
                            ExitCode.REPORT) from None
    if look is None:
        raise PvecleanError(f"metrics: {why}; {path} says pveclean_gpus_up 0",
                            ExitCode.ACCESS)
    if job_dir:
        try:
            write_job_map(job_dir, metrics_gpus.job_map(look["data"]))
        except OSError as exc:
            raise PvecleanError(f"metrics: job mapping files in {job_dir} not written: "
                                f"{exc.strerror or exc}", ExitCode.REPORT) from None
    return ExitCode.OK
