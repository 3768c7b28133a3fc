"""`make bench`: pveclean against fuser, lsof and the seeds' one-liners, on the lab (issue 7).

    python -m tests.bench.run [--quick] [--runs N] [--only SECTION,...] [--out DIR]

Sections: discovery (host load of 1,000 and 5,000 idle processes with ~20 fds each; pveclean
ct --dry-run against fuser -v and lsof on the lab's GPU nodes), growth (the container grows
to 500 processes, its holders to 200), cleanup (the seeds' situation: pveclean against
`fuser -k` on the host and in the container and `ps aux | grep | kill`), hooks (pre-start,
post-start, pre-stop with nothing to clean), imports (python -X importtime of each command's
path: its top ten imports, and no heavy module it must not import), gpus (pveclean gpus
against fuser -v with the load in the host's cgroups, then in a container without GPUs),
metrics (CPU per run of `pveclean metrics`, the timer's command, with 5,000 processes: its
share of one core at 30 s), bloat (40 processes with 20,000 fds each beside an 8 GiB NVML
holder, and 1 GB of maps: ct --dry-run, gpus and a cleanup within the deadline + 1 s and
100 MB), report-bloat (400 holders of 64 long GPU paths: report size, task log, wall time
against the deadline, peak RSS). Prints the tables with the date and machine on top and
writes them as Markdown and JSON to bench/results/
(git-ignored).

Needs root and LXC, like the lab; without them it prints one line and exits 2. Everything it
starts (labs, containers, load processes) is torn down at the end, on Ctrl-C or error too.
Exit status: 0 when every section ran (targets met or not: see the table), 1 when a
section failed, 2 when the lab cannot run here, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import dataclasses
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pveclean
from tests.harness.lxclab import REPO, LabUnavailable, cgroup2_root, lab_unavailable_reason

from .bloat import bench_bloat
from .cleanup import bench_cleanup
from .discovery import bench_discovery, bench_growth
from .flood import bench_flood
from .gpus import bench_gpus
from .hooks import bench_hooks
from .imports import bench_imports
from .load import HostLoad, build_loadproc
from .measure import VmidPool, machine_info, new_lab, shielded
from .metrics import bench_metrics
from .reportbloat import bench_report_bloat
from .settings import BenchConfig, quick
from .settle import bench_settle
from .table import Results, Row, Table, render_text, write_results

SECTIONS = ("discovery", "growth", "cleanup", "hooks", "imports", "gpus", "metrics", "bloat",
            "report-bloat", "settle")
RESULTS_DIR = REPO / "bench" / "results"
Section = tuple[list[Row], list[Table], dict[str, Any]]


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwind like Ctrl-C so that every `finally` cleans up."""


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes and one run each: checks that the bench works")
    ap.add_argument("--runs", type=int, help="timed runs per measurement (default 11)")
    ap.add_argument("--only", help=f"comma-separated sections out of {','.join(SECTIONS)}")
    ap.add_argument("--pct-latency", type=float, metavar="SECONDS",
                    help="seconds each pct call of pveclean's sleeps first, modelling Proxmox's "
                         "Perl pct (default 0.5; 0 for the lab's bare stand-in)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR,
                    help="where the Markdown and JSON go (default bench/results)")
    args = ap.parse_args(argv)
    if args.only:
        unknown = set(args.only.split(",")) - set(SECTIONS)
        if unknown:
            ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if args.runs is not None and args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.pct_latency is not None and not 0 <= args.pct_latency <= 10:
        ap.error("--pct-latency must be 0..10 seconds")
    return args


def unavailable() -> str | None:
    """Why the bench cannot run here, or None."""
    reason = lab_unavailable_reason()
    if reason:
        return reason
    try:
        cgroup2_root()
        build_loadproc()
    except (LabUnavailable, RuntimeError) as exc:
        return str(exc)
    return None


class Logger:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.start:5.0f} s] {msg}", file=sys.stderr, flush=True)


