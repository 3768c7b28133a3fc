"""commands/hook without a lab: the hookscript shim and the hook entry point (a broken pveclean,
interpreter or config never blocks a container; failures are one warning line and exit 0), and
the GPUs the hook reads from a container's config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pveclean.commands.hook import _container_minors
from pveclean.commands.hook import main as hook_main
from pveclean.core.config import parse
from pveclean.errors import ExitCode
from pveclean.host.prelude import NvmlWorker
from pveclean.proxmox import pveconf
from pveclean.proxmox.hookscript import stamp
from tests.harness.lxclab import REPO

HOOK_ENV = {"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"}


def shim_with(tmp_path: Path, bin_text: str | None, config: str | None = None) -> Path:
    """The hookscript stamped with a stand-in pveclean whose body is `bin_text`."""
    fake = tmp_path / "pveclean"
    if bin_text is not None:
        fake.write_text(bin_text)
        fake.chmod(0o755)
    script = tmp_path / "pveclean-hook"
    script.write_text(stamp((REPO / "hookscripts/pveclean-hook").read_text(), str(fake), config))
    script.chmod(0o755)
    return script


def run_shim(script: Path, vmid: str, phase: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(script), vmid, phase], capture_output=True, text=True,
                          env=env or HOOK_ENV, stdin=subprocess.DEVNULL, check=False, timeout=30)


@pytest.mark.parametrize("body, says", [
    ("#!/nonexistent/python3.11\n", "its interpreter /nonexistent/python3.11 is missing"),
    ("#! /nonexistent/python3 -s\n", "its interpreter /nonexistent/python3 is missing"),
    ("#!/bin/sh\nexec /nonexistent/python3 -m pveclean\n", "could not be run (exit 127"),
    ("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\nexit 1\n", "failed (exit 1)"),
    ("#!/bin/sh\nkill -9 $$\n", "killed by signal 9"),  # the OOM killer
    ("#!/bin/sh\nexit 2\n", "failed (exit 2)"),
])
@pytest.mark.parametrize("phase", ["pre-start", "pre-stop", "post-stop"])
def test_shim_turns_every_failure_into_one_warning(tmp_path: Path, body: str, says: str,
                                                   phase: str) -> None:
    res = run_shim(shim_with(tmp_path, body), "129", phase)
    assert res.returncode == 0
    warnings = [ln for ln in res.stdout.splitlines() if ln.startswith("pveclean-hook:")]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and says in warnings[0], res.stdout
    if "interpreter" in says:  # nothing else in the task log
        assert res.stdout.count("\n") == 1 and res.stderr == ""


def test_shim_fails_pre_start_only_on_the_refuse_code(tmp_path: Path) -> None:
    script = shim_with(tmp_path, f"#!/bin/sh\necho refusing\nexit {ExitCode.REFUSE}\n")
    res = run_shim(script, "129", "pre-start")
    assert res.returncode == ExitCode.REFUSE and res.stdout == "refusing\n"
    for phase in ("pre-stop", "post-stop", "post-start"):
        assert run_shim(script, "129", phase).returncode == 0


def test_an_exported_config_does_not_reach_an_unstamped_hook(tmp_path: Path) -> None:
    """Proxmox hands the caller's environment on: a shell stop and a GUI stop must agree."""
    body = '#!/bin/sh\necho "config=${PVECLEAN_CONFIG-unset}"\n'
    env = {**HOOK_ENV, "PVECLEAN_CONFIG": "/root/experiment.yaml"}
    assert run_shim(shim_with(tmp_path, body), "129", "pre-stop", env).stdout == "config=unset\n"
    stamped = shim_with(tmp_path, body, "/etc/pveclean/site.yaml")
    assert run_shim(stamped, "129", "pre-stop", env).stdout == \
        "config=/etc/pveclean/site.yaml\n"


