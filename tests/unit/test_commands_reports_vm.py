"""`pveclean reports show` of a VM hook's report (kind: vm) shows its values (issue 39: it
failed with an internal error, exit 70, where a container's report is rendered as text)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pveclean.commands.reports import show_one
from pveclean.core.config import Config


def test_a_vm_report_is_shown_as_its_values(tmp_path: Path) -> None:
    doc = {"pveclean_report": 1, "kind": "vm", "vmid": 102, "phase": "pre-start",
           "verdict": "refused", "host": "pve1", "time": "2026-12-06T19:00:00Z",
           "policy": "refuse", "plan": {"decision": "refuse", "blockers": ["CT 129: ..."]}}
    f = tmp_path / "102-pre-start-20261206-190000.yaml"
    f.write_text(yaml.safe_dump(doc))
    out: list[tuple[str, bool]] = []
    show_one(Config(report_dir=str(tmp_path)), ["show", str(f)], False,
             lambda text, err: out.append((text, err)))
    assert json.loads(out[0][0]) == doc and out[1] == (f"report: {f}", True)


def test_a_reset_report_is_shown_as_its_values(tmp_path: Path) -> None:
    doc = {"pveclean_report": 1, "kind": "reset", "asked": "0", "node": "pve1",
           "dry_run": False, "plan": {"decision": "refuse", "blockers": ["GPU 0 ..."]},
           "outcome": "refused", "start": "2026-12-06T19:00:00.000+00:00", "duration_s": 0.2}
    f = tmp_path / "reset-gpu0-20261206-190000.yaml"
    f.write_text(yaml.safe_dump(doc))
    out: list[tuple[str, bool]] = []
    show_one(Config(report_dir=str(tmp_path)), ["show", str(f)], False,
             lambda text, err: out.append((text, err)))
    assert json.loads(out[0][0]) == doc and out[1] == (f"report: {f}", True)
