"""`pveclean metrics` as pveclean-metrics.timer runs it (every 30 s): CPU time per run on a
host with thousands of idle processes, beside a GPU container with holders and a host daemon,
against the target of 1 % of one core at that interval."""

from __future__ import annotations

import resource
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .discovery import add_holders, host_process_count, pveclean_exe
from .load import HostLoad
from .measure import VmidPool, median, new_lab, shielded, timed
from .settings import BenchConfig
from .table import Row, Table, ms

INTERVAL_S = 30.0  # pveclean-metrics.timer's OnUnitActiveSec
TARGET = 0.01  # of one core


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and every worker it reaped
    return ru.ru_utime + ru.ru_stime


def bench_metrics(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
                  ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    n = max(cfg.host_loads)
    lab = new_lab()
    load = HostLoad(cfg.fds)
    cpu: list[float] = []
    wall: list[float] = []
    try:
        ct = pool.take()
        lab.create_ct(ct, gpus=(0,))
        add_holders(lab, ct, cfg.ct_holders)
        lab.run_on_host("nvidia-persistenced", hold=[str(lab.nodes["nvidia0"])],
                        gpu_mib={0: 300})
        load.grow_to(n)
        procs = host_process_count()
        log(f"metrics: {procs} host processes, {n} load processes")
        with tempfile.TemporaryDirectory(prefix="pveclean-bench-textfile-") as d:
            argv = [*pveclean_exe(), "metrics", "--textfile-dir", d]
            timed(argv, lab.env())  # warm-up
            for _ in range(cfg.runs):
                c0 = _cpu()
                t = timed(argv, lab.env())
                cpu.append(_cpu() - c0)
                wall.append(t.seconds)
                if t.returncode != 0:
                    raise RuntimeError(f"pveclean metrics failed: {t.stderr.strip()}")
            size = (Path(d) / "pveclean_gpus.prom").stat().st_size
    finally:
        with shielded():
            load.stop()
            lab.destroy()
    c, w = median(cpu), median(wall)
    share = c / INTERVAL_S
    table = Table(f"pveclean metrics (the timer's command): {procs:,} host processes, a GPU "
                  f"container with {cfg.ct_holders} holders (median of {cfg.runs})",
                  ["Host processes", "CPU per run", "wall per run", "share of one core at 30 s",
                   "textfile bytes"])
    table.rows.append([str(procs), ms(c), ms(w), f"{share:.2%}", str(size)])
    table.notes.append("CPU: user + system time of the command and every worker it forks "
                       "(getrusage of reaped children).")
    row = Row("Metrics", f"pveclean metrics every 30 s, {procs:,} host processes: CPU share",
              f"{share:.2%} of one core ({ms(c)} CPU per run)", "<= 1 % of one core",
              share <= TARGET)
    return [row], [table], {"host_processes": procs, "cpu_s": cpu, "wall_s": wall,
                            "share": share, "textfile_bytes": size}
