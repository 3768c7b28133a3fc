"""One set of conventions over every command: -h and --help, help on stdout with exit 0,
usage errors on stderr with exit 2, JSON errors under --json, internal errors and a non-root
user on codes of their own, no screen control where a terminal cannot take it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer

from pveclean.commands import conventions, gpus
from pveclean.commands.cli import app, run_app
from pveclean.errors import ExitCode

COMMANDS = [[], ["ct"], ["hook"], ["unit"], ["vmhook"], ["install"], ["uninstall"], ["status"],
            ["gpus"], ["metrics"], ["reports"], ["config"], ["config", "check"], ["reset"]]


@pytest.fixture(autouse=True)
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A valid config for every command here, nothing of the host's own."""
    path = tmp_path / "pveclean.yaml"
    path.write_text(f"report_dir: {tmp_path / 'reports'}\nstate_dir: {tmp_path / 'state'}\n"
                    f"pve_config_dir: {tmp_path}\nsyslog: false\n")
    path.chmod(0o644)
    monkeypatch.setenv("PVECLEAN_CONFIG", str(path))
    return path


def pveclean(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command as admins run it: through the entry point (hook and unit skip typer)."""
    full = {**os.environ, **(env or {})}
    full.pop("INVOCATION_ID", None)  # by hand, not under systemd
    return subprocess.run([sys.executable, "-m", "pveclean", *args], capture_output=True,
                          text=True, timeout=60, check=False, env=full)


def test_the_table_covers_every_command() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    assert set(group.commands) == {c[0] for c in COMMANDS if c}


@pytest.mark.parametrize("flag", ["-h", "--help"])
@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "pveclean")
def test_help_on_stdout_exit_0(cmd: list[str], flag: str) -> None:
    r = pveclean(*cmd, flag)
    assert r.returncode == 0 and r.stderr == "", r
    assert r.stdout.startswith(f"Usage: pveclean {' '.join(cmd)}".rstrip()), r.stdout
    assert "\\[" not in r.stdout and "Example" in r.stdout, r.stdout


@pytest.mark.parametrize("cmd", [[], ["config"]], ids=["pveclean", "config"])
def test_a_group_alone_shows_its_help_on_stdout(cmd: list[str]) -> None:
    r = pveclean(*cmd)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("Usage:"), r


USAGE_ERRORS = [
    (["ct"], "Missing argument"),
    (["ct", "1", "--bogus"], "--bogus"),
    (["ct", "1", "--grace", "-1"], "--grace"),
    (["hook", "129"], "usage"),
    (["unit", "1"], "usage"),
    (["unit", "1", "stop-later"], "usage"),
    (["unit", "abc", "start-pre"], "abc"),
    (["install"], "--all"),
    (["install", "129", "--all"], "--all"),
    (["uninstall"], "--all"),
    (["status", "--bogus"], "--bogus"),
    (["metrics", "--bogus"], "--bogus"),
    (["gpus", "--watch", "nan"], "finite"),
    (["gpus", "--watch", "inf"], "--watch"),
    (["gpus", "--watch", "0"], "--watch"),
    (["gpus", "--count", "3"], "--count needs --watch"),
    (["gpus", "--watch", "1", "--count", "0"], "--count"),
    (["reports", "--verdict", "bogus"], "bogus"),
    (["reports", "--last", "0"], "--last"),
    (["reports", "1", "2"], "usage"),
    (["config", "check", "--bogus"], "--bogus"),
    (["config", "bogus"], "bogus"),
    (["bogus"], "bogus"),
]


@pytest.mark.parametrize(("args", "said"), USAGE_ERRORS, ids=lambda a: " ".join(a)
                         if isinstance(a, list) else "")
def test_usage_errors_one_line_on_stderr_exit_2(args: list[str], said: str) -> None:
    r = pveclean(*args)
    assert r.returncode == ExitCode.USAGE, r
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r
    assert said in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["reports", "--verdict", "bogus"], ["install"],
                                  ["ct", "x"], ["gpus", "--count", "2"], ["status", "--bogus"]],
                         ids=" ".join)
def test_errors_are_json_under_json(args: list[str]) -> None:
    r = pveclean(*args, "--json")
    assert r.returncode == ExitCode.USAGE, r
    said = json.loads(r.stdout)
    assert said["exit_code"] == ExitCode.USAGE and said["error"] in r.stderr, r


def test_install_and_uninstall_have_json_and_the_old_all_gpu_name() -> None:
    for cmd in (["install"], ["uninstall"]):
        assert "--json" in pveclean(*cmd, "-h").stdout
    r = pveclean("install", "-h")
    assert "--all " in r.stdout and "--all-gpu " not in r.stdout  # the old name is hidden
    r = pveclean("install", "129", "--all-gpu")  # but still accepted (as --all)
    assert r.returncode == 2 and "--all or --all-gpu-vms (one of them)" in r.stderr, r
    r = pveclean("install", "--all", "--all-gpu-vms")  # one kind of guest at a time
    assert r.returncode == 2 and "(one of them)" in r.stderr, r


def test_internal_error_has_its_own_documented_code(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    codes = [c for c in ExitCode if c != ExitCode.INTERNAL]
    assert ExitCode.INTERNAL not in codes and ExitCode.INTERNAL != ExitCode.ACCESS
    assert f"{int(ExitCode.INTERNAL)} internal error" in conventions.EXIT_CODES_HELP
    from pveclean.commands import ct

    def boom(*_a: object) -> int:
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(ct, "run", boom)
    assert run_app(["ct", "1", "--json"]) == ExitCode.INTERNAL
    out, err = capfd.readouterr()
    assert err == "pveclean: internal error: ZeroDivisionError: bug\n"
    assert json.loads(out)["exit_code"] == ExitCode.INTERNAL


@pytest.mark.parametrize("args", [["ct", "129"], ["ct", "129", "--dry-run"], ["gpus"],
                                  ["status"], ["reports"], ["metrics"], ["install", "129"],
                                  ["uninstall", "129"], ["hook", "129", "pre-stop"],
                                  ["unit", "129", "start-pre"]],
                         ids=" ".join)
def test_a_user_other_than_root_gets_one_line(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        args: list[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert run_app(args) == ExitCode.NOT_ROOT
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and "must be run as root" in err, err


def test_config_check_needs_no_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    (tmp_path / "c.yaml").write_text("grace_seconds: 3\n")
    assert run_app(["config", "check", str(tmp_path / "c.yaml")]) == 0, capfd.readouterr()


def test_no_screen_control_unless_a_terminal_that_takes_it() -> None:
    main, other = os.openpty()
    try:
        with os.fdopen(other, "w", closefd=False) as tty:
            assert gpus.screen_control(tty, {"TERM": "xterm-256color"})
            assert not gpus.screen_control(tty, {"TERM": "dumb"})
            assert not gpus.screen_control(tty, {})
    finally:
        os.close(main)
        os.close(other)
    with open(os.devnull, "w") as null:
        assert not gpus.screen_control(null, {"TERM": "xterm"})


def test_completion_offers_vmids_and_phases(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    for name in ("129.conf", "130.conf", "1290.conf", "notes.txt"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(conventions, "PVE_LXC", str(tmp_path))
    assert conventions.complete_vmids("129") == ["129", "1290"]
    assert conventions.complete_vmids("") == ["129", "130", "1290"]
    r = pveclean(env={"_PVECLEAN_COMPLETE": "complete_bash", "COMP_WORDS": "pveclean hook 1 p",
                      "COMP_CWORD": "3"})
    assert r.stdout.split() == ["pre-start", "post-start", "pre-stop", "post-stop"], r
