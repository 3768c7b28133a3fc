"""The lean ways in (issue 16): `ct` with its common flags, `gpus [--json]` and `--version`
skip typer, and behave as the typer app does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.commands.ct import CtArgs, parse
from pveclean.errors import PvecleanError


def test_parse_takes_the_common_flags_in_any_order() -> None:
    assert parse(["129"]) == CtArgs("129")
    assert parse(["--json", "129", "--dry-run", "--grace", "1.5", "-c", "/x.yaml"]) == CtArgs(
        "129", dry_run=True, as_json=True, grace=1.5, config="/x.yaml")
    assert parse(["129", "--grace=0", "--config=/y", "--stop-units"]) == CtArgs(
        "129", grace=0.0, config="/y", stop_units=True)


@pytest.mark.parametrize("argv", [
    [], ["--help"], ["129", "--help"], ["129", "-h"], ["129", "130"], ["129", "--grace"],
    ["129", "--bogus"], ["129", "--grace", "1", "--grace", "2"], ["--dry-run"],
])
def test_parse_leaves_everything_else_to_typer(argv: list[str]) -> None:
    assert parse(argv) is None


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "3601", "x"])
def test_parse_refuses_a_grace_that_is_not_finite_seconds(value: str) -> None:
    with pytest.raises(PvecleanError):
        parse(["129", "--grace", value])


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)


def test_ct_and_version_never_import_typer() -> None:
    r = _run("import sys; from pveclean.__main__ import main; "
             "rc = main(['ct', '12x', '--dry-run']); v = main(['--version']); "
             "print(rc, v, 'typer' in sys.modules, 'click' in sys.modules)")
    out = r.stdout.splitlines()
    assert out[-1] == "2 0 False False", r
    assert out[0].startswith("pveclean "), r
    assert r.stderr.strip() == "pveclean: invalid VMID '12x': expected a number 100..999999999"


def test_gpus_never_imports_typer(tmp_path: Path) -> None:
    cfg = tmp_path / "pveclean.yaml"
    cfg.write_text(f"pve_config_dir: {tmp_path}/pve/lxc\n"
                   f"nvml_library: {tmp_path}/libnvidia-ml.so.1\n")
    r = _run(f"import os, sys; os.environ['PVECLEAN_CONFIG'] = {str(cfg)!r}; "
             "from pveclean.__main__ import main; rc = main(['gpus', '--json']); "
             "print(rc, 'typer' in sys.modules, 'click' in sys.modules)")
    out = r.stdout.splitlines()
    assert out[-1] == "0 False False", r
    data = json.loads("\n".join(out[:-1]))
    assert data["pveclean_gpus"] == 1 and data["sources"]["nvml"].startswith("unavailable")


@pytest.mark.parametrize("argv", [["gpus"], ["gpus", "--json"], ["config", "check"]])
def test_output_closed_early_exits_141_and_says_nothing(tmp_path: Path,
                                                        argv: list[str]) -> None:
    """`pveclean gpus | head -1`: a reader gone before the output is written is neither an
    internal error nor click's exit 1 (which is `residual` here)."""
    cfg = tmp_path / "pveclean.yaml"
    cfg.write_text(f"pve_config_dir: {tmp_path}/pve/lxc\n"
                   f"nvml_library: {tmp_path}/libnvidia-ml.so.1\n")
    r, w = os.pipe()
    os.close(r)  # every write to w now fails with EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "pveclean", *argv], stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                           env={**os.environ, "PVECLEAN_CONFIG": str(cfg)})
    finally:
        os.close(w)
    lines = [ln for ln in p.stderr.splitlines() if not ln.startswith("config OK")]
    assert (p.returncode, lines) == (141, []), p.stderr


@pytest.mark.parametrize(("argv", "needle"), [
    (["ct", "129", "--grace", "nan"], "nan"),  # typer's usage error, one line
    (["ct", "--help"], "Stop every GPU holder"),
    (["ct", "129", "--bogus"], "--bogus"),
])
def test_what_the_lean_parser_leaves_goes_through_typer(argv: list[str], needle: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pveclean", *argv], capture_output=True,
                       text=True, timeout=60, check=False)
    assert needle in r.stdout + r.stderr, r
    assert "Traceback" not in r.stderr
    assert r.returncode == (0 if "--help" in argv else 2), r


