"""proxmox/dropin: the systemd drop-in's text (paths systemd would interpret refused), its files,
and its ExecStartPre= line as systemd runs it: it fails the unit only on a refusal."""

from __future__ import annotations

import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from pveclean.core.config import Config
from pveclean.errors import ExitCode, PvecleanError
from pveclean.proxmox import dropin


def test_the_dropin_runs_pveclean_around_every_start_and_stop() -> None:
    text = dropin.dropin_text(129, "/usr/sbin/pveclean", None)
    lines = text.splitlines()
    assert lines[0].startswith(dropin.MARKER + ": written by 'pveclean install --systemd'")
    assert "[Service]" in lines
    (pre,) = [ln for ln in lines if ln.startswith("ExecStartPre=")]
    (post,) = [ln for ln in lines if ln.startswith("ExecStopPost=")]
    assert pre == "ExecStartPre=" + dropin.start_pre_command(129, "/usr/sbin/pveclean", "")
    assert post == "ExecStopPost=-/usr/sbin/pveclean unit 129 stop-post"
    assert text.endswith("\n")


def test_a_config_file_goes_into_both_commands() -> None:
    text = dropin.dropin_text(129, "/opt/pc/bin/pveclean", "/etc/pveclean/site.yaml")
    assert "/opt/pc/bin/pveclean unit -c /etc/pveclean/site.yaml 129 start-pre;" in text
    assert "ExecStopPost=-/opt/pc/bin/pveclean unit -c /etc/pveclean/site.yaml 129 stop-post" \
        in text


def test_start_pre_fails_only_on_the_refuse_code_with_systemds_dollars() -> None:
    cmd = dropin.start_pre_command(129, "/usr/sbin/pveclean", "")
    assert cmd.startswith("/bin/sh -c '/usr/sbin/pveclean unit 129 start-pre; rc=$$?; ")
    assert f"[ $$rc = 0 ] || [ $$rc = {int(ExitCode.REFUSE)} ] ||" in cmd
    assert cmd.endswith("exit $$rc'")
    assert cmd.count("'") == 2  # one single-quoted sh program
    assert "$" not in cmd.replace("$$", "")  # every $ is systemd's escaped one


@pytest.mark.parametrize("bad", list(" \t\n\"'\\$%;`"))
@pytest.mark.parametrize("where", ["bin", "config"])
def test_paths_systemd_or_sh_would_interpret_are_refused(bad: str, where: str) -> None:
    path = f"/opt/x{bad}y/pveclean"
    with pytest.raises(PvecleanError, match="cannot go into a systemd unit") as exc:
        if where == "bin":
            dropin.dropin_text(129, path, None)
        else:
            dropin.dropin_text(129, "/usr/sbin/pveclean", path)
    assert exc.value.exit_code == ExitCode.USAGE


def test_paths_and_names(tmp_path: Path) -> None:
    cfg = Config(systemd_dir=str(tmp_path))
    assert dropin.dropin_path(cfg, 129) == tmp_path / "pve-container@129.service.d/pveclean.conf"


def test_installed_lists_only_our_dropins(tmp_path: Path) -> None:
    cfg = Config(systemd_dir=str(tmp_path))
    for vmid in (300, 129):
        dropin.write_file(dropin.dropin_path(cfg, vmid), dropin.dropin_text(vmid, "/p", None))
    other = tmp_path / "pve-container@200.service.d"
    other.mkdir()
    (other / "pveclean.conf").write_text("[Service]\nExecStartPre=/bin/true\n")  # not ours
    (other / "override.conf").write_text(dropin.MARKER)  # ours in text, not in name
    weird = tmp_path / "pve-container@abc.service.d"
    weird.mkdir()
    (weird / "pveclean.conf").write_text(dropin.MARKER)
    assert dropin.installed(cfg) == [129, 300]
    assert dropin.is_ours(dropin.dropin_path(cfg, 129))
    assert not dropin.is_ours(other / "pveclean.conf")
    assert not dropin.is_ours(tmp_path / "missing.conf")


def test_installed_without_the_directory(tmp_path: Path) -> None:
    assert dropin.installed(Config(systemd_dir=str(tmp_path / "nope"))) == []


def test_write_file_creates_the_directory_with_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "a/b/pveclean.conf"
    dropin.write_file(path, "one\n")
    assert path.read_text() == "one\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    dropin.write_file(path, "two\n", mode=0o750)
    assert path.read_text() == "two\n" and stat.S_IMODE(path.stat().st_mode) == 0o750
    assert sorted(p.name for p in path.parent.iterdir()) == ["pveclean.conf"]  # no temp left


def test_write_file_replaces_a_symlink_never_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "pveclean.conf"
    path.symlink_to(victim)
    dropin.write_file(path, "ours\n")
    assert victim.read_text() == "precious\n"
    assert not path.is_symlink() and path.read_text() == "ours\n"


def test_write_file_never_writes_through_a_planted_temp_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "pveclean.conf"
    (tmp_path / ".pveclean.conf.tmp").symlink_to(victim)
    with pytest.raises(PvecleanError, match="cannot write") as exc:
        dropin.write_file(path, "ours\n")
    assert exc.value.exit_code == ExitCode.ACCESS
    assert victim.read_text() == "precious\n" and not path.exists()


def test_remove_dropin_removes_its_directory_only_when_empty(tmp_path: Path) -> None:
    cfg = Config(systemd_dir=str(tmp_path))
    a, b = dropin.dropin_path(cfg, 129), dropin.dropin_path(cfg, 130)
    for p in (a, b):
        dropin.write_file(p, "x\n")
    (b.parent / "override.conf").write_text("the admin's\n")
    dropin.remove_dropin(a)
    dropin.remove_dropin(b)
    assert not a.parent.exists()
    assert not b.exists() and (b.parent / "override.conf").read_text() == "the admin's\n"
    dropin.remove_dropin(a)  # gone already: nothing to do


def test_remove_dropin_failure_is_an_access_error(tmp_path: Path) -> None:
    (tmp_path / "pveclean.conf").mkdir()  # a directory cannot be unlinked
    with pytest.raises(PvecleanError, match="cannot remove") as exc:
        dropin.remove_dropin(tmp_path / "pveclean.conf")
    assert exc.value.exit_code == ExitCode.ACCESS


def test_daemon_reload_only_for_systemds_real_directories(tmp_path: Path) -> None:
    assert dropin.daemon_reload(Config(systemd_dir=str(tmp_path))) is None


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
    exe = tmp_path / "pveclean"
    if script is not None:
        exe.write_text(script)
        exe.chmod(0o755)
    said = tmp_path / "journal"  # a systemd-cat that writes what it is given to a file
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/systemd-cat").write_text(f'#!/bin/sh\nshift 4\n"$@" >> {said}\n')
    (tmp_path / "bin/systemd-cat").chmod(0o755)
    line = dropin.dropin_text(100, str(exe), None).split("ExecStartPre=", 1)[1].splitlines()[0]
    argv = shlex.split(line.replace("$$", "$"))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False,
                         env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert res.returncode == expect_rc, res
    assert "WARNING" not in res.stdout + res.stderr  # never the unit's (null, ct-N.stderr)
    journal = said.read_text() if said.exists() else ""
    assert ("WARNING: CT 100 start-pre" in journal) == warned, journal
