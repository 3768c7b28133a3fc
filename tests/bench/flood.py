"""A hostile container's probe flood (issue 12): its /bin/sh answers `pct exec` with 512 MB of
`fd 1 /dev/nvidia0` lines while two holders the host sees keep the GPU. `pveclean ct` must end
within its deadline, with a small peak RSS and a small report, and stop those holders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .discovery import pveclean_exe
from .measure import HOOK_ENV, VmidPool, new_lab, shielded, spawn_like_proxmox
from .settings import BenchConfig
from .table import Row, Table

FLOOD_BYTES = 512 * 2**20
TARGET_RSS_MB = 100.0
TARGET_REPORT_MB = 1.0
DEADLINE_S = 10.0


def bench_flood(pool: VmidPool, cfg: BenchConfig, log: Callable[[str], None]
                ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    lab = new_lab()
    try:
        lab.write_config(deadline_seconds=DEADLINE_S, grace_seconds=cfg.grace_s)
        vmid = lab.create_ct(pool.take(), gpus=(0,))
        holders = [p for _ in range(2)
                   for p in lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"]).host_pids(lab)]
        sh = lab.rootfs(vmid) / "bin/sh"
        sh.unlink()
        sh.write_text("#!/bin/busybox sh\n/bin/busybox yes 'fd 1 /dev/nvidia0' | "
                      f"/bin/busybox head -c {FLOOD_BYTES}\n")
        sh.chmod(0o755)
        log(f"flood: pveclean ct {vmid} against a {FLOOD_BYTES >> 20} MB probe flood")
        env = {**HOOK_ENV, "PVECLEAN_CONFIG": str(lab.config_path)}
        run = spawn_like_proxmox([*pveclean_exe(), "ct", str(vmid)], lab.root, env)
        reports = sorted(lab.report_dir.glob(f"{vmid}-*.yaml"))
        size = max((p.stat().st_size for p in reports), default=-1)
        left = [p for p in holders if lab.alive(p)]
        probe = next((ln for ln in run.output.splitlines() if "probe" in ln), "")
    finally:
        with shielded():
            lab.destroy()
    rss_mb = run.max_rss_kib * 1024 / 1e6
    rows = [
        Row("Cleanup", "probe flood 512 MB: wall time", f"{run.seconds:.2f} s",
            f"< {DEADLINE_S:.0f} s (deadline)", run.seconds < DEADLINE_S),
        Row("Cleanup", "probe flood 512 MB: peak RSS", f"{rss_mb:.1f} MB",
            f"<= {TARGET_RSS_MB:.0f} MB", rss_mb <= TARGET_RSS_MB),
        Row("Cleanup", "probe flood 512 MB: report size", f"{size / 1e6:.3f} MB",
            f"<= {TARGET_REPORT_MB:.0f} MB", 0 <= size <= TARGET_REPORT_MB * 1e6),
        Row("Cleanup", "probe flood 512 MB: host-visible holders left",
            f"{len(left)} of {len(holders)}", "0", not left and run.returncode == 0),
    ]
    table = Table("Probe flood: the container's /bin/sh prints 512 MB for pct exec",
                  ["Exit", "Wall", "Peak RSS", "Report", "Holders left", "Output"],
                  [[str(run.returncode), f"{run.seconds:.2f} s", f"{rss_mb:.1f} MB",
                    f"{size} B", f"{len(left)} of {len(holders)}",
                    (probe or (run.output.strip().splitlines() or ["-"])[0])[:110]]])
    table.notes.append("Peak RSS: ru_maxrss of pveclean's process tree from wait4() (pveclean, "
                       "the pct stand-in and what it reaps); 1 MB = 10^6 bytes.")
    return rows, [table], {"seconds": run.seconds, "exit": run.returncode,
                           "max_rss_kib": run.max_rss_kib, "report_bytes": size,
                           "holders_left": left, "output": run.output[-2000:]}