@pytest.mark.parametrize("vmid", ["1²9", "١٢٩", "１２９", "12 9", ""])
def test_hook_vmid_is_ascii_digits_only(vmid: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert hook_main([vmid, "pre-start"], NvmlWorker()) == ExitCode.USAGE
    out = capsys.readouterr().err
    assert out.startswith("pveclean: invalid VMID") and out.count("\n") == 1


def test_hook_main_never_raises(monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    import pveclean.commands.hook as hook

    def boom(*_a: object) -> object:
        raise MemoryError("no memory")

    monkeypatch.setattr(hook, "load", boom)
    assert hook_main(["129", "pre-start"], NvmlWorker()) == 0
    assert "internal error: MemoryError: no memory" in capsys.readouterr().out

    def chain_breaks(*_a: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(hook, "load", lambda: parse("phases: {pre-start: false}\n"))
    monkeypatch.setattr(hook.chain, "run_chained", chain_breaks)
    assert hook_main(["129", "pre-start"], NvmlWorker()) == 0
    assert "chained hookscript not run: PermissionError" in capsys.readouterr().out


@pytest.mark.parametrize("argv,code", [
    (["ct", "129", "--dry-run"], None),  # whatever guarded() gives an internal error
    (["hook", "129", "pre-stop"], 0),
    (["hook", "129", "post-stop"], 0),
])
def test_a_fork_that_fails_is_one_line_and_no_leaked_fd(tmp_path: Path, argv: list[str],
                                                         code: int | None) -> None:
    """__main__ forks the run's worker before any command's error handling (prelude.py): out of
    processes, that is still one line, never a traceback, a hook still exits 0, and the
    worker's pipes are closed again."""

    cfg = tmp_path / "pveclean.yaml"
    cfg.write_text(f"pve_config_dir: {tmp_path}\nsyslog: false\nreport_dir: {tmp_path}\n")
    cfg.chmod(0o644)
    code_text = (
        "import os\n"
        "def nofork(): raise BlockingIOError(11, 'Resource temporarily unavailable')\n"
        "os.fork = nofork\n"
        "from pveclean.__main__ import main\n"
        "before = set(os.listdir('/proc/self/fd'))\n"
        f"rc = main({argv!r})\n"
        "leaked = set(os.listdir('/proc/self/fd')) - before\n"
        "print('RESULT', rc, sorted(leaked))\n"
    )
    r = subprocess.run([sys.executable, "-c", code_text], capture_output=True, text=True,
                       timeout=60, check=False, env={**os.environ, "PVECLEAN_CONFIG": str(cfg)})
    out = r.stdout.splitlines()
    result = out[-1].split(" ", 2)
    said = [ln for ln in out[:-1] + r.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr and r.returncode == 0, r
    assert result[0] == "RESULT" and result[2] == "[]", r
    if code is not None:
        assert int(result[1]) == code
    else:
        assert int(result[1]) != 0
    assert len(said) == 1 and "Resource temporarily unavailable" in said[0], said


def test_hookscript_without_pveclean_warns_and_succeeds(tmp_path: Path) -> None:
    script = tmp_path / "pveclean-hook"
    text = (REPO / "hookscripts/pveclean-hook").read_text()
    script.write_text(text.replace('PVECLEAN_BIN=""', f'PVECLEAN_BIN="{tmp_path}/missing"'))
    script.chmod(0o755)
    res = subprocess.run([str(script), "129", "pre-start"], capture_output=True, text=True,
                         env={"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"},
                         check=False)
    assert res.returncode == 0 and "pveclean not found" in res.stdout


def test_hook_parser_sees_every_gpu_of_the_container(tmp_path: Path) -> None:
    (tmp_path / "lxc").mkdir()
    (tmp_path / "lxc/100.conf").write_text(
        "dev0: /dev/nvidia0,gid=44\ndev1: mode=0666,path=/dev/nvidia1\n"
        "lxc.cgroup2.devices.allow = c 195:* rwm\n"
        "lxc.mount.entry = /dev/nvidia2 dev/nvidia2 none bind,optional,create=file\n")
    c = pveconf.read_config(str(tmp_path / "lxc"), 100)
    assert _container_minors(c) == {0, 1, 2}
    assert ("lxc.cgroup2.devices.allow", "c 195:* rwm") in c.lines
    assert len(c.gpu_lines()) == 4
