"""A tenant bloats what pveclean reads (issue 26): 40 processes with 20,000 fds each (as many
as RLIMIT_NOFILE lets them have) beside a process with 8 GiB in NVML, and one process with
65,000 mappings of a file whose ~4,000-byte path is newlines (about 1 GB of maps text).
`pveclean ct --dry-run` and `pveclean gpus` must each end within the deadline + 1 s with a
peak RSS of at most 100 MB; a full `pveclean ct` must stop the NVML holder."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tests.harness.lxclab import Lab
from tests.helpers import start_in_ct

from .discovery import pveclean_exe
from .measure import HOOK_ENV, Spawned, VmidPool, new_lab, shielded, spawn_like_proxmox
from .settings import BenchConfig
from .table import Row, Table

DEADLINE_S = 6.0
TARGET_RSS_MB = 100.0
FD_PROCS, FDS = 40, 20000
MAPS, DEPTH = 65000, 16


def _run(lab: Lab, *args: str) -> Spawned:
    """As Proxmox runs it (cleared environment; PYTHONPATH kept: a checkout under test)."""
    env = {**HOOK_ENV, "PVECLEAN_CONFIG": str(lab.config_path)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return spawn_like_proxmox([*pveclean_exe(), *args], lab.root, env)


def _rows(case: str, runs: dict[str, Spawned]) -> list[Row]:
    rows = []
    for what, run in runs.items():
        rss = run.max_rss_kib * 1024 / 1e6
        rows += [Row("Bloat", f"{case}: {what}: wall time", f"{run.seconds:.2f} s",
                     f"<= {DEADLINE_S + 1:.0f} s (deadline + 1 s)",
                     run.seconds <= DEADLINE_S + 1),
                 Row("Bloat", f"{case}: {what}: peak RSS", f"{rss:.1f} MB",
                     f"<= {TARGET_RSS_MB:.0f} MB", rss <= TARGET_RSS_MB)]
    return rows


def bench_bloat(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
                ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab = new_lab()
    raw: dict[str, Any] = {}
    rows: list[Row] = []
    table = Table("Bloat: what a tenant makes pveclean read (deadline 6 s)",
                  ["Case", "Command", "Exit", "Wall", "Peak RSS", "First line"])
    try:
        lab.write_config(deadline_seconds=DEADLINE_S, grace_seconds=cfg.grace_s)
        cases: list[tuple[str, int, list[int]]] = []
        vmid = lab.create_ct(pool.take(), gpus=(0,))
        bloat = start_in_ct(lab, vmid, "fd_bloat", ["--procs", str(FD_PROCS), "--fds", str(FDS)])
        fds = int(bloat.ready_file.read_text().split()[2])
        holder = lab.run_in_ct(vmid, "python3", gpu_mib={0: 8192}).host_pids(lab)
        cases.append((f"fd bloat ({FD_PROCS} processes x {fds:,} fds)", vmid, holder))
        vmid2 = lab.create_ct(pool.take(), gpus=(0,))
        start_in_ct(lab, vmid2, "maps_bloat", ["--maps", str(MAPS), "--depth", str(DEPTH)])
        cases.append((f"maps bloat ({MAPS:,} mappings of a {DEPTH * 251}-byte path)", vmid2,
                      []))
        for case, ct, nvml in cases:
            log(f"bloat: {case}")
            runs = {"ct --dry-run": _run(lab, "ct", str(ct), "--dry-run"),
                    "gpus": _run(lab, "gpus")}
            if nvml:
                runs["ct (cleanup)"] = _run(lab, "ct", str(ct))
                left = [p for p in nvml if lab.alive(p)]
                rows.append(Row("Bloat", f"{case}: NVML holder (8 GiB) stopped by ct",
                                f"{len(nvml) - len(left)} of {len(nvml)}", "all", not left))
            rows += _rows(case, runs)
            for what, run in runs.items():
                first = (run.output.strip().splitlines() or ["-"])[0]
                table.rows.append([case, what, str(run.returncode), f"{run.seconds:.2f} s",
                                   f"{run.max_rss_kib * 1024 / 1e6:.1f} MB", first[:90]])
                raw[f"{case}: {what}"] = {"seconds": run.seconds, "exit": run.returncode,
                                          "max_rss_kib": run.max_rss_kib,
                                          "output": run.output[-2000:]}
    finally:
        with shielded():
            lab.destroy()
    table.notes.append("Peak RSS: ru_maxrss of pveclean's process tree from wait4() (pveclean "
                       "and its forked readers); 1 MB = 10^6 bytes. fds are judged up to 2,048 "
                       "per process and 16,384 more per scan, maps up to 16 MiB per process; "
                       "the rest is reported as not judged (verdict residual).")
    return rows, [table], raw
