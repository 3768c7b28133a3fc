"""`pveclean metrics` as pveclean-metrics.timer runs it (every 30 s): CPU time per run on a
host with thousands of idle processes, beside a GPU container with holders and a host daemon,
against the target of 1 % of one core at that interval."""

from __future__ import annotations

import resource
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .discovery import host_process_count, pveclean_exe
from .gpus import seed_lab
from .load import HostLoad
from .measure import VmidPool, median, new_lab, quartiles, shielded, timed
from .settings import BenchConfig
from .table import Row, Table, ms

INTERVAL_S = 30.0  # pveclean-metrics.timer's OnUnitActiveSec
TARGET = 0.01  # of one core


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and every worker it reaped
    return ru.ru_utime + ru.ru_stime


def _measure(argv: list[str], env: dict[str, str], runs: int) -> tuple[list[float],
                                                                    list[float]]:
    cpu: list[float] = []
    wall: list[float] = []
    timed(argv, env)  # warm-up
    for _ in range(runs):
        c0 = _cpu()
        t = timed(argv, env)
        cpu.append(_cpu() - c0)
        wall.append(t.seconds)
        if t.returncode != 0:
            raise RuntimeError(f"pveclean metrics failed: {t.stderr.strip()}")
    return cpu, wall


def bench_metrics(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
                  ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    """The load first in the host's own cgroups (every process read, as fuser reads them),
    then in a container without GPU passthrough (where a Proxmox host's processes live:
    its devices cgroup keeps them off the GPU nodes, so they are not read)."""
    n = cfg.metrics_load
    lab = new_lab()
    load = HostLoad(cfg.fds)
    levels: list[dict[str, Any]] = []
    try:
        _ct, quiet = seed_lab(lab, pool, cfg)
        load.grow_to(n)
        with tempfile.TemporaryDirectory(prefix="pveclean-bench-textfile-") as d:
            argv = [*pveclean_exe(), "metrics", "--textfile-dir", d]
            for where in ("the host's own cgroups", "a container without GPU passthrough"):
                if where.startswith("a container"):
                    load.move_to(lab.cgroup(quiet) / "ns" / "load")
                procs = host_process_count()
                log(f"metrics: {procs} host processes, {n} load processes in {where}")
                cpu, wall = _measure(argv, lab.env(), cfg.runs)
                size = (Path(d) / "pveclean_gpus.prom").stat().st_size
                levels.append({"where": where, "host_processes": procs, "cpu_s": cpu,
                               "wall_s": wall, "textfile_bytes": size})
    finally:
        with shielded():
            load.stop()
            lab.destroy()
    table = Table(f"pveclean metrics (the timer's command): {n:,} idle load processes, a GPU "
                  f"container with {cfg.ct_holders} holders, a host daemon (median of "
                  f"{cfg.runs})", ["Load processes in", "Host processes", "CPU per run",
                                   "wall per run", "share of one core at 30 s",
                                   "textfile bytes"])
    rows = []
    for lv in levels:
        c, w = median(lv["cpu_s"]), median(lv["wall_s"])
        lo, hi = quartiles(lv["cpu_s"])
        lv["share"] = share = c / INTERVAL_S
        table.rows.append([lv["where"], str(lv["host_processes"]), f"{ms(c)} ({ms(lo)}-{ms(hi)})",
                           ms(w), f"{share:.2%}", str(lv["textfile_bytes"])])
        rows.append(Row("Metrics", f"pveclean metrics every 30 s, {n:,} processes in "
                        f"{lv['where']}: CPU share", f"{share:.2%} of one core ({ms(c)} CPU "
                        f"per run, quartiles {ms(lo)}-{ms(hi)})", "<= 1 % of one core",
                        share <= TARGET))
    table.notes.append("CPU: user + system time of the command and every worker it forks "
                       "(getrusage of reaped children); in brackets the quartiles of the runs.")
    return rows, [table], {"load": n, "levels": levels}
