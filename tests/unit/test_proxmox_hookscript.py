"""proxmox/hookscript: the paths stamped into the guest hookscript, which config it names, and
whose it is (a program or config others can change is refused)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pveclean.core import config
from pveclean.core.config import Config, parse
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import configfile
from pveclean.host.configfile import DEFAULT_PATH
from pveclean.proxmox import hookscript
from pveclean.proxmox.hookscript import TEMPLATES, config_file, stamp, trusted

TEMPLATE = 'head\nPVECLEAN_BIN=""\nPVECLEAN_CONFIG_FILE=""\nx=1\nPVECLEAN_BIN=""\n'


def test_stamp_fills_in_the_first_assignment_only() -> None:
    out = hookscript.stamp(TEMPLATE, "/usr/sbin/pveclean", "/etc/pveclean/site.yaml")
    assert out == ('head\nPVECLEAN_BIN="/usr/sbin/pveclean"\n'
                   'PVECLEAN_CONFIG_FILE="/etc/pveclean/site.yaml"\nx=1\nPVECLEAN_BIN=""\n')


def test_stamp_without_a_config_leaves_it_empty() -> None:
    out = hookscript.stamp(TEMPLATE, "/opt/my pveclean/bin/pveclean", None)
    assert 'PVECLEAN_BIN="/opt/my pveclean/bin/pveclean"' in out  # a blank is safe in quotes
    assert 'PVECLEAN_CONFIG_FILE=""' in out


@pytest.mark.parametrize("bad", ['"', "$", "`", "\\", "\n"])
@pytest.mark.parametrize("where", ["bin", "config"])
def test_stamp_refuses_what_a_double_quoted_shell_word_would_interpret(bad: str,
                                                                        where: str) -> None:
    path = f"/opt/a{bad}b"
    with pytest.raises(PvecleanError, match="cannot go into a shell script") as exc:
        if where == "bin":
            hookscript.stamp(TEMPLATE, path, None)
        else:
            hookscript.stamp(TEMPLATE, "/usr/sbin/pveclean", path)
    assert exc.value.exit_code == ExitCode.USAGE


def test_the_shipped_template_has_both_placeholders() -> None:
    text = hookscript.TEMPLATES[0].read_text()
    assert text.startswith("#!/bin/sh\n") and hookscript.TEMPLATES[0].name == hookscript.HOOK_NAME
    out = hookscript.stamp(text, "/X/pveclean", "/Y/c.yaml")
    assert 'PVECLEAN_BIN="/X/pveclean"' in out and 'PVECLEAN_CONFIG_FILE="/Y/c.yaml"' in out


def test_config_file_is_none_for_defaults_and_the_default_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hookscript.config_file(Config()) is None
    assert hookscript.config_file(parse("", str(DEFAULT_PATH))) is None
    assert hookscript.config_file(parse("", str(tmp_path / "c.yaml"))) == str(tmp_path / "c.yaml")
    monkeypatch.chdir(tmp_path)
    assert hookscript.config_file(parse("", "rel/c.yaml")) == str(tmp_path / "rel/c.yaml")


@pytest.mark.parametrize(("volid", "ours"), [
    ("local:snippets/pveclean-hook", True),
    ("nfs-a:snippets/pveclean-hook", True),
    ("pveclean-hook", True),
    ("local:snippets/pveclean-hook.sh", False),
    ("local:snippets/my-pveclean-hook", False),
    ("local:snippets/theirs.sh", False),
    ("", False),
    (None, False),
])
def test_is_pveclean(volid: str | None, ours: bool) -> None:
    assert hookscript.is_pveclean(volid) is ours


def test_hook_text_stamps_the_first_template_found(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    template = tmp_path / "pveclean-hook"
    template.write_text(TEMPLATE)
    exe = tmp_path / "pveclean"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(hookscript, "TEMPLATES", (tmp_path / "missing", template))
    monkeypatch.setattr(hookscript, "pveclean_bin", lambda: str(exe))
    conf = tmp_path / "c.yaml"
    conf.write_text("")  # as root, a stamped config must exist and be root's
    conf.chmod(0o644)
    out = hookscript.hook_text(parse("", str(conf)))
    assert f'PVECLEAN_BIN="{exe}"' in out and f'PVECLEAN_CONFIG_FILE="{conf}"' in out


def test_hook_text_without_a_template_names_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hookscript, "TEMPLATES", (tmp_path / "a", tmp_path / "b"))
    with pytest.raises(PvecleanError, match="hookscript template not found") as exc:
        hookscript.hook_text(Config())
    assert str(tmp_path / "a") in str(exc.value) and str(tmp_path / "b") in str(exc.value)
    assert exc.value.exit_code == ExitCode.ACCESS


def test_trusted_as_root_refuses_a_program_others_can_change(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the trust check runs only as root")
    exe = tmp_path / "pveclean"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    hookscript.trusted(str(exe), None)
    exe.chmod(0o775)
    with pytest.raises(PvecleanError, match="writable by group or others") as exc:
        hookscript.trusted(str(exe), None)
    assert exc.value.exit_code == ExitCode.USAGE and "not stamping it" in str(exc.value)


def test_trusted_as_root_checks_the_interpreter_too(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the trust check runs only as root")
    interp = tmp_path / "python3"
    interp.write_text("")
    interp.chmod(0o777)
    exe = tmp_path / "pveclean"
    exe.write_text(f"#!{interp} -I\n")
    exe.chmod(0o755)
    with pytest.raises(PvecleanError, match="pveclean's interpreter"):
        hookscript.trusted(str(exe), None)


def test_trusted_as_root_checks_the_config(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the trust check runs only as root")
    exe = tmp_path / "pveclean"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    with pytest.raises(PvecleanError, match="config file"):
        hookscript.trusted(str(exe), str(tmp_path / "missing.yaml"))


def test_install_refuses_a_config_or_binary_others_can_change(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    cfg = shared / "x.yaml"
    cfg.write_text("grace_seconds: 1\n")
    cfg.chmod(0o644)
    exe = tmp_path / "pveclean"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    with pytest.raises(PvecleanError, match="writable by group or others") as e:
        trusted(str(exe), str(cfg))
    assert e.value.exit_code == 2
    exe.chmod(0o775)
    with pytest.raises(PvecleanError, match="pveclean command"):
        trusted(str(exe), None)
    exe.chmod(0o755)
    trusted(str(exe), None)


def test_stamp_and_config_file(tmp_path: Path) -> None:
    text = TEMPLATES[0].read_text()
    out = stamp(text, "/opt/pveclean/bin/pveclean", "/srv/pc.yaml")
    assert 'PVECLEAN_BIN="/opt/pveclean/bin/pveclean"' in out
    assert 'PVECLEAN_CONFIG_FILE="/srv/pc.yaml"' in out
    assert 'PVECLEAN_CONFIG_FILE=""' in stamp(text, "/usr/sbin/pveclean", None)
    with pytest.raises(PvecleanError, match="cannot go into a shell script"):
        stamp(text, '/tmp/x"; rm -rf /; "', None)
    assert config_file(config.Config()) is None
    assert config_file(config.parse("", str(configfile.DEFAULT_PATH))) is None
    assert config_file(config.parse("", str(tmp_path / "c.yaml"))) == str(tmp_path / "c.yaml")
