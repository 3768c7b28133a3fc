"""core/reportread: the one reader of the report format. A report pveclean wrote reads back to
the same document; older reports (a command line as one string, keys missing) still read; what
is no container's report is said so, in one line."""

from __future__ import annotations

import pytest

from pveclean.commands.render import render_report, reports_table
from pveclean.core.records import Sent, Sig
from pveclean.core.reportread import UnreadableReport, from_dict, row_of, sent_of
from pveclean.core.verdicts import Outcome, Verdict

OLD = {"pveclean": "0.9", "vmid": 129, "phase": "post-stop", "host": "pve",
       "start": "2026-05-28T20:00:00.000+00:00", "duration_s": 1, "dry_run": False,
       "verdict": "leaked", "summary": {"holders": 1, "stopped": 1, "freed_mib": 10},
       "holders": [{"host_pid": 5, "name": "python3", "cmdline": "python3 -m x",
                    "outcome": "killed", "signals": ["SIGTERM +0.001s"], "state": "S (frozen)",
                    "gpu_memory_mib": {"0": 10}}],
       "leaks": [{"index": 0, "uuid": "GPU-a", "unaccounted_mib": 900, "hint": "reset"},
                 "… 2 more not listed"]}


def test_an_older_report_reads_leniently() -> None:
    rep = from_dict(OLD)
    assert rep.verdict is Verdict.LEAKED and rep.summary.freed_mib == 10
    h = rep.holders[0]
    assert h.argv == ("python3 -m x",) and h.outcome is Outcome.KILLED
    assert h.signals == [Sent(Sig.TERM, 0.001)] and h.gpu_memory_mib == {0: 10}
    assert h.as_dict()["state"] == "S (frozen)"  # shown as it was written
    assert rep.leaks is not None and [x.unaccounted_mib for x in rep.leaks] == [900]
    assert rep.settings is None and rep.sources == {} and rep.unit_stops is None
    assert "python3 -m x" in render_report(rep)


def test_signal_lines_read_back_as_they_were_written() -> None:
    for sent in (Sent(Sig.KILL, 10.5, "No such process"), Sent(Sig.TERM, 0.0),
                 Sent(note="exited before it was signalled")):
        assert sent_of(str(sent)) == sent


@pytest.mark.parametrize(("doc", "why"), [
    ({"pveclean_report": 1, "kind": "vm", "vmid": 102, "phase": "pre-start",
      "verdict": "handed-off", "time": "x"}, "not the report of a container's run"),
    ({"vmid": "x", "phase": "manual", "verdict": "clean", "start": "s"}, "unreadable vmid"),
    ({"vmid": 1, "phase": "manual", "verdict": "sparkling", "start": "s"}, "verdict"),
])
def test_what_is_no_containers_report_is_said_so(doc: dict[str, object], why: str) -> None:
    with pytest.raises(UnreadableReport, match=why):
        from_dict(doc)


def test_any_report_lists_as_a_row() -> None:
    vm = {"kind": "vm", "vmid": 102, "phase": "pre-start", "verdict": "handed-off",
          "time": "2026-12-06T22:01:02.003+00:00"}
    reset = {"pveclean_report": 1, "kind": "reset", "asked": "0", "outcome": "refused",
             "start": "2026-12-06T22:03:04.005+00:00", "duration_s": 0.25}
    lines = reports_table([row_of("129-post-stop-x.yaml", OLD), row_of("102-vm.yaml", vm),
                           row_of("reset-gpu0-x.yaml", reset), row_of("odd.yaml", {})])
    assert lines[1].split()[:6] == ["2026-05-28", "20:00:00", "129", "post-stop", "leaked",
                                    "1/1"]
    assert lines[2].split()[:6] == ["2026-12-06", "22:01:02", "102", "pre-start", "handed-off",
                                    "0/0"]
    assert lines[3].split()[:7] == ["2026-12-06", "22:03:04", "-", "reset", "refused", "0/0",
                                    "0"]
    assert lines[4].split()[:4] == ["?", "?", "?", "?"]
