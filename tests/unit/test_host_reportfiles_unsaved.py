"""An unsaved report: kept whole in a spare file (0600, pruned per container), and shown on
stderr cut to a bound with where the whole one is."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from pveclean.core import bounds
from pveclean.core.report import Report
from pveclean.host import reportfiles
from tests.reportkit import holder, report


def rep(vmid: int = 129, started: float = 1_700_000_000.0, n: int = 5000) -> Report:
    return report(vmid, phase="pre-stop", started=started,
                  holders=[holder(i, devices=["/dev/nvidia0 (195:0)"]) for i in range(n)])


def test_the_whole_report_goes_to_a_spare_file_pruned_per_container(tmp_path: Path) -> None:
    spare = tmp_path / "run/pveclean/unsaved"
    paths = [reportfiles.write_spare(rep(started=1_700_000_000.0 + i), keep=3,
                                     spare_dir=str(spare)) for i in range(5)]
    assert all(p is not None for p in paths)
    left = sorted(spare.iterdir())
    assert [p.name for p in left] == [p.name for p in paths[2:] if p is not None]
    assert os.stat(spare).st_mode & 0o777 == 0o700 and left[0].stat().st_mode & 0o777 == 0o600
    assert len(yaml.safe_load(left[0].read_text())["holders"]) == 5000


def test_no_spare_file_is_none(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert reportfiles.write_spare(rep(), spare_dir=str(tmp_path / "file" / "x")) is None


def test_the_text_shown_is_cut_at_a_line_and_says_where_the_whole_one_is() -> None:
    where = Path("/run/pveclean/unsaved/129-pre-stop-x.yaml")
    text = reportfiles.unsaved_text(rep(), where)
    assert len(text) <= bounds.UNSAVED_SHOWN + 200
    head, _, tail = text.rpartition("# … cut here: ")
    assert head.endswith("\n") and f"the whole report is in {where}" in tail
    assert "_started" not in text
    small = reportfiles.unsaved_text(rep(n=1), None)
    assert "cut here" not in small and "journalctl -t pveclean" not in small
    assert "journalctl -t pveclean" in reportfiles.unsaved_text(rep(), None)


def test_the_text_shown_is_printable_ascii() -> None:
    r = report(holders=[holder(name="\x1b[31mevil\u202e")])
    text = reportfiles.unsaved_text(r, None)
    assert text.isascii() and "\x1b" not in text
