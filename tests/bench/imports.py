"""Start-up (issue 42): `python -X importtime` of each command's path (a dry run and every hook
phase on a container with nothing to clean, `--version`), the ten imports that cost it most
and whether a module it must not import came in (tests/importpaths.py, pinned by
tests/unit/test_import_paths.py). No lab: a stopped container's config in a temporary dir."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.importpaths import PATHS, import_times, run_path, stopped_ct, top_ten

from .settings import BenchConfig
from .table import Row, Table


def bench_imports(cfg: BenchConfig, log: Callable[[str], None]
                  ) -> tuple[list[Row], list[Table], dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="pveclean-imports-"))
    rows: list[Row] = []
    table = Table(f"Imports per path (python -X importtime, median of {cfg.hook_runs} runs "
                  "per module): the ten that cost most of their own time",
                  ["Path", "Modules", "Import time (sum of self)", "Top ten (self, ms)"])
    raw: dict[str, Any] = {}
    try:
        env = stopped_ct(root)
        for name, (argv, heavy) in PATHS.items():
            log(f"imports: {name} x {cfg.hook_runs}")
            mods = run_path(argv, env).modules
            imps = import_times(argv, env, cfg.hook_runs)
            total = sum(i.self_us for i in imps) / 1000
            top = top_ten(imps)
            table.rows.append([name, str(len(mods)), f"{total:.0f} ms", ", ".join(
                f"{i.module} {i.self_us / 1000:.1f}" for i in top)])
            bad = sorted(m for m in heavy if m in mods)
            rows.append(Row("Start-up", f"{name}: heavy modules it must not import",
                            ", ".join(bad) or "none", "none", not bad))
            raw[name] = {"modules": len(mods), "import_ms": total,
                         "top": [(i.module, i.self_us, i.cumulative_us) for i in top]}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table.notes.append("Import time under -X importtime is inflated by the profiler itself and "
                       "counts the imports of the workers a run forks; compare paths with each "
                       "other, not with the wall times above.")
    return rows, [table], raw
