"""What the hook writes to the task log when its report could not be saved: at most 64 KB,
however big the run was, with where the whole report was kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from pveclean.commands import hook
from pveclean.core.report import RunResult
from pveclean.core.verdicts import Outcome
from tests.reportkit import report
from tests.unit.test_core_bounds_caps import holder, make_report

TASK_LOG = 64 << 10


def test_an_unsaved_report_of_400_holders_stays_under_64_kb(
        capsys: pytest.CaptureFixture[str]) -> None:
    hs = [holder(1000 + i, Outcome.SURVIVED if i % 2 else Outcome.KILLED) for i in range(400)]
    rep = make_report(hs).bounded()
    spare = Path("/run/pveclean/unsaved/129-pre-stop-x.yaml")
    res = RunResult(rep, None, 4, "cannot write report in /x: No space left on device",
                    spare=spare)
    hook._unsaved(res)
    where = hook._where(res)
    out = capsys.readouterr()
    assert len(out.err.encode()) + len(where) <= TASK_LOG
    assert f"the whole report is in {spare}" in out.err
    assert where.endswith(f"kept in {spare}")
    assert rep.remaining_count() == 200  # every one counted, listed or not


def test_ct_says_how_many_holders_are_not_listed_in_one_safe_line() -> None:
    from pveclean.commands.ct import not_listed_line
    from pveclean.core import bounds

    hs = [holder(1000 + i) for i in range(300)]
    for h in hs[:5]:
        h.name = "\x1b[2Jevil"
    more = bounds.not_listed(hs)
    assert more is not None
    line = not_listed_line(more)
    assert line.startswith("... and 300 more holder(s) not listed (killed 300): host PIDs "
                           "1000-1299; names ")
    assert "\x1b" not in line and "\\x1b[2Jevil (5)" in line


def test_syslog_and_metrics_count_every_survivor_listed_or_not() -> None:
    from pveclean.host import notify

    hs = [holder(1000 + i, Outcome.SURVIVED) for i in range(300)]
    b = make_report(hs).bounded()
    assert len(b.holders) < 300
    assert " residual=300 " in notify.log_line(b, None)
    assert notify.survived(report(holders=[holder(1, Outcome.SURVIVED)])) == 1