def run_sections(cfg: BenchConfig, sections: list[str], res: Results, log: Logger) -> bool:
    """Run the sections into `res`; a section that fails is recorded and the others run.
    Returns True when all ran."""
    pool = VmidPool()
    ok = True

    def record(name: str, fn: Callable[[], Section]) -> None:
        nonlocal ok
        try:
            rows, tables, raw = fn()
        except (KeyboardInterrupt, LabUnavailable):
            raise
        except Exception as exc:
            ok = False
            traceback.print_exc()
            res.targets.append(Row(name.capitalize(), "section failed",
                                   f"{type(exc).__name__}: {exc}"[:200], "runs", False))
            return
        res.targets += rows
        res.details += tables
        res.raw[name] = raw

    if "discovery" in sections or "growth" in sections:
        load = HostLoad(cfg.fds)
        lab = new_lab()
        try:
            if "discovery" in sections:
                record("discovery", lambda: bench_discovery(lab, pool.take(), cfg, load, log))
            load.stop()
            if "growth" in sections:
                record("growth", lambda: bench_growth(lab, pool.take(), pool.take(), cfg, log))
        finally:
            with shielded():
                load.stop()
                lab.destroy()
    if "cleanup" in sections:
        record("cleanup", lambda: bench_cleanup(pool, cfg, log))
        record("flood", lambda: bench_flood(pool, cfg, log))
    if "hooks" in sections:
        record("hooks", lambda: bench_hooks(pool, cfg, log))
    if "imports" in sections:
        record("imports", lambda: bench_imports(cfg, log))
    if "gpus" in sections:
        record("gpus", lambda: bench_gpus(pool, cfg, log))
    if "metrics" in sections:
        record("metrics", lambda: bench_metrics(pool, cfg, log))
    if "bloat" in sections:
        record("bloat", lambda: bench_bloat(pool, cfg, log))
    if "report-bloat" in sections:
        record("report-bloat", lambda: bench_report_bloat(pool, cfg, log))
    if "settle" in sections:  # issue 39: the settling look, frozen
        record("settle", lambda: bench_settle(pool, cfg, log))
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = quick() if args.quick else BenchConfig()
    if args.runs is not None:
        cfg = dataclasses.replace(cfg, runs=args.runs, hook_runs=max(args.runs, 1))
    if args.pct_latency is not None:
        cfg = dataclasses.replace(cfg, pct_latency_s=args.pct_latency)
    sections = args.only.split(",") if args.only else list(SECTIONS)
    reason = unavailable()
    if reason:
        print(f"bench: the lab cannot run here: {reason}", file=sys.stderr)
        return 2
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    log = Logger()
    res = Results(machine_info())
    res.raw["config"] = dataclasses.asdict(cfg)
    # Timed as installed: the package's .pyc files written first (a .deb compiles them at
    # install; PYTHONDONTWRITEBYTECODE in the caller's environment would otherwise time the
    # compiler on every run of an edited module).
    compileall.compile_dir(str(Path(pveclean.__file__).parent), quiet=1)
    try:
        log(f"bench: sections {', '.join(sections)}" + (" (quick)" if args.quick else ""))
        ok = run_sections(cfg, sections, res, log)
    except KeyboardInterrupt as exc:
        why = exc.args[0] if exc.args else "Ctrl-C"
        print(f"bench: interrupted ({why}); labs and load processes cleaned up",
              file=sys.stderr)
        return 130
    except LabUnavailable as exc:
        print(f"bench: the lab cannot run here: {exc}", file=sys.stderr)
        return 2
    finally:
        for s, h in old.items():
            with contextlib.suppress(Exception):
                signal.signal(s, h)
    res.total_seconds = time.monotonic() - log.start
    res.notes += [f"NOT met: {r.section}: {r.measure}: {r.result} (target {r.target})"
                  for r in res.targets if r.met is False]
    print(render_text(res))
    md, js = write_results(res, args.out)
    print(f"\nresults: {md}\n         {js}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
