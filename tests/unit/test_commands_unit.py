"""The systemd drop-in's unit phases: they never fail the unit but by a refusal."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from pveclean.errors import PvecleanError


def test_unit_phases_never_fail_the_unit_but_by_a_refusal(tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str],
                                                         ) -> None:
    from pveclean.commands import unit
    from pveclean.proxmox import dropin

    (tmp_path / "lxc").mkdir()
    cfgfile = tmp_path / "pveclean.yaml"
    cfgfile.write_text(f"pve_config_dir: {tmp_path / 'lxc'}\nstate_dir: {tmp_path / 's'}\n"
                       f"report_dir: {tmp_path / 'r'}\nsyslog: false\n")
    cfgfile.chmod(0o644)
    for argv in (["-c", str(cfgfile), "100", "start-pre"],  # no such container
                 ["-c", str(cfgfile), "100", "stop-post"],
                 ["-c", str(cfgfile), "100", "bogus"],
                 ["-c", str(cfgfile), "abc", "start-pre"],
                 ["-c", str(tmp_path / "missing.yaml"), "100", "start-pre"]):
        assert unit.from_argv(argv) == 0, argv
    out = capfd.readouterr()
    assert "Traceback" not in out.out + out.err
    assert len(out.out.splitlines()) == 5
    with pytest.raises(PvecleanError, match="cannot go into a systemd unit"):
        dropin.dropin_text(100, "/opt/my pveclean/bin/pveclean", None)
    text = dropin.dropin_text(100, "/usr/sbin/pveclean", None)
    assert "ExecStartPre=/bin/sh -c '/usr/sbin/pveclean unit 100 start-pre;" in text


@pytest.mark.parametrize(("script", "expect_rc", "warned"), [
    (None, 0, True),  # pveclean gone (a removed package, a venv whose Python went away)
    ("#!/nonexistent/python3\n", 0, True),  # its interpreter gone
    ("#!/bin/sh\nexit 1\n", 0, True),  # a crash
    ("#!/bin/sh\nkill -9 $$\n", 0, True),  # killed (OOM)
    ("#!/bin/sh\nexit 0\n", 0, False),
    ("#!/bin/sh\nexit 75\n", 75, False),  # the refuse decision, and only it, fails the unit
])
def test_dropin_start_pre_fails_the_unit_only_on_a_refusal(
        tmp_path: Path, script: str | None, expect_rc: int, warned: bool) -> None:
    """The ExecStartPre= line as systemd runs it ($$ is a literal $), with a pveclean that is
    missing, broken, killed, fine or refusing."""
    from pveclean.proxmox import dropin

    exe = tmp_path / "pveclean"
    if script is not None:
        exe.write_text(script)
        exe.chmod(0o755)
    line = dropin.dropin_text(100, str(exe), None).split("ExecStartPre=", 1)[1].splitlines()[0]
    argv = shlex.split(line.replace("$$", "$"))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    assert res.returncode == expect_rc, res
    assert ("WARNING: CT 100 start-pre" in res.stdout) == warned, res.stdout
