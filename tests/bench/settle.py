"""The settling look's cost (issue 39): the look that settles a `clean` verdict reads every
process's fds and maps, and now runs frozen like every other look. A container of N idle
processes and one GPU holder, `pveclean ct` `runs` times: the run's duration and the freeze
summary (`sources.freeze`: how often, how long in all, the longest)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from .measure import VmidPool, median, new_lab, shielded
from .settings import BenchConfig
from .table import Row, Table

SIZES = (100, 1000)
FREEZE = re.compile(r"frozen (\d+) time\(s\), ([0-9.]+) s in all, the longest ([0-9.]+) s")


def bench_settle(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
                 ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab = new_lab()
    raw: dict[str, Any] = {}
    table = Table("Settling look (frozen): a container of N idle processes and one holder",
                  ["N processes", "run (median)", "frozen in all (median)",
                   "longest freeze (max)", "freezes"])
    rows: list[Row] = []
    try:
        for n in SIZES:
            vmid = lab.create_ct(pool.take(), gpus=(0,))
            lab.run_in_ct(vmid, "idle", children=n - 1)
            got = []
            for _ in range(max(cfg.runs, 3)):
                lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
                t0 = time.monotonic()
                rep = json.loads(lab.pveclean("ct", str(vmid), "--json").stdout)
                m = FREEZE.search(rep["sources"]["freeze"])
                got.append((time.monotonic() - t0, rep["verdict"],
                            *(float(x) for x in (m.groups() if m else (0, 0, 0)))))
            log(f"settle: {n} processes: {got}")
            raw[str(n)] = got
            table.rows.append([str(n), f"{median([g[0] for g in got]):.2f} s",
                               f"{median([g[3] for g in got]):.3f} s",
                               f"{max(g[4] for g in got):.3f} s", f"{int(got[0][2])}"])
            rows.append(Row("Settle", f"{n} processes, one holder: verdict",
                            ", ".join(sorted({g[1] for g in got})), "clean",
                            all(g[1] == "clean" for g in got)))
    finally:
        with shielded():
            lab.destroy()
    return rows, [table], raw
