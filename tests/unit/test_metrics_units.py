"""The shipped pveclean-metrics.service and .timer: the timer runs the command that writes the
map into node_exporter's directory every 30 s (the bench row's interval), and nothing turns
it on but `systemctl enable --now pveclean-metrics.timer`."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import typer.testing

from pveclean.commands import cli
from pveclean.commands.metrics import TEXTFILE_DIR
from tests.bench.metrics import INTERVAL_S

UNITS = Path(__file__).resolve().parents[2] / "config" / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    p = configparser.ConfigParser(strict=True, interpolation=None)
    p.optionxform = str  # type: ignore[assignment,method-assign]
    p.read_string((UNITS / name).read_text())
    return p


def test_the_service_runs_pveclean_metrics_into_debians_textfile_directory() -> None:
    svc = _unit("pveclean-metrics.service")
    assert svc["Service"]["Type"] == "oneshot"
    argv = shlex.split(svc["Service"]["ExecStart"])
    assert argv[:2] == ["/usr/sbin/pveclean", "metrics"]
    assert argv[argv.index("--textfile-dir") + 1] == TEXTFILE_DIR
    assert "Install" not in svc  # started by the timer only
    r = typer.testing.CliRunner().invoke(cli.app, ["metrics", "--help"])
    assert r.exit_code == 0 and "--textfile-dir" in r.output and "--dcgm-job-dir" in r.output
    assert TEXTFILE_DIR in r.output


def test_the_timer_every_30_s_wanted_by_timers_only_once_enabled() -> None:
    timer = _unit("pveclean-metrics.timer")
    assert timer["Timer"]["OnUnitActiveSec"] == f"{INTERVAL_S:.0f}s"
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert "systemctl enable --now pveclean-metrics.timer" in (
        UNITS / "pveclean-metrics.timer").read_text()
