"""Report bloat (issue 26): one container with 400 holders, each holding 64 GPU device paths
(BenchConfig.bloat_holders, bloat_paths) at ~3,800-character paths (bind mounts of the fake
GPU node, each held open), and a 6 s deadline. `pveclean ct --dry-run` and the pre-stop hook
must end within the deadline + 1 s, the report stay at most 1 MB and the hook's task log at
most 64 KB, also when the report cannot be saved (then it is kept whole in a spare file)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import start_in_ct

from .discovery import pveclean_exe
from .measure import HOOK_ENV, Spawned, VmidPool, new_lab, shielded, spawn_like_proxmox
from .settings import BenchConfig
from .table import Row, Table

DEADLINE_S = 6.0
TARGET_REPORT = 1_000_000  # bytes
TARGET_TASK_LOG = 64 << 10
TARGET_RSS_MB = 100.0
SPARE_DIR = Path("/run/pveclean/unsaved")  # host/reportfiles.py SPARE_DIR


def bench_report_bloat(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
                       ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab = new_lab()
    runs: dict[str, tuple[Spawned, int]] = {}
    spares: list[Path] = []
    holders, paths = cfg.bloat_holders, cfg.bloat_paths
    try:
        # no probe: its `ls -l` of 25,600 fds in the container would slow the host scan it
        # runs beside on a small machine, and the report's bounds are what is measured here
        lab.write_config(deadline_seconds=DEADLINE_S, grace_seconds=cfg.grace_s, probe=False)
        vmid = lab.create_ct(pool.take(), gpus=(0,))
        pids: list[int] = []

        def attack() -> None:  # (again, when a run stopped them)
            if len(pids) < holders or not all(lab.alive(p) for p in pids):
                w = start_in_ct(lab, vmid, "pathfan", ["--node", "/dev/nvidia0", "--paths",
                                                       str(paths), "--children",
                                                       str(holders - 1)])
                pids[:] = w.host_pids(lab)

        attack()
        lab.install_hook(vmid)
        env = {**HOOK_ENV, "PVECLEAN_CONFIG": str(lab.config_path)}
        hook = [str(lab.snippets / "pveclean-hook"), str(vmid), "pre-stop"]

        def report_size(phase: str) -> int:
            files = sorted(lab.report_dir.glob(f"{vmid}-{phase}-*.yaml"))
            return files[-1].stat().st_size if files else -1

        log(f"report bloat: {len(pids)} holders x {paths} paths in CT {vmid}: dry run")
        kept = lab.root / "dry-run.yaml"  # a dry run writes its report only where asked
        dry = spawn_like_proxmox([*pveclean_exe(), "ct", str(vmid), "--dry-run",
                                  "--report-file", str(kept)], lab.root, env)
        runs["ct --dry-run"] = (dry, kept.stat().st_size if kept.exists() else -1)
        log("report bloat: pre-stop hook")
        attack()
        pre = spawn_like_proxmox(hook, lab.root, env)
        runs["pre-stop hook"] = (pre, report_size("pre-stop"))
        log("report bloat: pre-stop hook, report dir not writable")
        blocker = lab.root / "not-a-dir"
        blocker.write_text("")
        lab.write_config(deadline_seconds=DEADLINE_S, grace_seconds=cfg.grace_s, probe=False,
                         report_dir=str(blocker / "reports"))
        before = set(SPARE_DIR.glob(f"{vmid}-*.yaml"))
        attack()
        unsaved = spawn_like_proxmox(hook, lab.root, env)
        spares = sorted(set(SPARE_DIR.glob(f"{vmid}-*.yaml")) - before)
        runs["pre-stop hook, unsaved"] = (unsaved, spares[-1].stat().st_size if spares else -1)
        left = sum(lab.alive(p) for p in pids)
    finally:
        with shielded():
            for p in spares:
                p.unlink(missing_ok=True)
            lab.destroy()
    limit = DEADLINE_S + 1
    rows: list[Row] = []
    for what, (run, size) in runs.items():
        rss = run.max_rss_kib * 1024 / 1e6
        out = len(run.output.encode())
        rows += [
            Row("Report bloat", f"{what}: wall time", f"{run.seconds:.2f} s",
                f"<= {limit:.0f} s (deadline + 1 s)", run.seconds <= limit),
            Row("Report bloat", f"{what}: peak RSS", f"{rss:.1f} MB",
                f"<= {TARGET_RSS_MB:.0f} MB", rss <= TARGET_RSS_MB),
            Row("Report bloat", f"{what}: report" + (" (spare file)" if "unsaved" in what
                                                     else ""),
                f"{size / 1e6:.3f} MB", "<= 1 MB", 0 <= size <= TARGET_REPORT),
        ]
        if what != "ct --dry-run":
            rows.append(Row("Report bloat", f"{what}: task log", f"{out / 1024:.1f} KiB",
                            "<= 64 KiB", out <= TARGET_TASK_LOG))
    table = Table(f"Report bloat: {holders} holders x {paths} device paths of ~3,800 "
                  f"characters, deadline {DEADLINE_S:.0f} s",
                  ["Run", "Exit", "Wall", "Peak RSS", "Report", "Output", "First line"],
                  [[what, str(run.returncode), f"{run.seconds:.2f} s",
                    f"{run.max_rss_kib * 1024 / 1e6:.1f} MB", f"{size} B",
                    f"{len(run.output.encode())} B",
                    (run.output.strip().splitlines() or ["-"])[0][:110]]
                   for what, (run, size) in runs.items()])
    table.notes += ["Peak RSS: ru_maxrss of pveclean's process tree from wait4(); 1 MB = 10^6 "
                    "bytes. Output: what the run wrote to stdout and stderr (for the hook: the "
                    "task log).",
                    "The probe is off (its `ls -l` of 25,600 fds would compete with the host "
                    "scan on a small machine).",
                    f"Holders alive after the runs: {left} of {len(pids)} (stopping them in "
                    "time is the scan's and the verification's, not the report's)."]
    raw = {what: {"seconds": run.seconds, "exit": run.returncode,
                  "max_rss_kib": run.max_rss_kib, "report_bytes": size,
                  "output_bytes": len(run.output.encode()), "output": run.output[-2000:]}
           for what, (run, size) in runs.items()}
    return rows, [table], raw
