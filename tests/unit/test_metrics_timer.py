"""`pveclean metrics --textfile-dir DIR`, pveclean-metrics.service's argv, skips typer
(__main__.timer_argv, issue 42) and answers as the typer command does: the same file, the same
exit codes, the same one-line errors. Any other form of the command goes through typer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pveclean.__main__ import timer_argv
from tests.importpaths import stopped_ct

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pveclean's commands need root")

_RUN = ("import sys; from pveclean.__main__ import main; rc = main(sys.argv[1:]); "
        "print('typer' in sys.modules); sys.exit(rc)")


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, bool, str]:
    r = subprocess.run([sys.executable, "-c", _RUN, *argv], capture_output=True, text=True,
                       env=env, timeout=120, check=False, stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout.strip().endswith("True"), r.stderr


def test_only_the_units_argv_skips_typer() -> None:
    assert timer_argv(["metrics", "--textfile-dir", "/var/lib/prometheus/node-exporter"])
    for argv in (["metrics"], ["metrics", "--textfile-dir=/d"], ["metrics", "--textfile-dir"],
                 ["metrics", "--textfile-dir", "-h"], ["metrics", "--textfile-dir", ""],
                 ["metrics", "--textfile-dir", "/d", "-c", "/c"], ["gpus", "--textfile-dir", "/d"]):
        assert not timer_argv(argv), argv


def test_the_timer_s_run_writes_what_typer_s_writes(tmp_path: Path) -> None:
    env = stopped_ct(tmp_path)
    lean, typed = tmp_path / "lean", tmp_path / "typed"
    assert _run(["metrics", "--textfile-dir", str(lean)], env)[:2] == (0, False)
    assert _run(["metrics", f"--textfile-dir={typed}"], env)[:2] == (0, True)

    def families(d: Path) -> list[str]:
        return sorted({line.split("{")[0].split(" ")[0] for line in
                       (d / "pveclean_gpus.prom").read_text().splitlines()})

    assert "pveclean_gpus_up" in families(lean)
    assert families(lean) == families(typed)
    assert (lean / "pveclean_doctor.prom").is_file()


def test_a_config_error_is_one_line_and_exit_2_as_under_typer(tmp_path: Path) -> None:
    env = stopped_ct(tmp_path)
    Path(env["PVECLEAN_CONFIG"]).write_text("deadline_seconds: banana\n")
    d = tmp_path / "textfile"
    lean = _run(["metrics", "--textfile-dir", str(d)], env)
    typed = _run(["metrics", f"--textfile-dir={d}"], env)
    assert lean[0] == typed[0] == 2
    assert lean[2] == typed[2] and lean[2].startswith("pveclean: ") and lean[2].count("\n") == 1
    assert not d.exists()


def test_the_run_loads_nvml_in_one_worker_for_the_map_and_doctor(tmp_path: Path) -> None:
    """One NVML session a run: doctor's look (pveclean_doctor.prom) runs in the worker that
    took the map, which has the library loaded and NVML initialised, not in a second worker
    that loads and inits it again (seconds on a host without nvidia-persistenced)."""
    env = stopped_ct(tmp_path)
    code = ("import sys; from pveclean.host import worker; made = []; "
            "init = worker.Worker.__init__; worker.Worker.__init__ = lambda self, *a, **k: "
            "(made.append(sorted(k)), init(self, *a, **k))[1]; "
            "from pveclean.__main__ import main; "
            "rc = main(sys.argv[1:]); print(rc, sum('nvml_library' in m for m in made))")
    r = subprocess.run([sys.executable, "-c", code, "metrics", "--textfile-dir",
                        str(tmp_path / "textfile")], capture_output=True, text=True, env=env,
                       timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert r.stdout.split()[-2:] == ["0", "1"], r
    assert "pveclean_doctor_up 1" in (tmp_path / "textfile" / "pveclean_doctor.prom").read_text()
