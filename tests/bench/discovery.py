"""Discovery under host load (pveclean --dry-run against fuser -v and lsof on the same nodes),
and how discovery grows with the container's size and its number of holders."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.lxclab import Lab

from .load import HostLoad
from .measure import Timed, median, ratio_spread, timed
from .settings import BenchConfig
from .table import Row, Table, ms

HOLDER_NAME = "gpu-worker"
OTHER_NAME = "app"
HOLDER_MIB = 100
OTHER_FDS = 5  # /dev/null fds of each non-holder, so the container scan has fds to look at
TARGET_SPEEDUP = 4.0  # issue 16: the whole ct --dry-run vs fuser -v at 5,000 processes
FLAT_RATIO = 2.0  # a later step may cost at most this many times the first one per process...
FLAT_FLOOR_S = 0.0001  # ...or under 0.1 ms per process, which is flat for any purpose


def pveclean_exe() -> list[str]:
    exe = Path(sys.executable).parent / "pveclean"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pveclean"]


def host_process_count() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


# ---- the container ------------------------------------------------------------------------
def add_holders(lab: Lab, vmid: int, n: int) -> None:
    """n processes holding /dev/nvidia0 and /dev/nvidiactl, with NVML memory on GPU 0."""
    if n > 0:
        lab.run_in_ct(vmid, HOLDER_NAME, hold=["/dev/nvidia0", "/dev/nvidiactl"],
                      children=n - 1, gpu_mib={0: HOLDER_MIB})


def add_others(lab: Lab, vmid: int, n: int) -> None:
    """n processes holding a few fds of /dev/null and no GPU."""
    if n > 0:
        lab.run_in_ct(vmid, OTHER_NAME, hold=["/dev/null"] * OTHER_FDS, children=n - 1)


def grow_ct_to(lab: Lab, vmid: int, total: int) -> int:
    """Add non-holders until the cgroup tree has `total` processes; returns the count."""
    add_others(lab, vmid, total - len(lab.tree_pids(vmid)))
    return len(lab.tree_pids(vmid))


# ---- the tools ------------------------------------------------------------------------------
@dataclass
class Tool:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    count: Callable[[Timed], int] | None = None  # holders it reported, from its output


def _fuser_pids(t: Timed) -> int:
    # psmisc fuser: PIDs on stdout (each followed by access letters on stderr with -v)
    return len({w for w in t.stdout.split() if w.isdigit()})


def _lsof_pids(t: Timed) -> int:
    lines = t.stdout.splitlines()[1:]
    return len({ln.split()[1] for ln in lines if len(ln.split()) > 1})


def _pveclean_holders(t: Timed) -> int:
    try:
        return len(json.loads(t.stdout)["holders"])
    except (ValueError, KeyError):
        return -1


def config_without_probe(lab: Lab) -> dict[str, str]:
    """Env for pveclean with the lab's config but `probe: false` (no pct exec)."""
    import yaml

    data = yaml.safe_load(lab.config_path.read_text())
    data["probe"] = False
    path = lab.root / "pveclean-noprobe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    path.chmod(0o644)
    return {**lab.env(), "PVECLEAN_CONFIG": str(path)}


def tools(lab: Lab, vmid: int) -> list[Tool]:
    nodes = [str(p) for p in lab.nodes.values()]
    dry = [*pveclean_exe(), "ct", str(vmid), "--dry-run"]
    out = [Tool("pveclean", dry, lab.env()),
           Tool("pveclean-noprobe", dry, config_without_probe(lab))]
    for name, argv, count in (("fuser", ["fuser", "-v", *nodes], _fuser_pids),
                              ("lsof", ["lsof", *nodes], _lsof_pids)):
        path = shutil.which(name)
        if path is not None:
            out.append(Tool(name, [path, *argv[1:]], None, count))
    return out


def time_interleaved(tl: list[Tool], runs: int) -> dict[str, list[float]]:
    """One warm-up each, then `runs` rounds of every tool in turn, so that drift of a noisy
    machine hits all tools alike."""
    for t in tl:
        timed(t.argv, t.env)
    times: dict[str, list[float]] = {t.name: [] for t in tl}
    for _ in range(runs):
        for t in tl:
            times[t.name].append(timed(t.argv, t.env).seconds)
    return times


