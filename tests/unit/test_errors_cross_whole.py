"""The callers of a worker say an error that crossed it as before: a report that cannot be
written is its own message (the ReportError's text, no type name in front), in a container's
run (cleanup.finish) and in the VM hook's report (vmhook._finish)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pveclean import cleanup
from pveclean.commands import vmhook
from pveclean.core.config import Config
from pveclean.core.report import Stamp, busy_report
from pveclean.core.vmreport import VmReport, VmVerdict
from pveclean.errors import ExitCode
from pveclean.host import reportfiles
from pveclean.host.clock import start_deadline


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    (tmp_path / "file").write_text("")  # a report dir under a file cannot be made
    return replace(Config(), report_dir=str(tmp_path / "file" / "reports"),
                   state_dir=str(tmp_path / "state"), syslog=False,
                   journal_socket=str(tmp_path / "no-journal"))


def test_a_run_s_report_that_cannot_be_written_says_why_in_its_own_words(
        cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reportfiles, "write_spare", lambda *_a, **_k: None)
    rep = busy_report(Stamp("0", "host", 1.0, 0.1), 129, "ct", False, [], "held")
    res = cleanup.finish(rep, cfg, deadline=start_deadline(5))
    assert res.report_error is not None
    assert res.report_error.startswith(f"cannot create report dir {cfg.report_dir}: ")
    assert res.exit_code == ExitCode.BUSY  # the higher of busy and report


def test_the_vm_hook_s_report_that_cannot_be_written_says_why_in_its_own_words(
        cfg: Config, capsys: pytest.CaptureFixture[str]) -> None:
    record = VmReport(200, "pre-start", "host", 0.0, cfg.vm_gpu_policy)
    code = vmhook._finish(cfg, record, VmVerdict.CLEAR, ExitCode.OK, deadline=start_deadline(5))
    out = capsys.readouterr().out
    assert code == ExitCode.OK
    assert out.startswith("pveclean: VM 200 pre-start: clear; WARNING: report not written: "
                          f"cannot create report dir {cfg.report_dir}: "), out
