"""core/metrics and host/notify's textfile: what Prometheus' parsers read of a run's metrics
(prometheus_client's, and promtool's), written atomically, counters that go on across runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pveclean.core import metrics
from pveclean.core.amendments import Leak
from pveclean.core.report import Report
from pveclean.core.verdicts import VERDICTS
from pveclean.host import notify
from tests.reportkit import holder, report, summary

MIB = 1 << 20


def _rep(vmid: Any = 129, verdict: str = "clean", phase: str = "manual", **extra: Any
         ) -> Report:
    return report(vmid, verdict, phase, duration_s=1.25,
                  summary=summary(holders=3, stopped=2, freed_mib=1234),
                  holders=[holder(outcome=o) for o in ("killed", "survived", "terminated")],
                  **extra)


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(fams: dict[str, Any], name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`."""
    base = name.removesuffix("_total")
    found = [s.value for s in fams[base].samples
             if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) == 1, (name, labels, found)
    return float(found[0])


def test_the_parser_reads_each_family_once_typed_with_its_samples(tmp_path: Path) -> None:
    prom = tmp_path / "pveclean.prom"
    notify.write_metrics(_rep(12, "residual"), str(prom))
    notify.write_metrics(_rep(129, "leaked", leaks=[Leak(0, "", 100, "")]), str(prom))
    fams = _families(prom.read_text())
    # main wrote all HELP/TYPE lines first: the parser read 20 families, 13 of them untyped
    assert len(fams) == len(metrics.RUN_FAMILIES)
    assert {f.type for f in fams.values()} == {"gauge", "counter"}
    assert all(f.samples for f in fams.values())
    for f in fams.values():  # the same labels on every series of a family
        assert len({tuple(sorted(s.labels)) for s in f.samples}) == 1, f.name
    assert _value(fams, "pveclean_last_verdict", id="lxc/129", verdict="leaked") == 1
    assert _value(fams, "pveclean_last_leaked_bytes", id="lxc/129") == 100 * MIB
    assert _value(fams, "pveclean_last_freed_bytes", id="lxc/12") == 1234 * MIB
    assert _value(fams, "pveclean_last_run_duration_seconds", id="lxc/12") == 1.25
    verdicts = [s for s in fams["pveclean_last_verdict"].samples if s.labels["id"] == "lxc/12"]
    assert len(verdicts) == len(VERDICTS) and sum(s.value for s in verdicts) == 1


def test_counters_go_on_across_runs_and_phases_keep_their_own_last_outcome(
        tmp_path: Path) -> None:
    prom = tmp_path / "pveclean.prom"
    notify.write_metrics(_rep(129, "residual", "pre-stop"), str(prom), now=1000)
    notify.write_metrics(_rep(129, "clean", "post-stop"), str(prom), now=1010)
    notify.write_metrics(_rep(129, "clean", "post-stop"), str(prom), now=1020)
    fams = _families(prom.read_text())
    assert _value(fams, "pveclean_runs_total", id="lxc/129", phase="post-stop",
                  verdict="clean") == 2
    assert _value(fams, "pveclean_runs_total", id="lxc/129", phase="pre-stop",
                  verdict="residual") == 1
    assert _value(fams, "pveclean_holders_stopped_total", id="lxc/129") == 6
    assert _value(fams, "pveclean_freed_bytes_total", id="lxc/129") == 3 * 1234 * MIB
    # post-stop's clean run does not overwrite pre-stop's residual
    assert _value(fams, "pveclean_last_verdict", id="lxc/129", phase="pre-stop",
                  verdict="residual") == 1
    assert _value(fams, "pveclean_last_run_timestamp_seconds", id="lxc/129",
                  phase="pre-stop") == 1000
    assert _value(fams, "pveclean_last_run_timestamp_seconds", id="lxc/129",
                  phase="post-stop") == 1020


def test_label_values_are_escaped_as_the_format_says_and_read_back_whole(
        tmp_path: Path) -> None:
    odd = 'x"} 9\nx{a="\\\x1b'
    prom = tmp_path / "pveclean.prom"
    notify.write_metrics(_rep(odd, phase="p\nq"), str(prom))
    notify.write_metrics(_rep(odd, phase="p\nq"), str(prom))  # parsed back by our own reader
    fams = _families(prom.read_text())  # main's \x0a: the official parser read "x0a"
    assert _value(fams, "pveclean_runs_total", id=f"lxc/{odd}", phase="p\nq") == 2
    assert "\\x0a" not in prom.read_text()


def test_an_older_layout_is_dropped_not_mixed_in(tmp_path: Path) -> None:
    prom = tmp_path / "pveclean.prom"
    prom.write_text('# TYPE pveclean_last_verdict gauge\npveclean_last_verdict{vmid="7",'
                    'verdict="clean"} 1\nother_metric 3\npveclean_runs_total{id="lxc/7",'
                    'phase="manual",verdict="clean"} 4\n')
    notify.write_metrics(_rep(129), str(prom))
    fams = _families(prom.read_text())
    assert "other_metric" not in fams
    assert all("vmid" not in s.labels for s in fams["pveclean_last_verdict"].samples)
    assert _value(fams, "pveclean_runs_total", id="lxc/7") == 4


def test_the_temporary_file_never_ends_in_prom(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    renamed: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: Any, dst: Any) -> None:
        renamed.append((os.fspath(src), os.fspath(dst)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    prom = tmp_path / "pveclean.prom"
    notify.write_metrics(_rep(), str(prom))
    (src, dst), = renamed
    assert dst == str(prom) and Path(src).parent == tmp_path
    assert not src.endswith(".prom")  # node_exporter reads every *.prom, dotfiles too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pveclean.prom", "pveclean.prom.lock"]


@pytest.mark.parametrize(("value", "text"), [
    (3, "3"), (1.25, "1.25"), (2.0**60, "1.152921504606847e+18"), (float("nan"), "NaN"),
    (float("inf"), "+Inf")])
def test_numbers(value: float, text: str) -> None:
    assert metrics.number(value) == text


def test_a_family_refuses_what_the_format_does_not_allow() -> None:
    with pytest.raises(ValueError, match="_total"):
        metrics.Family("pveclean_runs", "counter", "h", ())
    with pytest.raises(ValueError, match="label names"):
        metrics.Family("x", "gauge", "h", ("__name__",))
    fam = metrics.Family("x", "gauge", "h", ("a",))
    with pytest.raises(ValueError, match="has labels"):
        fam.set(1, "a", "b")


def test_parse_skips_what_it_cannot_read() -> None:
    text = 'a{x="1"} 2\nb{x="1} 3\nc{x="\\"q\\n"} 4 1700000000\nd nope\n'
    assert metrics.parse(text) == [("a", {"x": "1"}, 2.0), ("c", {"x": '"q\n'}, 4.0)]


def test_promtool_accepts_the_textfile(tmp_path: Path, promtool: str) -> None:
    prom = tmp_path / "pveclean.prom"
    notify.write_metrics(_rep(12, "residual", "pre-stop"), str(prom))
    notify.write_metrics(_rep('a"\n\\', "clean"), str(prom))
    r = subprocess.run([promtool, "check", "metrics"], input=prom.read_text(),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