@pytest.mark.parametrize("argv,code", [
    (["ct", "999999", "--dry-run"], 3),  # 3: no such container, found after the fork
    (["hook", "999999", "pre-stop"], 0),  # a hook says so and exits 0
    (["hook", "999999", "post-stop"], 0),
])
def test_a_run_forks_its_worker_before_the_heavy_imports(tmp_path: Path, argv: list[str],
                                                         code: int) -> None:
    """prelude.py: the worker is forked before the run's own modules are imported, so that it
    imports nvidia-ml-py and the scan while the parent imports the run and reads the config;
    none of that, nor what a dry run does not use, is in the parent when it forks."""
    cfg = tmp_path / "pveclean.yaml"
    cfg.write_text(f"pve_config_dir: {tmp_path}\nsyslog: false\nreport_dir: {tmp_path}\n")
    cfg.chmod(0o644)
    heavy = (
        "yaml", "pynvml", "typing", "ctypes", "datetime", "subprocess", "shutil", "threading",
        "selectors", "pveclean.host.pidfds", "pveclean.host.lock", "pveclean.proxmox.pct",
        "pveclean.proxmox.probe", "pveclean.proxmox.guestunits", "dataclasses",
        "pveclean.cleanup", "pveclean.core.config", "pveclean.core.discovery",
        "pveclean.commands.hook", "pveclean.commands.ct",)
    r = subprocess.run(
        [sys.executable, "-c",
         "import sys; from pveclean.host import worker; seen = []; start = worker.Worker._start; "
         "worker.Worker._start = lambda self: (seen.append(set(sys.modules)), start(self)); "
         f"from pveclean.__main__ import main; rc = main({argv!r}); "
         f"print(rc, len(seen) > 0, sorted(m for m in {heavy!r} if m in seen[0]))"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PVECLEAN_CONFIG": str(cfg)})
    assert r.stdout.splitlines()[-1] == f"{code} True []", r


def test_nvml_s_worker_answers_without_the_run_s_modules() -> None:
    """prelude.py: NVML's worker, forked first, imports nvidia-ml-py and nvml.py only; its
    answers are plain tuples, so it never imports dataclasses or the model (the scan has its
    own worker). Its first answers come as soon as nvidia-ml-py is in."""
    r = subprocess.run(
        [sys.executable, "-c",
         "from pveclean.host import nvml, prelude; w = prelude.begin(); "
         "w.submit(nvml.w_warm, {'nvml_library': '/nonexistent/libnvidia-ml.so.1'}, True, "
         "timeout=5, what='init'); "
         "rows, err = w.call(nvml.w_memory, 1.0, timeout=10, what='memory'); "
         "mods = w.call(eval, 'sorted(__import__(\"sys\").modules)', timeout=5, what='mods'); "
         "print(rows, 'pynvml' in mods, sorted(m for m in mods if m in "
         "('dataclasses', 'pveclean.core.records', 'pveclean.core.discovery', "
         "'pveclean.host.procfs', 'yaml'))); "
         "w.close()"],
        capture_output=True, text=True, timeout=60, check=False)
    assert r.stdout.splitlines()[-1] == "None True []", r


@settings(max_examples=2000, deadline=None)
@given(st.floats(min_value=0, max_value=4102444799.999, allow_nan=False)
       | st.integers(0, 4102444799).map(lambda s: s + 0.0000005)
       | st.integers(0, 4102444799).map(lambda s: s + 0.9999995))
def test_report_times_are_what_datetime_writes(t: float) -> None:
    """report.py writes report names and times without importing datetime on every run."""
    import datetime as dt

    from pveclean.host import reportfiles

    when = dt.datetime.fromtimestamp(t, dt.UTC)
    assert reportfiles.utc_stamp(t) == when.strftime("%Y%m%dT%H%M%S.%fZ")
    assert reportfiles.iso(t) == when.isoformat(timespec="milliseconds")


@pytest.mark.parametrize("argv,code,out,err", [
    (["--version"], 0, "pveclean ", ""),
    (["ct", "12x"], 2, "", "pveclean: "),
])
def test_the_command_exits_with_main_s_code_and_its_output_flushed(
        argv: list[str], code: int, out: str, err: str) -> None:
    """entry() skips the interpreter's teardown (os._exit): what was written still arrives
    through a pipe, and the exit code is main()'s."""
    for cmd in ([sys.executable, "-m", "pveclean", *argv],
                [sys.executable, "-c", "import sys; from pveclean.__main__ import entry; "
                 f"sys.argv[1:] = {argv!r}; print('buffered', end=''); entry()"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == code, r
        assert r.stdout.removeprefix("buffered").startswith(out) and r.stderr.startswith(err), r
        assert "buffered" in r.stdout or cmd[1] == "-m"


def test_prune_keeps_the_newest_reports_and_no_old_one(tmp_path: Path) -> None:
    """report.prune stats only as far as the first young report (oldest first)."""
    import time

    from pveclean.host import reportfiles

    now = time.time()
    names = [reportfiles.report_name(129, "manual", now - 86400 * (10 - i)) for i in range(10)]
    for i, name in enumerate(names):  # one a day, the oldest ten days old
        (tmp_path / name).write_text("vmid: 129\n")
        os.utime(tmp_path / name, (now - 86400 * (10 - i),) * 2)
    (tmp_path / reportfiles.report_name(130, "manual", now - 86400 * 20)).write_text("vmid: 130\n")
    assert reportfiles.prune(str(tmp_path), 129, keep=8, max_age_days=7.5) == 3  # 2 over, 1 old
    assert [p.name for p in reportfiles.list_reports(str(tmp_path), 129)] == names[3:]
    assert reportfiles.prune(str(tmp_path), 129, keep=2, max_age_days=30) == 5
    assert [p.name for p in reportfiles.list_reports(str(tmp_path), 129)] == names[8:]
    assert len(reportfiles.list_reports(str(tmp_path))) == 3  # CT 130's is not 129's to prune
