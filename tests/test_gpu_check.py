"""The real-GPU check as far as a machine without a GPU allows: one clear line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "gpu" / "gpu_check.py"


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
