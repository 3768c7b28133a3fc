"""The lean ways in (issue 16): `ct` with its common flags and `--version` skip typer, and
behave as the typer app does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pveclean.ctcmd import CtArgs, parse
from pveclean.model import PvecleanError


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


def test_reports_are_emitted_by_libyaml_with_the_same_text() -> None:
    """The C emitter is only faster: the text is what PyYAML's own emitter writes."""
    import yaml

    from pveclean import report

    rep = {"vmid": 129, "holders": [
        {"host_pid": i, "name": "python3\x1b[2J\u202e", "cmdline": "a --token=x\nb",
         "gpu_memory_mib": {0: 100, 1: None}} for i in range(50)]}

    class Pure(yaml.SafeDumper):
        pass

    Pure.add_representer(str, report._str_repr)
    for terminal in (False, True):
        pure = yaml.dump(rep, Dumper=Pure, sort_keys=False, default_flow_style=False,
                         allow_unicode=not terminal, width=100)
        assert report.to_yaml(rep, terminal=terminal) == pure
    if hasattr(yaml, "CSafeDumper"):
        assert issubclass(report._Dumper, yaml.CSafeDumper)
