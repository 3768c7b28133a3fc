"""What each command's path imports (issue 42): the paths, the heavy modules each must not
import, and a run of one path on a stopped container (nothing to clean) that reports its
modules. Used by tests/unit/test_import_paths.py (the pins) and `make bench` (the imports
section: `python -X importtime`, the top ten imports of each path)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

VMID = 999_998  # a container with a GPU in its config and no cgroup: nothing to clean

# Never on a run that cleans or looks at one container: the API client, `gpus`' map and
# renderer, the metrics exposition, the install commands.
_NOT_ONE_CT = (
    "proxmoxer", "requests", "urllib3", "pveclean.proxmox.pveapi",
    "pveclean.commands.gpus", "pveclean.commands.gpuview", "pveclean.core.gpumap",
    "pveclean.host.hostscan", "pveclean.core.metrics_gpus", "pveclean.core.exposition",
    "pveclean.commands.install", "pveclean.commands.installplan", "pveclean.commands.status",
)
# A hook comes through neither typer nor click, nor the dry run's renderer.
_NOT_HOOK = (*_NOT_ONE_CT, "typer", "click", "pveclean.commands.cli",
             "pveclean.commands.dryview", "pveclean.commands.render")

PATHS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    # name: (argv, modules the path must not import)
    "ct --dry-run": (["ct", str(VMID), "--dry-run"], (
        *_NOT_ONE_CT, "pveclean.host.lock", "pveclean.host.pidfds", "pveclean.host.reportfiles",
        "pveclean.host.notify", "pveclean.host.journal",
        "pveclean.proxmox.guestunits", "pveclean.core.reportread", "pveclean.core.amendments")),
    "hook pre-start": (["hook", str(VMID), "pre-start"], (*_NOT_HOOK, "pveclean.core.reportread",
                                                          "pveclean.core.amendments")),
    # post-start has no run (hook.HANDLERS): none of a run's modules, nor the Xid pass's
    "hook post-start": (["hook", str(VMID), "post-start"], (
        *_NOT_HOOK, "pveclean.cleanup", "pveclean.core.records", "pveclean.core.report",
        "pveclean.core.xidlog", "pveclean.host.kmsg", "pveclean.host.runreads")),
    "hook pre-stop": (["hook", str(VMID), "pre-stop"], _NOT_HOOK),
    "hook post-stop": (["hook", str(VMID), "post-stop"], _NOT_HOOK),
    "--version": (["--version"], ("yaml", "pynvml", "pveclean.cleanup", *_NOT_ONE_CT)),
    # pveclean-metrics.service's argv, every 30 s: neither typer nor click (__main__), nor a
    # run's report and cleanup, nor the API client
    "metrics (the timer)": (["metrics", "--textfile-dir", "{root}/textfile"], (
        "typer", "click", "pveclean.commands.cli", "pveclean.commands.conventions",
        "pveclean.core.report", "pveclean.core.reportparts", "pveclean.cleanup",
        "pveclean.host.pidfds", "pveclean.core.amendments", "proxmoxer", "requests",
        "pveclean.commands.install", "pveclean.commands.status", "pveclean.commands.gpuview")),
}
# What a path must import (its own work): a pin on a module it never imports would pass for ever.
USES: dict[str, tuple[str, ...]] = {
    **{name: ("pveclean.cleanup", "yaml") for name in PATHS if name.startswith(("ct", "hook"))},
    "hook post-start": ("pveclean.commands.hook", "pveclean.proxmox.chain", "yaml"),
    "metrics (the timer)": ("pveclean.commands.metrics", "pveclean.core.exposition", "yaml"),
}


def stopped_ct(root: Path) -> dict[str, str]:
    """A config and container VMID (stopped: no cgroup) under `root`; the env to run with."""
    (root / "pve").mkdir(parents=True, exist_ok=True)
    (root / "pve" / f"{VMID}.conf").write_text(
        "arch: amd64\nhostname: imports\nostype: unmanaged\n"
        f"rootfs: local:{VMID}/rootfs\ndev0: /dev/nvidia0\n")
    cfg = root / "pveclean.yaml"
    cfg.write_text(f"pve_config_dir: {root}/pve\nsyslog: false\nreport_dir: {root}/reports\n"
                   f"state_dir: {root}/state\nnvml_library: {root}/libnvidia-ml.so.1\n"
                   f"pct_command: /bin/false\nmetrics_path: {root}/pveclean.prom\n"
                   f"journal_socket: {root}/no-journal\n")
    cfg.chmod(0o644)
    return {**os.environ, "PVECLEAN_CONFIG": str(cfg)}


@dataclass(frozen=True)
class PathRun:
    code: int
    modules: frozenset[str]  # sys.modules of pveclean's own process at the end of main()
    stdout: str
    stderr: str


_RUN = ("import json, sys; from pveclean.__main__ import main; rc = main(sys.argv[1:]); "
        "sys.stdout.flush(); print('\\n' + json.dumps([rc, sorted(sys.modules)]))")


def argv_in(argv: list[str], env: dict[str, str]) -> list[str]:
    """`argv` with {root} made the stopped container's dir (stopped_ct)."""
    root = str(Path(env["PVECLEAN_CONFIG"]).parent)
    return [a.replace("{root}", root) for a in argv]


def run_path(argv: list[str], env: dict[str, str]) -> PathRun:
    r = subprocess.run([sys.executable, "-c", _RUN, *argv_in(argv, env)], capture_output=True,
                       text=True, env=env, timeout=120, check=False, stdin=subprocess.DEVNULL)
    out, _, last = r.stdout.rstrip("\n").rpartition("\n")
    try:
        rc, mods = json.loads(last)
    except ValueError as exc:
        raise RuntimeError(f"{argv}: no module list: {r}") from exc
    return PathRun(rc, frozenset(mods), out, r.stderr)


@dataclass(frozen=True)
class Imported:
    module: str
    self_us: int
    cumulative_us: int


def import_times(argv: list[str], env: dict[str, str], runs: int = 5) -> list[Imported]:
    """`python -X importtime` of whole runs of the path (pveclean's process and the workers
    it forks, whose imports after the fork are theirs): each module's median over `runs`, as
    one run on a busy machine is noise."""
    seen: dict[str, list[tuple[int, int]]] = {}
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "pveclean",
                            *argv_in(argv, env)],
                           capture_output=True, text=True, env=env, timeout=120, check=False,
                           stdin=subprocess.DEVNULL)
        for line in r.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            own, cum, name = line.removeprefix("import time:").split("|", 2)
            seen.setdefault(name.strip(), []).append((int(own), int(cum)))
    return [Imported(name, int(statistics.median(o for o, _ in t)),
                     int(statistics.median(c for _, c in t))) for name, t in seen.items()]


def top_ten(imports: list[Imported]) -> list[Imported]:
    """The ten imports that cost the most time of their own (a module's body: its class and
    dataclass definitions, its compiled patterns)."""
    return sorted(imports, key=lambda i: -i.self_us)[:10]
