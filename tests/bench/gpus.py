"""`pveclean gpus` (the whole command, host-wide) against `fuser -v` on the GPU nodes, with
thousands of idle processes: first in the host's own cgroups (pveclean gpus reads each of
them, as fuser does) at 0, 5,000 and 20,000 of them (its cost per process from one level to
the next must stay flat), then in a container without GPU passthrough (its devices cgroup keeps
them off the GPU nodes, so pveclean gpus does not read them; fuser reads them all), which is
where the processes of a busy Proxmox host live. Beside the 5,000: the peak memory of `ct
--dry-run`, `gpus`, `metrics` and a hook phase, each run as Proxmox runs a hookscript and
metered from a small parent (measure.spawn_like_proxmox)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from tests.harness.lxclab import Lab

from .discovery import (
    FLAT_FLOOR_S,
    FLAT_RATIO,
    Tool,
    add_holders,
    host_process_count,
    is_flat,
    pveclean_exe,
    time_interleaved,
)
from .load import HostLoad
from .measure import (
    HOOK_ENV,
    Timed,
    VmidPool,
    median,
    new_lab,
    shielded,
    spawn_like_proxmox,
    timed,
)
from .settings import BenchConfig
from .table import Row, Table, ms

HOST_MIB = 300
TARGET_RATIO = 1.2  # issue 42: gpus at least 1.2x faster than fuser -v at 5,000 processes
TARGET_RSS_MB = 60.0  # issue 42: peak memory of ct, gpus, metrics and a hook phase
HOST = "the host's own cgroups"
QUIET = "a container without GPU passthrough"


def _gpus_pids(t: Timed) -> int:
    try:
        data = json.loads(t.stdout)
    except ValueError:
        return -1
    pids = {p["host_pid"] for g in data["gpus"] for p in g["processes"]}
    return len(pids | {p["host_pid"] for p in data["other_holders"]})


def _fuser_pids(t: Timed) -> int:
    return len({w for w in t.stdout.split() if w.isdigit()})


def seed_lab(lab: Lab, pool: VmidPool, cfg: BenchConfig) -> tuple[int, int]:
    """A GPU container with the configured holders, the host's daemon on GPU 0, and a
    container without GPUs (where the load goes in the second half): (GPU CT, quiet CT)."""
    gpu_ct, quiet_ct = pool.take(), pool.take()
    lab.create_ct(gpu_ct, gpus=(0,))
    add_holders(lab, gpu_ct, cfg.ct_holders)
    lab.run_on_host("nvidia-persistenced", hold=[str(lab.nodes["nvidia0"])],
                    gpu_mib={0: HOST_MIB})
    lab.create_ct(quiet_ct, gpus=())
    return gpu_ct, quiet_ct


def peak_memory(lab: Lab, gpu_ct: int, quiet_ct: int) -> dict[str, list[int]]:
    """ru_maxrss (KiB) of each command's tree, 3 runs each after one warm-up: the dry run of
    the GPU container, gpus, metrics, and the quiet container's pre-stop (nothing to clean)."""
    env = {**HOOK_ENV, "PVECLEAN_CONFIG": str(lab.config_path)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    lab.install_hook(quiet_ct)
    hook = str(lab.snippets / "pveclean-hook")
    out: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="pveclean-bench-textfile-") as d:
        runs = {"ct --dry-run": [*pveclean_exe(), "ct", str(gpu_ct), "--dry-run"],
                "gpus": [*pveclean_exe(), "gpus"],
                "metrics": [*pveclean_exe(), "metrics", "--textfile-dir", d],
                "hook pre-stop, nothing to clean": [hook, str(quiet_ct), "pre-stop"]}
        for name, argv in runs.items():
            spawn_like_proxmox(argv, lab.root, env)
            got = [spawn_like_proxmox(argv, lab.root, env) for _ in range(3)]
            bad = [g for g in got if g.returncode not in (0, 1)]
            if bad:
                raise RuntimeError(f"{name} exited {bad[0].returncode}: {bad[0].output[-300:]}")
            out[name] = [g.max_rss_kib for g in got]
    return out


def gpus_loads(cfg: BenchConfig) -> tuple[int, ...]:
    """cfg.gpus_loads; a quick run (tiny host loads, settings.quick) scales them to its own."""
    top = max(cfg.host_loads)
    return cfg.gpus_loads if top >= 1000 else (0, top, 2 * top)


def _level(tl: list[Tool], runs: int, where: str, load: int) -> dict[str, Any]:
    times = time_interleaved(tl, runs)
    found = {t.name: t.count(timed(t.argv, t.env)) for t in tl if t.count}
    scan = json.loads(timed(tl[0].argv, tl[0].env).stdout)["scan"]
    return {"where": where, "load": load, "host_processes": host_process_count(),
            "times_s": times, "found": found, "scan": scan}


