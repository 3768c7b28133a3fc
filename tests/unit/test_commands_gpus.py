"""commands/gpus.py's start: `pveclean gpus` hands its look to the run's worker, forked at
start-up (host/prelude.py) before typer, the config and the look's modules are imported; the
worker imports the scan's modules meanwhile, so the host's readers start before the command
has imported what it shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_gpus_forks_its_worker_before_the_heavy_imports_and_uses_it(tmp_path: Path) -> None:
    (tmp_path / "cgroup").mkdir()
    cfg = tmp_path / "pveclean.yaml"
    cfg.write_text(f"pve_config_dir: {tmp_path}\nsyslog: false\nreport_dir: {tmp_path}\n"
                   f"state_dir: {tmp_path}\ncgroup_root: {tmp_path / 'cgroup'}\n"
                   f"nvml_library: {tmp_path}/libnvidia-ml.so.1\nkmsg_path: {tmp_path}/kmsg\n")
    cfg.chmod(0o644)
    heavy = ("typer", "click", "yaml", "dataclasses", "pveclean.commands.cli",
             "pveclean.commands.gpulook", "pveclean.core.gpumap", "pveclean.host.hostscan")
    code = (
        "import os, sys; from pveclean.host import worker; seen = []; "
        "start = worker.Worker._start; worker.Worker._start = lambda self: "
        "(seen.append((os.getpid(), set(sys.modules))), start(self)); "
        "sys.argv[1:] = ['gpus', '--json']; "
        "from pveclean.__main__ import main; rc = main(); me = os.getpid(); "
        "mine = [mods for pid, mods in seen if pid == me]; "
        f"print(rc, len(mine), sorted(m for m in {heavy!r} if m in mine[0]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       check=False, env={**os.environ, "PVECLEAN_CONFIG": str(cfg)})
    # one worker forked by this process (the run's, early), with none of them imported yet
    assert r.stdout.splitlines()[-1] == "0 1 []", r
    assert '"host_processes": 0' in r.stdout, r
