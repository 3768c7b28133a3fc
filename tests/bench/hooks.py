"""Hook overhead: the installed hookscript run as Proxmox runs it (cleared env with
PATH=/sbin:/bin:/usr/sbin:/usr/bin and LC_ALL=C, stdin closed), with nothing to clean.

pre-start runs while the container is stopped (as Proxmox calls it), post-start and
pre-stop while it runs with no GPU holders. Peak RSS is ru_maxrss from wait4(): the largest
process of the hook's tree (the shell that execs pveclean, pveclean itself, and the lab's
pct stand-in it runs for the in-container probe).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

from .discovery import pveclean_exe
from .measure import (
    Spawned,
    VmidPool,
    median,
    new_lab,
    ratio_spread,
    shielded,
    spawn_like_proxmox,
    timed,
)
from .settings import BenchConfig
from .table import Row, Table, ms

TARGET_WALL_S = 0.3
TARGET_RSS_MB = 60.0
TARGET_SLOW_PCT_S = 0.3  # issue 16: pre-stop with nothing to clean and a 0.5 s pct
TARGET_SLOW_PCT_RATIO = 1.5  # ... and at most 1.5x its time with a fast pct
TARGET_VS_VERSION = 1.5  # issue 42: a hook phase with nothing to clean vs `pveclean --version`
TARGET_DRY_VS_BARE = 3.5  # `pveclean ct VMID --dry-run`, no holders, vs `python3 -c pass`
PHASES = ("pre-start", "post-start", "pre-stop")
# What the dry run's start-up is made of, timed beside it: the Python modules its main process
# imports (pveclean's and the standard library's, no work done), and of those the standard
# library's alone (dataclasses for the core's records; pickle, select and signal for the
# forked readers; pathlib; re for the config).
FLOORS = {
    "ct --dry-run's imports alone (no work)":
        "import pveclean.__main__, pveclean.host.prelude, pveclean.commands.cli, "
        "pveclean.commands.ct, yaml, pveclean.cleanup, pveclean.commands.render, shlex",
    "of which the standard library's": "import contextlib, dataclasses, fcntl, glob, pathlib, "
        "pickle, re, resource, select, shlex, signal, struct, unicodedata",
}


def _mb(kib: int) -> float:
    return kib * 1024 / 1e6


def _hooked_site() -> bool:
    """Whether a bare interpreter of this venv runs an import hook at start-up (setuptools'
    default editable install does: 16 ms of pathlib and more here, which a .deb install and
    Proxmox's python3 do not have, and which would flatter the start-up ratio)."""
    code = "import sys; print(any(m.startswith('__editable__') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False).stdout
    return out.strip() == "True"


def bench_hooks(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
                ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab = new_lab()
    try:
        vmid = lab.create_ct(pool.take(), start=False)
        lab.install_hook(vmid)
        script = str(lab.snippets / "pveclean-hook")
        runs: dict[str, list[Spawned]] = {}
        versions: dict[str, list[Spawned]] = {}
        version = [*pveclean_exe(), "--version"]
        for phase in PHASES:
            if phase == "post-start":
                lab.pct("start", str(vmid))  # runs pre-start and post-start hooks itself
            log(f"hooks: {phase} x {cfg.hook_runs}")
            argv = [script, str(vmid), phase]
            spawn_like_proxmox(argv, lab.root)  # warm-up: first run writes .pyc files
            runs[phase], versions[phase] = [], []
            for _ in range(cfg.hook_runs):  # interleaved with --version, as drift hits both
                runs[phase].append(spawn_like_proxmox(argv, lab.root))
                versions[phase].append(spawn_like_proxmox(version, lab.root))
        # the same pre-stop with a pct as slow as Proxmox's (its probe must not gate the run)
        lab.set_pct_latency(cfg.pct_latency_s)
        argv = [script, str(vmid), "pre-stop"]
        spawn_like_proxmox(argv, lab.root)
        slow = [spawn_like_proxmox(argv, lab.root) for _ in range(cfg.hook_runs)]
        # `pveclean ct --dry-run` with no holders against a bare interpreter, interleaved
        dry = [*pveclean_exe(), "ct", str(vmid), "--dry-run"]
        bare = [sys.executable, "-c", "pass"]
        timed(dry, lab.env())
        dry_times: list[float] = []
        bare_times: list[float] = []
        floors: dict[str, list[float]] = {name: [] for name in FLOORS}
        for _ in range(cfg.hook_runs):
            dry_times.append(timed(dry, lab.env()).seconds)
            bare_times.append(timed(bare).seconds)
            for name, code in FLOORS.items():
                floors[name].append(timed([sys.executable, "-c", code], lab.env()).seconds)
        lab.set_pct_latency(0)
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
        v = median([r.seconds for r in versions[phase]])
        spread = ratio_spread([r.seconds for r in rs], [r.seconds for r in versions[phase]])
        rows.append(Row("Hook", f"{phase}, nothing to clean, vs pveclean --version "
                        "(interleaved)", f"{ms(wall)} vs {ms(v)}: {wall / v:.2f}x; {spread}",
                        f"<= {TARGET_VS_VERSION}x", wall <= TARGET_VS_VERSION * v))
    fast, slowed = median([r.seconds for r in runs["pre-stop"]]), median([r.seconds for r in slow])
    lat = f"{cfg.pct_latency_s:.1f} s pct"
    table.rows.append([f"pre-stop, {lat}", ms(slowed), ms(max(r.seconds for r in slow)),
                       f"{_mb(max(r.max_rss_kib for r in slow)):.1f} MB",
                       ",".join(map(str, sorted({r.returncode for r in slow}))),
                       (slow[-1].output.strip().splitlines() or ["(none)"])[0][:110]])
    rows.append(Row("Hook", f"pre-stop, nothing to clean, {lat}: wall time (median)",
                    ms(slowed), f"<= {TARGET_SLOW_PCT_S * 1000:.0f} ms",
                    slowed <= TARGET_SLOW_PCT_S))
    rows.append(Row("Hook", f"pre-stop, nothing to clean: {lat} vs the lab's fast pct",
                    f"{ms(slowed)} vs {ms(fast)}: {slowed / fast:.2f}x",
                    f"<= {TARGET_SLOW_PCT_RATIO}x", slowed <= TARGET_SLOW_PCT_RATIO * fast))
    d, b = median(dry_times), median(bare_times)
    padded = " (baseline padded by an import hook in site-packages)" if _hooked_site() else ""
    rows.append(Row("Start-up", f"ct --dry-run, no holders, {lat}, vs python3 -c pass",
                    f"{ms(d)} vs {ms(b)}: {d / b:.1f}x{padded}", f"<= {TARGET_DRY_VS_BARE}x",
                    d <= TARGET_DRY_VS_BARE * b))
    for name, times in floors.items():
        f = median(times)
        rows.append(Row("Start-up", f"{name} vs python3 -c pass",
                        f"{ms(f)} vs {ms(b)}: {f / b:.1f}x", "-", None))
    raw_slow = [r.__dict__ for r in slow]
    table.notes.append(f"'{lat}': every pct call sleeps {cfg.pct_latency_s} s first, as "
                       "Proxmox's Perl pct compiles its modules on each call.")
    table.notes.append("Peak RSS: ru_maxrss of the hook's process tree from wait4() (sh exec'ing "
                       "pveclean, and the pct stand-in pveclean runs for its probe); "
                       "1 MB = 10^6 bytes.")
    raw = {phase: [r.__dict__ for r in rs] for phase, rs in runs.items()}
    raw["version"] = [r.__dict__ for rs in versions.values() for r in rs]
    raw["pre-stop-slow-pct"] = raw_slow
    return rows, [table], raw
