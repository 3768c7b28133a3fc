"""The real-GPU check as far as a machine without a GPU allows: one clear line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.lxclab import Lab

SCRIPT = Path(__file__).resolve().parent.parent / "gpu" / "gpu_check.py"


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(),
                    reason="a real GPU is here: run make gpu-check")
def test_without_a_gpu_fails_with_one_clear_line() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: ")
    assert "GPU" in lines[0] or "root" in lines[0]


def test_help_lists_options() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                       check=True)
    for opt in ("--gpu", "--vmid", "--grace", "--deadline"):
        assert opt in r.stdout


def test_whole_check_against_the_fake_gpu(lab: Lab) -> None:
    """Every step of the GPU check (stand-in container with unshare and Proxmox cgroups, pct,
    holders in and outside, pveclean, NVML baseline) run here against the lab's fake GPU."""
    assert lab.nvml is not None
    r = subprocess.run([sys.executable, str(SCRIPT), "--fake-nvml", str(lab.nvml.lib_path),
                        "--devices", str(lab.root / "dev" / "nvidia0"), "--grace", "1",
                        "--deadline", "8", "--vmid", "999999128"],
                       capture_output=True, text=True, timeout=120, check=False, env=lab.env())
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {ln.split("  ")[1].strip(): ln.split("  ")[-1].strip()
            for ln in r.stdout.splitlines() if ln.startswith("  ")}
    assert rows["holders found / expected"] == "4 / 4"  # 3 workers + 1 forked child
    assert rows["outside holder alive"] == "True"
    assert rows["sources"] == "host, nvml, probe"
    assert rows["holders with NVML memory"] == "3"
    assert rows["pveclean wall s / verdict / exit"].endswith("/ clean / 0")
    assert rows["seconds until memory back to baseline"] != "never"
    assert r.stdout.rstrip().endswith("gpu-check: PASSED")


def test_release_calibration_runs_with_the_check_against_the_fake_gpu(lab: Lab) -> None:
    """issue 38: one command runs the check and the release calibration; against the fake
    driver, whose `release` keeps a killed holder's memory 0.4 s, every trial times the exit,
    NVML letting go and the memory coming back, in a table and JSON."""
    import json

    assert lab.nvml is not None
    out = lab.root / "release.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--fake-nvml", str(lab.nvml.lib_path),
                        "--devices", str(lab.root / "dev" / "nvidia0"), "--grace", "1",
                        "--deadline", "8", "--vmid", "999999127", "--release",
                        "--release-gib", "1", "--pinned-gib", "0", "8", "--runs", "1",
                        "--fake-release", "0.4", "--trial-timeout", "10",
                        "--release-json", str(out)],
                       capture_output=True, text=True, timeout=180, check=False, env=lab.env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpu-check: PASSED" in r.stdout  # the check ran first
    assert "pveclean release calibration on" in r.stdout
    assert "largest memory back:" in r.stdout and "release_seconds default" in r.stdout
    trials = json.loads(out.read_text())["trials"]
    assert [(t["case"], t["signal"]) for t in trials] == [
        ("1 GiB device + 0 GiB pinned", "SIGKILL"), ("1 GiB device + 0 GiB pinned", "SIGTERM"),
        ("1 GiB device + 8 GiB pinned", "SIGKILL"), ("1 GiB device + 8 GiB pinned", "SIGTERM")]
    for t in trials:
        assert t["skipped"] is None and t["exited_s"] is not None, t
        assert t["exited_s"] < 0.4 <= t["memory_back_s"] < 3, t  # the late release, measured
        assert t["unlisted_s"] is not None


def test_release_calibration_without_a_gpu_is_one_line() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT.parent / "release_check.py")],
                       capture_output=True, text=True, timeout=60, check=False,
                       env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/nonexistent"})
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("release-check: cannot run here: ")