def found_counts(lab: Lab, vmid: int, tl: list[Tool]) -> dict[str, int]:
    """How many holders each tool reports (a sanity check that they all see the same)."""
    out: dict[str, int] = {}
    for t in tl:
        if t.name == "pveclean":
            out[t.name] = _pveclean_holders(timed([*t.argv, "--json"], t.env))
        elif t.count is not None:
            out[t.name] = t.count(timed(t.argv, t.env))
    return out


def fixed_costs(lab: Lab, vmid: int, runs: int) -> dict[str, float]:
    """Costs of every pveclean run that do not depend on process counts."""
    cases = {"pveclean --version": ([*pveclean_exe(), "--version"], lab.env()),
             "pct exec VMID -- /bin/true": ([str(lab.pct_path), "exec", str(vmid), "--",
                                             "/bin/true"], None)}
    out = {}
    for name, (argv, env) in cases.items():
        timed(argv, env)
        out[name] = median([timed(argv, env).seconds for _ in range(runs)])
    return out


def scan_only(lab: Lab, vmid: int, runs: int) -> list[float] | None:
    """pveclean's host scan alone (cgroup tree, fds, maps), in this process: the part of a
    run that depends on process counts, without interpreter start, probe, NVML or report.
    None when pveclean's internals no longer fit this call."""
    try:
        from pveclean import cleanup
        from pveclean.host import configfile, procscan
        from pveclean.proxmox import pveconf

        cfg = configfile.load(lab.config_path)
        scope = cleanup.make_scope(vmid, cfg, pveconf.read_config(cfg.pve_config_dir, vmid))
        procscan.scan_host(scope)
        out = []
        for _ in range(runs):
            t0 = time.perf_counter()
            procscan.scan_host(scope)
            out.append(time.perf_counter() - t0)
        return out
    except Exception as exc:  # internals changed: report n/a rather than fail the bench
        print(f"bench: pveclean scan-only timing skipped: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None


# ---- discovery under host load --------------------------------------------------------------
@dataclass
class Level:
    load: int
    host_procs: int
    times: dict[str, list[float]]
    scan: list[float] | None
    found: dict[str, int] = field(default_factory=dict)

    def med(self, name: str) -> float | None:
        return median(self.times[name]) if self.times.get(name) else None


def bench_discovery(lab: Lab, vmid: int, cfg: BenchConfig, load: HostLoad,
                    log: Callable[[str], None]) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab.create_ct(vmid, gpus=(0,))
    add_holders(lab, vmid, cfg.ct_holders)
    ct_size = grow_ct_to(lab, vmid, cfg.ct_procs)
    tl = tools(lab, vmid)
    lab.set_pct_latency(cfg.pct_latency_s)  # pveclean's probe meets a pct as slow as Proxmox's
    levels: list[Level] = []
    for n in cfg.host_loads:
        load.grow_to(n)
        procs = host_process_count()
        log(f"discovery: {procs} host processes ({n} load), CT {vmid} with {ct_size} "
            f"processes, {cfg.ct_holders} holders")
        times = time_interleaved(tl, cfg.runs)
        levels.append(Level(n, procs, times, scan_only(lab, vmid, cfg.runs),
                            found_counts(lab, vmid, tl)))
    load.stop()
    fixed = fixed_costs(lab, vmid, cfg.runs)
    lab.set_pct_latency(0)
    return _discovery_results(levels, tl, ct_size, cfg, fixed)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _x(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.1f}x"


def _msn(s: float | None) -> str:
    return "n/a" if s is None else ms(s)


def _discovery_results(levels: list[Level], tl: list[Tool], ct_size: int, cfg: BenchConfig,
                       fixed: dict[str, float]
                       ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    names = [t.name for t in tl]
    table = Table(
        f"Discovery: CT with {ct_size} processes, {cfg.ct_holders} holding GPU nodes; host load "
        f"processes with {cfg.fds} fds each (median of {cfg.runs})",
        ["Host processes (load)", "pveclean --dry-run", "fuser -v", "lsof", "fuser/pveclean",
         "lsof/pveclean", "pveclean, probe off", "pveclean scan only", "fuser/scan",
         "holders found (pveclean/fuser/lsof)"])
    rows: list[Row] = []
    for lv in levels:
        p, f, lo = lv.med("pveclean"), lv.med("fuser"), lv.med("lsof")
        noprobe = lv.med("pveclean-noprobe")
        scan = median(lv.scan) if lv.scan else None
        found = "/".join(str(lv.found.get(n, "n/a")) for n in ("pveclean", "fuser", "lsof"))
        table.rows.append([f"{lv.host_procs} ({lv.load})", _msn(p), _msn(f), _msn(lo),
                           _x(_ratio(f, p)), _x(_ratio(lo, p)), _msn(noprobe), _msn(scan),
                           _x(_ratio(f, scan)), found])
    table.notes.append("pveclean --dry-run is the whole command: interpreter start, cgroup "
                       "scan, in-container probe (pct exec), NVML, report file. 'probe off': "
                       "the same with `probe: false`. 'scan only': pveclean's host scan of "
                       "the container's cgroup tree (fds and maps), timed in-process.")
    table.notes.append("Fixed costs in every run, whatever the load: " + ", ".join(
        f"{k} {ms(v)}" for k, v in fixed.items()))
    if "fuser" not in names or "lsof" not in names:
        table.notes.append("fuser or lsof is not installed here: its columns are n/a")
    top = levels[-1]
    p, f = top.med("pveclean"), top.med("fuser")
    r = _ratio(f, p)
    rows.append(Row("Discovery", f"{top.load:,} host processes: pveclean ct --dry-run "
                    f"({cfg.pct_latency_s:.1f} s pct) vs fuser -v",
                    f"{_msn(p)} vs {_msn(f)}: {_x(r)}; " + ratio_spread(
                        top.times.get("fuser", []), top.times.get("pveclean", [])),
                    f">= {TARGET_SPEEDUP:.0f}x faster",
                    None if r is None else r >= TARGET_SPEEDUP))
    lo = top.med("lsof")
    rows.append(Row("Discovery", f"{top.load:,} host processes: pveclean vs lsof",
                    f"{_msn(p)} vs {_msn(lo)}: {_x(_ratio(lo, p))}"))
    if top.scan:
        s = median(top.scan)
        rows.append(Row("Discovery", f"{top.load:,} host processes: pveclean scan only vs fuser",
                        f"{ms(s)} vs {_msn(f)}: {_x(_ratio(f, s))}"))
    noprobe = top.med("pveclean-noprobe")
    if noprobe is not None:
        rows.append(Row("Discovery", f"{top.load:,} host processes: pveclean with probe off vs "
                        "fuser", f"{ms(noprobe)} vs {_msn(f)}: {_x(_ratio(f, noprobe))}"))
    if len(levels) > 1 and levels[0].med("pveclean") and p:
        p0 = levels[0].med("pveclean")
        assert p0 is not None
        rows.append(Row("Discovery", f"pveclean with {top.load:,} vs {levels[0].load} load "
                        "processes", f"{ms(p0)} -> {ms(p)} ({(p - p0) * 1000:+.0f} ms)"))
    raw = {"ct_processes": ct_size, "ct_holders": cfg.ct_holders, "fixed_costs_s": fixed,
           "levels": [{"load": lv.load, "host_processes": lv.host_procs, "times_s": lv.times,
                       "scan_only_s": lv.scan, "found": lv.found} for lv in levels]}
    return rows, [table], raw


# ---- growth -------------------------------------------------------------------------------
@dataclass
class Point:
    size: int  # processes in the cgroup tree, or holders
    procs: int
    cli: list[float]
    noprobe: list[float]
    scan: list[float] | None


def _steps(points: list[Point], pick: Callable[[Point], float | None]) -> list[float | None]:
    """Marginal cost per process (or holder) of each step between consecutive sizes."""
    out: list[float | None] = []
    for a, b in itertools.pairwise(points):
        ta, tb = pick(a), pick(b)
        out.append(None if ta is None or tb is None or b.size == a.size
                   else (tb - ta) / (b.size - a.size))
    return out


def is_flat(steps: list[float | None]) -> bool | None:
    """Flat: no later step costs more than FLAT_RATIO times the first one per unit (or less
    than FLAT_FLOOR_S per unit, which no one would notice)."""
    known = [s for s in steps if s is not None]
    if len(known) < 2:
        return None
    first = max(known[0], FLAT_FLOOR_S)
    return all(s <= max(FLAT_RATIO * first, FLAT_FLOOR_S) for s in known[1:])


def _per(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1000:.2f} ms"


def measure_point(lab: Lab, vmid: int, size: int, runs: int) -> Point:
    tl = [t for t in tools(lab, vmid) if t.name.startswith("pveclean")]
    times = time_interleaved(tl, runs)
    return Point(size, len(lab.tree_pids(vmid)), times["pveclean"], times["pveclean-noprobe"],
                 scan_only(lab, vmid, runs))


def bench_growth(lab: Lab, vmid_procs: int, vmid_holders: int, cfg: BenchConfig,
                 log: Callable[[str], None]) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab.create_ct(vmid_procs, gpus=(0,))
    add_holders(lab, vmid_procs, cfg.ct_holders)
    by_procs: list[Point] = []
    for n in cfg.growth_procs:
        size = grow_ct_to(lab, vmid_procs, n)
        log(f"growth: CT {vmid_procs} with {size} processes, {cfg.ct_holders} holders")
        by_procs.append(measure_point(lab, vmid_procs, size, cfg.runs))
    lab.create_ct(vmid_holders, gpus=(0,))
    add_others(lab, vmid_holders, cfg.growth_others)
    by_holders: list[Point] = []
    have = 0
    for n in cfg.growth_holders:
        add_holders(lab, vmid_holders, n - have)
        have = n
        log(f"growth: CT {vmid_holders} with {n} holders")
        by_holders.append(measure_point(lab, vmid_holders, n, cfg.runs))
    rows: list[Row] = []
    tables: list[Table] = []
    for label, unit, points in (("container processes", "process", by_procs),
                                ("holders", "holder", by_holders)):
        cli_steps = _steps(points, lambda p: median(p.cli))
        np_steps = _steps(points, lambda p: median(p.noprobe))
        scan_steps = _steps(points, lambda p: median(p.scan) if p.scan else None)
        t = Table(f"Growth: discovery time as {label} grow (median of {cfg.runs})",
                  [label.capitalize(), "Processes in CT", "pveclean --dry-run",
                   f"per {unit} (step)", "probe off", f"probe off per {unit} (step)",
                   "scan only", f"scan per {unit} (step)"])
        for i, p in enumerate(points):
            t.rows.append([str(p.size), str(p.procs), ms(median(p.cli)),
                           "-" if i == 0 else _per(cli_steps[i - 1]),
                           ms(median(p.noprobe)), "-" if i == 0 else _per(np_steps[i - 1]),
                           _msn(median(p.scan) if p.scan else None),
                           "-" if i == 0 else _per(scan_steps[i - 1])])
        t.notes.append(f"per {unit}: extra time divided by the extra {label} since the "
                       "previous row (the marginal cost; fixed start-up costs cancel out)")
        tables.append(t)
        flat = is_flat(cli_steps)
        sizes = f"{points[0].size} -> {points[-1].size}"
        rows.append(Row("Growth", f"cost per {unit}, {label} {sizes}",
                        ", ".join(_per(s) for s in cli_steps) + f" per {unit}",
                        f"flat (each step <= {FLAT_RATIO:.0f}x the first, or < "
                        f"{FLAT_FLOOR_S * 1000:.1f} ms)", flat))
    raw = {key: [{"size": p.size, "processes": p.procs, "cli_s": p.cli,
                  "probe_off_s": p.noprobe, "scan_only_s": p.scan}
                 for p in pts] for key, pts in (("by_processes", by_procs),
                                                ("by_holders", by_holders))}
    return rows, tables, raw
