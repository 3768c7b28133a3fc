"""The config: the shipped file equals the defaults, errors name key and line, the search
order, `config check`, and fuzzing (no crash, a clear error)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean import errors
from pveclean.core import config
from pveclean.errors import PvecleanError
from pveclean.host import configfile
from pveclean.proxmox import pveconf
from tests.helpers import REPO


def test_shipped_config_equals_builtin_defaults() -> None:
    shipped = config.parse((REPO / "config/pveclean.yaml").read_text(), "shipped")
    assert shipped.as_dict() == config.Config().as_dict()


def test_every_key_in_the_shipped_config_is_commented() -> None:
    lines = (REPO / "config/pveclean.yaml").read_text().splitlines()
    keys = 0
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#", "-")):
            keys += 1
            j = i - 1  # walk up over the keys of the same group to its comment
            while j >= 0 and lines[j] and not lines[j].startswith("#"):
                j -= 1
            assert j >= 0 and lines[j].startswith("#"), f"key without a comment: {line}"
    assert keys == len(config.Config().as_dict())


@pytest.mark.parametrize(("text", "needle"), [
    ("grace_secnds: 3\n", "line 1: unknown key 'grace_secnds' (did you mean 'grace_seconds'?)"),
    ("devices:\n  - /dev/nvidia*\ngrace_seconds: soon\n", "line 3: 'grace_seconds' must be"),
    ("protect: nvidia-persistenced\n", "line 1: 'protect' must be a list"),
    ("phases:\n  pre-stop: maybe\n", "line 1: 'phases' must be"),
    ("deadline_seconds: 0\n", "'deadline_seconds' must be a number > 0"),
    ("pre_start_policy: abort\n", "'pre_start_policy' must be 'warn' or 'refuse'"),
    ("probe: yes please\n", "'probe' must be true or false"),
    ("redact: ['(']\n", "not a valid regex"),
    ("a: [\n", "line"),
    ("- just\n- a list\n", "top level must be a mapping"),
    ("grace_seconds: 1\ngrace_seconds: 2\n", "line 2: key 'grace_seconds' given twice"),
])
def test_config_errors_name_key_and_line(text: str, needle: str) -> None:
    with pytest.raises(errors.ConfigError) as exc:
        config.parse(text, "cfg.yaml")
    assert needle in str(exc.value) and str(exc.value).startswith("cfg.yaml")
    assert "\n" not in str(exc.value)


def test_config_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("grace_seconds: 1\n")
    b.write_text("grace_seconds: 2\n")
    for p in (a, b):
        p.chmod(0o644)
    monkeypatch.setenv("PVECLEAN_CONFIG", str(b))
    assert configfile.load(a).grace_seconds == 1.0
    assert configfile.load().grace_seconds == 2.0
    monkeypatch.delenv("PVECLEAN_CONFIG")
    monkeypatch.setattr(configfile, "DEFAULT_PATH", tmp_path / "missing.yaml")
    assert configfile.load() == config.Config()
    with pytest.raises(errors.ConfigError, match="does not exist"):
        configfile.load(tmp_path / "nope.yaml")


def test_config_check_command(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("grace_seconds: 4\n")
    cfg.chmod(0o644)
    exe = [sys.executable, "-m", "pveclean"]
    r = subprocess.run([*exe, "config", "check", str(cfg)], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0 and "config OK" in r.stderr
    assert yaml.safe_load(r.stdout)["grace_seconds"] == 4.0
    cfg.write_text("grace_seconds: 4\nfoo: 1\n")
    r = subprocess.run([*exe, "config", "check", str(cfg)], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 2
    assert r.stderr.strip() == f"pveclean: {cfg} line 2: unknown key 'foo'"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_config_parser_never_crashes(text: str) -> None:
    try:
        config.parse(text, "fuzz")
    except errors.ConfigError as exc:
        assert str(exc).startswith("fuzz")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(list(config.Config().as_dict())),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                 st.text(max_size=10), st.lists(st.text(max_size=5)))))
def test_config_values_of_any_type(values: dict[str, object]) -> None:
    try:
        cfg = config.parse(yaml.safe_dump(values), "fuzz")
    except errors.ConfigError:
        return
    assert isinstance(cfg.grace_seconds, float) and isinstance(cfg.devices, list)


@pytest.mark.parametrize("key", ["grace_seconds", "deadline_seconds", "lock_wait_seconds",
                                 "max_report_age_days"])
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN"])
def test_config_numbers_must_be_finite(key: str, value: str) -> None:
    with pytest.raises(errors.ConfigError, match=key):
        config.parse(f"{key}: {value}\n", "cfg.yaml")


def test_read_config_error_is_a_pveclean_error(tmp_path: Path) -> None:
    with pytest.raises(PvecleanError, match="does not exist on this node"):
        pveconf.read_config(str(tmp_path), 100)
