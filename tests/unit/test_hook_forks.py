"""A pre-stop that records a clean shutdown, and every post-stop, write their report in the
run's scan worker, which is idle by then (cleanup.clean's `scan`), not in a worker forked for
it (issue 42: a fork and its page faults less in each hook of every container stop)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.importpaths import VMID, stopped_ct

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pveclean's commands need root")

_RUN = ("import sys; from pveclean.host import worker; forks = []; start = worker.Worker._start; "
        "worker.Worker._start = lambda self: (forks.append(1), start(self))[1]; "
        "from pveclean.__main__ import main; rc = main(sys.argv[1:]); "
        "print(); print(rc, len(forks))")


@pytest.mark.parametrize("phase", ["pre-stop", "post-stop"])
def test_the_stop_s_report_is_written_by_the_scan_s_worker(tmp_path: Path, phase: str) -> None:
    env = stopped_ct(tmp_path)
    r = subprocess.run([sys.executable, "-c", _RUN, "hook", str(VMID), phase],
                       capture_output=True, text=True, env=env, timeout=120, check=False,
                       stdin=subprocess.DEVNULL)
    # NVML's (forked first, see prelude.py) and the scan's, which then writes the report
    assert r.stdout.splitlines()[-1] == "0 2", r
    if phase == "pre-stop":
        assert "clean shutdown" in r.stdout and "report " in r.stdout, r
    reports = list((tmp_path / "reports").glob(f"{VMID}-{phase}-*"))
    assert len(reports) == 1, sorted(os.listdir(tmp_path / "reports"))
