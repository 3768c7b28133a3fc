"""configfile: which file is read, and the checks root makes before it trusts a file that steers
what it kills or runs. The trust checks compare owners with root: those tests need root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pveclean.core.config import Config
from pveclean.errors import ConfigError
from pveclean.host import configfile

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root: the checks compare owners with "
                                "root and run only as root")


# ---- locate -------------------------------------------------------------------------------
def test_explicit_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(configfile.ENV_VAR, str(tmp_path / "env.yaml"))
    assert configfile.locate(tmp_path / "x.yaml") == tmp_path / "x.yaml"
    assert configfile.locate(str(tmp_path / "y.yaml")) == tmp_path / "y.yaml"


def test_environment_then_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "pveclean.yaml"
    monkeypatch.setattr(configfile, "DEFAULT_PATH", default)
    monkeypatch.setenv(configfile.ENV_VAR, str(tmp_path / "env.yaml"))
    assert configfile.locate() == tmp_path / "env.yaml"  # even when it does not exist
    monkeypatch.setenv(configfile.ENV_VAR, "")
    assert configfile.locate() is None  # an empty variable is no setting; no default file
    default.write_text("")
    assert configfile.locate() == default
    assert configfile.locate("") == default


def test_load_without_any_file_is_the_defaults(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(configfile.ENV_VAR, raising=False)
    monkeypatch.setattr(configfile, "DEFAULT_PATH", tmp_path / "none.yaml")
    assert configfile.load() == Config()


def test_load_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        configfile.load(tmp_path / "missing.yaml")
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(ConfigError, match="cannot read config"):
        configfile.load(tmp_path / "dir.yaml")
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"grace_seconds: \xff\n")
    bad.chmod(0o644)
    with pytest.raises(ConfigError, match="cannot read config"):
        configfile.load(bad)


# ---- check_permissions ----------------------------------------------------------------------
@needs_root
@pytest.mark.parametrize(("uid", "mode", "needle"), [
    (0, 0o644, None), (0, 0o600, None), (0, 0o640, None),
    (0, 0o664, "writable by group or others (mode 664); run 'chmod go-w"),
    (0, 0o646, "writable by group or others (mode 646)"),
    (1234, 0o644, "not owned by root (uid 1234); refusing to use it"),
])
def test_check_permissions_as_root(tmp_path: Path, uid: int, mode: int,
                                   needle: str | None) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("")
    os.chown(f, uid, uid)
    f.chmod(mode)
    if needle is None:
        configfile.check_permissions(f, f.stat())
        return
    with pytest.raises(ConfigError) as exc:
        configfile.check_permissions(f, f.stat())
    assert str(exc.value).startswith(f"{f}: ") and needle in str(exc.value)


@needs_root
def test_load_as_root_refuses_a_group_writable_config(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("grace_seconds: 1\n")
    f.chmod(0o664)
    with pytest.raises(ConfigError, match="writable by group or others"):
        configfile.load(f)
    f.chmod(0o644)
    assert configfile.load(f).grace_seconds == 1.0


# ---- untrusted -----------------------------------------------------------------------------
def _file(path: Path, mode: int = 0o644, uid: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    path.chmod(mode)
    os.chown(path, uid, uid)
    return path


@needs_root
def test_a_root_file_in_root_directories_is_trusted(tmp_path: Path) -> None:
    assert configfile.untrusted(_file(tmp_path / "a/b/c.yaml"), "config file") is None


@needs_root
def test_an_untrusted_file_is_named_with_what_it_is(tmp_path: Path) -> None:
    f = _file(tmp_path / "c.yaml", uid=1234)
    assert configfile.untrusted(f, "pct_command") == \
        f"pct_command {f} is not owned by root (uid 1234)"
    f = _file(tmp_path / "d.yaml", mode=0o666)
    why = configfile.untrusted(f, "config file")
    assert why is not None and "writable by group or others (mode 666)" in why


@needs_root
def test_a_missing_file_is_untrusted(tmp_path: Path) -> None:
    assert configfile.untrusted(tmp_path / "none", "config file") == \
        f"config file {tmp_path / 'none'}: No such file or directory"


@needs_root
def test_a_directory_others_can_write_is_untrusted(tmp_path: Path) -> None:
    f = _file(tmp_path / "open/deeper/c.yaml")
    (tmp_path / "open").chmod(0o777)  # others could replace deeper/ and the file in it
    why = configfile.untrusted(f, "config file")
    assert why == (f"config file {f}: directory {tmp_path / 'open'} is writable by group or "
                   "others (mode 777)")


@needs_root
def test_a_sticky_directory_above_is_fine_but_not_as_the_files_own(tmp_path: Path) -> None:
    f = _file(tmp_path / "sticky/own/c.yaml")
    (tmp_path / "sticky").chmod(0o1777)  # like /tmp: others cannot replace root's entries
    assert configfile.untrusted(f, "config file") is None
    g = _file(tmp_path / "sticky/c.yaml")  # its own directory: anyone may add files there
    why = configfile.untrusted(g, "config file")
    assert why is not None and "directory" in why and "mode 1777" in why


@needs_root
def test_a_directory_not_owned_by_root_is_untrusted(tmp_path: Path) -> None:
    f = _file(tmp_path / "theirs/c.yaml")
    os.chown(tmp_path / "theirs", 1234, 1234)
    assert configfile.untrusted(f, "config file") == \
        f"config file {f}: directory {tmp_path / 'theirs'} is not owned by root"


@needs_root
def test_a_symlink_is_judged_by_its_target_too(tmp_path: Path) -> None:
    target = _file(tmp_path / "open/c.yaml")
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "safe").mkdir()
    link = tmp_path / "safe/c.yaml"
    link.symlink_to(target)
    why = configfile.untrusted(link, "config file")
    assert why is not None and str(tmp_path / "open") in why
    (tmp_path / "open").chmod(0o755)
    assert configfile.untrusted(link, "config file") is None


# ---- the programs a config makes root run ----------------------------------------------------
def test_executable_lookup_as_pct_would(tmp_path: Path) -> None:
    assert configfile._executable("/opt/pct --x") == "/opt/pct"
    assert configfile._executable("'unclosed") is None
    assert configfile._executable("   ") is None
    assert configfile._executable("surely-no-such-command-here") is None
    sh = configfile._executable("sh -c true")
    assert sh is not None and os.path.basename(sh) == "sh"
    assert os.path.dirname(sh) in configfile.HOOK_DIRS


@needs_root
def test_check_trusted_refuses_a_pct_command_others_can_change(tmp_path: Path) -> None:
    pct = _file(tmp_path / "bin/pct", mode=0o775)
    cfg = Config(pct_command=f"{pct} --debug")
    with pytest.raises(ConfigError, match=r"pct_command .* refusing to use it"):
        configfile.check_trusted(cfg)
    pct.chmod(0o755)
    configfile.check_trusted(cfg)


@needs_root
def test_check_trusted_skips_what_does_not_exist_but_the_config(tmp_path: Path) -> None:
    cfg = Config(pct_command=str(tmp_path / "no-pct"), nvml_library=str(tmp_path / "no.so"))
    configfile.check_trusted(cfg)
    with pytest.raises(ConfigError, match="config file"):
        configfile.check_trusted(cfg, tmp_path / "gone.yaml")


@needs_root
def test_check_trusted_checks_an_nvml_library_path_only(tmp_path: Path) -> None:
    lib = _file(tmp_path / "libnvidia-ml.so.1", mode=0o666)
    with pytest.raises(ConfigError, match="nvml_library"):
        configfile.check_trusted(Config(nvml_library=str(lib)))
    configfile.check_trusted(Config(nvml_library="libnvidia-ml.so.1"))  # a bare name: ld's


def test_as_another_user_nothing_is_checked(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    f = tmp_path / "c.yaml"
    f.write_text("grace_seconds: 2\n")
    f.chmod(0o666)
    configfile.check_permissions(f, f.stat())
    configfile.check_trusted(Config(pct_command=str(f)), f)
    assert configfile.load(f).grace_seconds == 2.0
    assert stat.S_IMODE(f.stat().st_mode) == 0o666


@needs_root
def test_a_missing_nvml_library_is_checked_where_it_would_appear(tmp_path: Path) -> None:
    """Issue 39: a library named but not there yet passed every check; a file put there
    later, in a directory others can write, would be loaded by root."""
    open_dir = tmp_path / "drop"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o1777)  # sticky, like /tmp: still anyone's to create the file in
    with pytest.raises(ConfigError, match=r"nvml_library.*writable by group or others"):
        configfile.check_trusted(Config(nvml_library=str(open_dir / "libnvidia-ml.so.1")))
    with pytest.raises(ConfigError, match="nvml_library"):  # a missing directory: its parent
        configfile.check_trusted(Config(nvml_library=str(open_dir / "x" / "libnvidia-ml.so")))
    closed = tmp_path / "root-only"
    closed.mkdir(mode=0o755)
    configfile.check_trusted(Config(nvml_library=str(closed / "libnvidia-ml.so.1")))
    import tempfile

    right_below_tmp = tempfile.mkdtemp(dir="/tmp")  # 0700, root's, in the sticky /tmp
    try:
        configfile.check_trusted(Config(nvml_library=f"{right_below_tmp}/libnvidia-ml.so.1"))
    finally:
        os.rmdir(right_below_tmp)


def test_an_nvml_library_relative_to_the_working_directory_is_refused() -> None:
    from pveclean.core.config import parse

    with pytest.raises(ConfigError, match="nvml_library"):
        parse("nvml_library: lib/libnvidia-ml.so.1\n")
    assert parse("nvml_library: libnvidia-ml.so.1\n").nvml_library == "libnvidia-ml.so.1"
    assert parse("nvml_library: /usr/lib/x/libnvidia-ml.so.1\n").nvml_library
