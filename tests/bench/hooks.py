"""Hook overhead: the installed hookscript run as Proxmox runs it (cleared env with
PATH=/sbin:/bin:/usr/sbin:/usr/bin and LC_ALL=C, stdin closed), with nothing to clean.

pre-start runs while the container is stopped (as Proxmox calls it), post-start and
pre-stop while it runs with no GPU holders. Peak RSS is ru_maxrss from wait4(): the largest
process of the hook's tree (the shell that execs pveclean, pveclean itself, and the lab's
pct stand-in it runs for the in-container probe).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .measure import Spawned, VmidPool, median, new_lab, shielded, spawn_like_proxmox
from .settings import BenchConfig
from .table import Row, Table, ms

TARGET_WALL_S = 0.3
TARGET_RSS_MB = 60.0
PHASES = ("pre-start", "post-start", "pre-stop")


def _mb(kib: int) -> float:
    return kib * 1024 / 1e6


def bench_hooks(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
                ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab = new_lab()
    try:
        vmid = lab.create_ct(pool.take(), start=False)
        lab.install_hook(vmid)
        script = str(lab.snippets / "pveclean-hook")
        runs: dict[str, list[Spawned]] = {}
        for phase in PHASES:
            if phase == "post-start":
                lab.pct("start", str(vmid))  # runs pre-start and post-start hooks itself
            log(f"hooks: {phase} x {cfg.hook_runs}")
            argv = [script, str(vmid), phase]
            spawn_like_proxmox(argv, lab.root)  # warm-up: first run writes .pyc files
            runs[phase] = [spawn_like_proxmox(argv, lab.root) for _ in range(cfg.hook_runs)]
    finally:
        with shielded():
            lab.destroy()
    table = Table(f"Hook overhead, nothing to clean ({cfg.hook_runs} runs per phase after one "
                  "warm-up)", ["Phase", "Wall median", "Wall max", "Peak RSS (max)",
                               "Exit codes", "Output (last run)"])
    rows: list[Row] = []
    for phase, rs in runs.items():
        wall = median([r.seconds for r in rs])
        rss = max(r.max_rss_kib for r in rs)
        codes = sorted({r.returncode for r in rs})
        out = (rs[-1].output.strip().splitlines() or ["(none)"])[0][:110]
        table.rows.append([phase, ms(wall), ms(max(r.seconds for r in rs)),
                           f"{_mb(rss):.1f} MB", ",".join(map(str, codes)), out])
        rows.append(Row("Hook", f"{phase}: wall time (median)", ms(wall),
                        f"< {TARGET_WALL_S * 1000:.0f} ms", wall < TARGET_WALL_S))
        rows.append(Row("Hook", f"{phase}: peak RSS", f"{_mb(rss):.1f} MB",
                        f"< {TARGET_RSS_MB:.0f} MB", _mb(rss) < TARGET_RSS_MB))
    table.notes.append("Peak RSS: ru_maxrss of the hook's process tree from wait4() (sh exec'ing "
                       "pveclean, and the pct stand-in pveclean runs for its probe); "
                       "1 MB = 10^6 bytes.")
    raw = {phase: [r.__dict__ for r in rs] for phase, rs in runs.items()}
    return rows, [table], raw
