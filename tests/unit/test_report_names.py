"""Report names and times (without datetime on every run), and their retention."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=2000, deadline=None)
@given(st.floats(min_value=0, max_value=4102444799.999, allow_nan=False)
       | st.integers(0, 4102444799).map(lambda s: s + 0.0000005)
       | st.integers(0, 4102444799).map(lambda s: s + 0.9999995))
def test_report_times_are_what_datetime_writes(t: float) -> None:
    """report.py writes report names and times without importing datetime on every run."""
    import datetime as dt

    from pveclean.host import reportfiles

    when = dt.datetime.fromtimestamp(t, dt.UTC)
    assert reportfiles.utc_stamp(t) == when.strftime("%Y%m%dT%H%M%S.%fZ")
    assert reportfiles.iso(t) == when.isoformat(timespec="milliseconds")


def test_prune_keeps_the_newest_reports_and_no_old_one(tmp_path: Path) -> None:
    """report.prune stats only as far as the first young report (oldest first)."""
    import time

    from pveclean.host import reportfiles

    now = time.time()
    names = [reportfiles.report_name(129, "manual", now - 86400 * (10 - i)) for i in range(10)]
    for i, name in enumerate(names):  # one a day, the oldest ten days old
        (tmp_path / name).write_text("vmid: 129\n")
        os.utime(tmp_path / name, (now - 86400 * (10 - i),) * 2)
    (tmp_path / reportfiles.report_name(130, "manual", now - 86400 * 20)).write_text("vmid: 130\n")
    assert reportfiles.prune(str(tmp_path), 129, keep=8, max_age_days=7.5) == 3  # 2 over, 1 old
    assert [p.name for p in reportfiles.list_reports(str(tmp_path), 129)] == names[3:]
    assert reportfiles.prune(str(tmp_path), 129, keep=2, max_age_days=30) == 5
    assert [p.name for p in reportfiles.list_reports(str(tmp_path), 129)] == names[8:]
    assert len(reportfiles.list_reports(str(tmp_path))) == 3  # CT 130's is not 129's to prune
