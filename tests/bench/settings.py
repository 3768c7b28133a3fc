"""Sizes and repetitions of one bench run; `quick()` is the tiny run the smoke test uses."""

from __future__ import annotations

from dataclasses import dataclass

ALL_METHODS = ("pveclean", "host-fuser", "ct-fuser-busybox", "ct-fuser-psmisc", "ct-ps-busybox",
               "ct-ps-procps")


@dataclass(frozen=True)
class BenchConfig:
    # discovery: host load levels (0 = the machine as it is), fds per load process, and the
    # container: `ct_procs` processes in its cgroup tree (init included), `ct_holders` of
    # them holding GPU nodes
    host_loads: tuple[int, ...] = (0, 1000, 5000)
    fds: int = 20
    ct_procs: int = 50
    ct_holders: int = 10
    runs: int = 11  # timed runs per tool and level (after one warm-up); the median is reported
    # gpus: host load levels in the host's own cgroups (the last one then moved into a
    # container without GPUs); the second is where the peak memory of each command is read
    gpus_loads: tuple[int, ...] = (0, 5000, 20000)
    # growth: container size with `ct_holders` holders, then holders with `growth_others`
    # non-holders beside them
    growth_procs: tuple[int, ...] = (50, 200, 500)
    growth_holders: tuple[int, ...] = (10, 50, 200)
    growth_others: int = 40
    # whole cleanup: fresh seeds' situation per run
    cleanup_runs: int = 7  # pveclean runs (the median wall time is reported)
    recipe_runs: int = 1  # runs per one-liner recipe: its wall time is mostly its `sleep`
    recipe_sleep: float = 5.0  # the seeds' recipe: fuser -k ...; sleep 5; check memory
    term_delay_ms: int = 300  # holders exit this long after SIGTERM (the nccl-helper ignores it)
    grace_s: float = 1.0  # pveclean's SIGTERM -> SIGKILL grace in the cleanup runs
    methods: tuple[str, ...] = ALL_METHODS
    # the metrics timer: idle load processes on the host (issue 42: 1 % of one core at 30 s
    # with 20,000 host processes)
    metrics_load: int = 20000
    # hook overhead
    hook_runs: int = 10
    # Proxmox's pct is Perl that compiles the PVE stack at every call: each pct call made by
    # pveclean (the probe) sleeps this long first. Rows say which latency they ran with.
    pct_latency_s: float = 0.5
    # report bloat: holders in one container, each holding this many long GPU device paths
    bloat_holders: int = 400
    bloat_paths: int = 64


def quick() -> BenchConfig:
    """Every code path once, with tiny sizes (seconds of load, not minutes)."""
    return BenchConfig(host_loads=(0, 20), ct_procs=8, ct_holders=2, runs=1,
                       growth_procs=(8, 12, 16), growth_holders=(2, 4, 6), growth_others=3,
                       cleanup_runs=1, recipe_sleep=0.1, hook_runs=1, metrics_load=20,
                       bloat_holders=20, bloat_paths=16)