def bench_gpus(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
               ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab = new_lab()
    load = HostLoad(cfg.fds)
    levels: list[dict[str, Any]] = []
    peaks: dict[str, list[int]] = {}
    try:
        gpu_ct, quiet_ct = seed_lab(lab, pool, cfg)
        tl = [Tool("pveclean gpus", [*pveclean_exe(), "gpus", "--json"], lab.env(),
                   _gpus_pids)]
        fuser = shutil.which("fuser")
        if fuser is not None:
            nodes = [str(p) for p in lab.nodes.values()]
            tl.append(Tool("fuser -v", [fuser, "-v", *nodes], None, _fuser_pids))
        loads = gpus_loads(cfg)
        for n in loads:
            load.grow_to(n)
            log(f"gpus: {host_process_count()} host processes, {n} load in {HOST}")
            levels.append(_level(tl, cfg.runs, HOST, n))
            if n == loads[1]:
                log(f"gpus: peak memory of ct, gpus, metrics, a hook at {n} load processes")
                peaks = peak_memory(lab, gpu_ct, quiet_ct)
        load.move_to(lab.cgroup(quiet_ct) / "ns" / "load")
        log(f"gpus: {host_process_count()} host processes, {load.count} load in {QUIET}")
        levels.append(_level(tl, cfg.runs, QUIET, load.count))
    finally:
        with shielded():
            load.stop()
            lab.destroy()
    return _results(levels, peaks, cfg)


def _per_process(host: list[dict[str, Any]]) -> list[float | None]:
    """pveclean gpus' extra wall time per extra host process, level to level."""
    out: list[float | None] = []
    for a, b in itertools.pairwise(host):
        ta, tb = median(a["times_s"]["pveclean gpus"]), median(b["times_s"]["pveclean gpus"])
        extra = b["host_processes"] - a["host_processes"]
        out.append((tb - ta) / extra if extra > 0 else None)
    return out


def _results(levels: list[dict[str, Any]], peaks: dict[str, list[int]], cfg: BenchConfig
             ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    table = Table(f"pveclean gpus vs fuser -v: idle load processes with {cfg.fds} fds each, a "
                  f"GPU container with {cfg.ct_holders} holders, a host daemon (median of "
                  f"{cfg.runs}; min-max)",
                  ["Load processes in", "Load", "Host processes", "pveclean gpus", "fuser -v",
                   "fuser/gpus", "gpus: host processes read", "holders found (gpus/fuser)"])
    rows = []
    for lv in levels:
        gt = lv["times_s"]["pveclean gpus"]
        ft = lv["times_s"].get("fuser -v") or []
        g, f = median(gt), (median(ft) if ft else None)
        ratio = f"{f / g:.2f}x" if f else "n/a"
        found = "/".join(str(lv["found"].get(k, "n/a")) for k in ("pveclean gpus", "fuser -v"))
        table.rows.append([lv["where"], f"{lv['load']:,}", str(lv["host_processes"]),
                           f"{ms(g)} ({ms(min(gt))}-{ms(max(gt))})",
                           f"{ms(f)} ({ms(min(ft))}-{ms(max(ft))})" if f else "n/a", ratio,
                           str(lv["scan"]["host_processes"]), found])
        if lv["load"] == 0:
            continue
        target = TARGET_RATIO if lv["where"] == HOST else 1.0
        rows.append(Row("Gpus", f"{lv['load']:,} processes in {lv['where']}: pveclean gpus "
                        "vs fuser -v", f"{ms(g)} vs {ms(f) if f else 'n/a'}: {ratio}",
                        f">= {target:.1f}x faster than fuser",
                        None if f is None else f >= target * g))
    host = [lv for lv in levels if lv["where"] == HOST]
    steps = _per_process(host)
    if len(steps) >= 2:
        rows.append(Row("Gpus", f"cost per host process, {host[1]['load']:,} then "
                        f"{host[2]['load']:,} in {HOST}",
                        ", ".join("n/a" if s is None else f"{s * 1e6:.0f} us" for s in steps)
                        + " of wall per process", f"flat (the second <= {FLAT_RATIO:.0f}x the "
                        f"first, or < {FLAT_FLOOR_S * 1e6:.0f} us)", is_flat(steps)))
    for name, kib in peaks.items():
        mb = max(kib) * 1024 / 1e6
        rows.append(Row("Peak memory", f"{name}, {host[1]['load']:,} host processes: peak RSS "
                        "(max of 3)", f"{mb:.1f} MB", f"<= {TARGET_RSS_MB:.0f} MB",
                        mb <= TARGET_RSS_MB))
    table.notes.append("Both are whole commands: pveclean gpus starts the interpreter, scans, "
                       "queries NVML and prints JSON; fuser -v checks every process's fds "
                       "and maps against the lab's GPU nodes. In a container without GPU "
                       "passthrough the load processes are skipped by pveclean gpus (its "
                       "devices cgroup denies them the GPU nodes) and read by fuser.")
    table.notes.append("Cost per process: the extra median wall time of pveclean gpus from one "
                       "level to the next, divided by the extra host processes.")
    table.notes.append("Peak RSS: ru_maxrss of the command's process tree (pveclean and its "
                       "forked workers and readers; the largest one), read by a small metering "
                       "parent; 1 MB = 10^6 bytes.")
    table.notes.append("holders found: pveclean gpus also attributes holders of other labs "
                       "running on this host (same fake device numbers); fuser counts PIDs.")
    return rows, [table], {"levels": levels, "peak_rss_kib": peaks, "per_process_s": steps}
