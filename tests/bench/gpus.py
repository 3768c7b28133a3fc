"""`pveclean gpus` (the whole command, host-wide) against `fuser -v` on the GPU nodes, with
thousands of idle processes: first in the host's own cgroups (pveclean gpus reads each of
them, as fuser does), then in a container without GPU passthrough (its devices cgroup keeps
them off the GPU nodes, so pveclean gpus does not read them; fuser reads them all), which is
where the processes of a busy Proxmox host live."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any

from tests.harness.lxclab import Lab

from .discovery import Tool, add_holders, host_process_count, pveclean_exe, time_interleaved
from .load import HostLoad
from .measure import Timed, VmidPool, median, new_lab, shielded, timed
from .settings import BenchConfig
from .table import Row, Table, ms

HOST_MIB = 300


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


def bench_gpus(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
               ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    n = max(cfg.host_loads)
    lab = new_lab()
    load = HostLoad(cfg.fds)
    levels: list[dict[str, Any]] = []
    try:
        _gpu_ct, quiet_ct = seed_lab(lab, pool, cfg)
        tl = [Tool("pveclean gpus", [*pveclean_exe(), "gpus", "--json"], lab.env(),
                   _gpus_pids)]
        fuser = shutil.which("fuser")
        if fuser is not None:
            nodes = [str(p) for p in lab.nodes.values()]
            tl.append(Tool("fuser -v", [fuser, "-v", *nodes], None, _fuser_pids))
        load.grow_to(n)
        for where in ("the host's own cgroups", "a container without GPU passthrough"):
            if where.startswith("a container"):
                load.move_to(lab.cgroup(quiet_ct) / "ns" / "load")
            procs = host_process_count()
            log(f"gpus: {procs} host processes, {n} load processes in {where}")
            times = time_interleaved(tl, cfg.runs)
            found = {t.name: t.count(timed(t.argv, t.env)) for t in tl if t.count}
            scan = json.loads(timed(tl[0].argv, tl[0].env).stdout)["scan"]
            levels.append({"where": where, "host_processes": procs, "times_s": times,
                           "found": found, "scan": scan})
    finally:
        with shielded():
            load.stop()
            lab.destroy()
    return _results(levels, n, cfg)


def _results(levels: list[dict[str, Any]], n: int, cfg: BenchConfig
             ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    table = Table(f"pveclean gpus vs fuser -v: {n:,} idle load processes with {cfg.fds} fds "
                  f"each, a GPU container with {cfg.ct_holders} holders, a host daemon "
                  f"(median of {cfg.runs})",
                  ["Load processes in", "Host processes", "pveclean gpus", "fuser -v",
                   "fuser/gpus", "gpus: host processes read", "holders found (gpus/fuser)"])
    rows = []
    for lv in levels:
        g = median(lv["times_s"]["pveclean gpus"])
        f = median(lv["times_s"]["fuser -v"]) if lv["times_s"].get("fuser -v") else None
        ratio = f"{f / g:.1f}x" if f else "n/a"
        found = "/".join(str(lv["found"].get(k, "n/a")) for k in ("pveclean gpus", "fuser -v"))
        table.rows.append([lv["where"], str(lv["host_processes"]), ms(g),
                           ms(f) if f else "n/a", ratio, str(lv["scan"]["host_processes"]),
                           found])
        rows.append(Row("Gpus", f"{n:,} processes in {lv['where']}: pveclean gpus vs fuser -v",
                        f"{ms(g)} vs {ms(f) if f else 'n/a'}: {ratio}",
                        "faster than fuser", None if f is None else g < f))
    table.notes.append("Both are whole commands: pveclean gpus starts the interpreter, scans, "
                       "queries NVML and prints JSON; fuser -v checks every process's fds "
                       "and maps against the lab's GPU nodes. In a container without GPU "
                       "passthrough the load processes are skipped by pveclean gpus (its "
                       "devices cgroup denies them the GPU nodes) and read by fuser.")
    table.notes.append("holders found: pveclean gpus also attributes holders of other labs "
                       "running on this host (same fake device numbers); fuser counts PIDs.")
    return rows, [table], {"load": n, "levels": levels}
