"""The entry point (__main__): the run's NVML worker is forked before the heavy imports, and
lean; the typer app says every usage error in one line with exit 2; the exit code is main()'s,
with the output flushed, and 141 for a stdout closed early."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


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
    (["ct", "129", "--grace", "nan"], "nan is not a finite number"),
    (["ct", "129", "--grace", "inf"], "inf is not in the range 0<=x<=3600"),
    (["ct", "129", "--grace", "-1"], "0<=x<=3600"),
    (["ct", "129", "--grace", "3601"], "0<=x<=3600"),
    (["ct", "129", "--grace", "x"], "'x' is not a valid float"),
    (["ct", "129", "--grace"], "requires an argument"),
    (["ct", "129", "--grace", "1", "--bogus"], "--bogus"),
    (["ct", "129", "130"], "unexpected extra argument"),
    (["ct", "--dry-run"], "Missing argument 'VMID'"),
])
def test_a_usage_error_is_one_line_and_exit_2(argv: list[str], needle: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pveclean", *argv], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 2, r
    assert r.stdout == "" and r.stderr.startswith("pveclean: ") and r.stderr.count("\n") == 1, r
    assert needle in r.stderr and r.stderr.endswith(" -h')\n"), r


def test_help_goes_to_stdout() -> None:
    r = subprocess.run([sys.executable, "-m", "pveclean", "ct", "--help"], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0 and "Stop every GPU holder" in r.stdout and r.stderr == "", r


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
         "from pveclean.host import nvml, prelude; w = prelude.NvmlWorker(early=True).worker; "
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


@pytest.mark.parametrize(("raised", "code", "said"), [
    (KeyboardInterrupt(), 130, "pveclean: interrupted\n"),
    (BrokenPipeError(32, "Broken pipe"), 141, ""),
    (RuntimeError("boom"), 70, "pveclean: internal error: RuntimeError: boom\n"),
])
def test_the_typer_app_maps_errors_through_guarded(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        raised: BaseException, code: int, said: str) -> None:
    """A Ctrl-C or a closed stdout inside a command is said as guarded() says it (click would
    answer the one with a silent 130, the other with exit 1, which is `residual` here)."""
    from pveclean.commands import ct
    from pveclean.commands.cli import run_app

    def boom(*_a: object) -> int:
        raise raised

    monkeypatch.setattr(ct, "run", boom)
    saved = os.dup(1)  # guarded() points a broken stdout at /dev/null
    try:
        assert run_app(["ct", "129"]) == code
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert capfd.readouterr().err == said


def test_the_nvml_worker_forks_early_only_when_asked(tmp_path: Path) -> None:
    from pveclean.core.config import Config
    from pveclean.host.prelude import NvmlWorker, forks_early

    assert [forks_early(a) for a in (["ct", "129"], ["hook", "129", "pre-stop"],
                                     ["hook", "129", "post-stop"], ["hook", "129", "pre-start"],
                                     ["unit", "129", "stop-post"], ["gpus"], [])] == [
        True, True, True, False, False, True, False]
    cfg = Config(cgroup_root=str(tmp_path), nvml_library="/nonexistent/libnvidia-ml.so.1")
    with NvmlWorker() as lazy:
        w = lazy.warm(cfg, 129)
        assert (w.pid, w.started, w.init["nvml_library"]) == (None, 0, cfg.nvml_library)
    with NvmlWorker(early=True) as early:
        assert early.worker.pid is not None
        w = early.warm(cfg, 129)  # and its init is under way: one fork, no other
        assert (w.started, w.init["nvml_library"]) == (1, cfg.nvml_library)
    assert early.worker.pid is None  # closed at the exit


def test_an_early_fork_that_failed_is_tried_again_in_warm(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    """Out of processes before the command's error handling: nothing said yet; the command
    says it, in its own one line, when warm() forks again."""
    from pveclean.core.config import Config
    from pveclean.host.prelude import NvmlWorker

    def nofork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", nofork)
    nvml = NvmlWorker(early=True)
    assert nvml.worker.pid is None
    with pytest.raises(BlockingIOError):
        nvml.warm(Config(cgroup_root=str(tmp_path)), 129)
    nvml.close()
