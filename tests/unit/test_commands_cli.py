"""The command line's validation of options: one line and exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "NaN"])
def test_grace_must_be_finite(value: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pveclean", "ct", "1", "--grace", value],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--grace" in r.stderr and "Traceback" not in r.stderr
