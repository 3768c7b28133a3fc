"""core/metrics_xid and commands/xids: the Xid counts as pveclean_gpu_xid_total, the lines
`gpus` shows; the series parse as Prometheus' client parses them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pveclean.commands import xids
from pveclean.core import metrics, metrics_xid
from pveclean.core.config import Config
from pveclean.core.owners import HOST, UNKNOWN, Owner, OwnerKind
from pveclean.core.xid import KmsgRecord
from pveclean.core.xidlog import XidLog, fold
from tests.gpumaps import use

CT129 = Owner(OwnerKind.CT, 129)


def _rec(seq: int, msg: str) -> KmsgRecord:
    return KmsgRecord(0, 3, seq, seq, "-", msg)


def _log() -> XidLog:
    recs = [_rec(0, "NVRM: Xid (PCI:0000:3b:00): 48, pid=10, name=python3, DBE"),
            _rec(1, "NVRM: Xid (PCI:0000:3b:00): 48, pid=10, name=python3, DBE"),
            _rec(2, "NVRM: Xid (PCI:0000:3b:00): 13, pid=11, name=x, Graphics Exception"),
            _rec(3, "NVRM: Xid (PCI:0000:99:00): 79, pid='<unknown>', name=<unknown>, gone"),
            _rec(4, "NVRM: Xid (something new)")]
    return fold(XidLog(), "b", recs, {10: CT129, 11: HOST})[0]


def test_the_counter_by_gpu_owner_xid_and_action() -> None:
    gpus = [use(0, "0000:3b:00.0", uuid="GPU-aaa")]
    text = metrics.render(metrics_xid.families(_log(), gpus, "pve1"))
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}
    got = {(s.labels["gpu"], s.labels["UUID"], s.labels["id"], s.labels["xid"],
            s.labels["action"]): s.value for s in fams["pveclean_gpu_xid"]}
    assert got == {("0", "GPU-aaa", "lxc/129", "48", "reset"): 2,
                   ("0", "GPU-aaa", "node/pve1", "13", "app"): 1,
                   ("0000:99:00", "", "unknown", "79", "reboot"): 1}
    assert fams["pveclean_xid_unparsed"][0].value == 1
    assert "pveclean_xid_records_lost" not in fams  # nothing lost: no series


def test_gpus_lines_and_the_reset_advice() -> None:
    lines = xids.gpu_lines(_log(), [use(0, "0000:3b:00.0"), use(1, "0000:3c:00.0")])
    assert list(lines) == [0] and len(lines[0]) == 3
    assert lines[0][0] == "Xid 48 (reset) on 0000:3b:00: pid 10 python3, CT 129: DBE"
    assert "pveclean reset" in xids.advice(_log().last_on("0000:3b:00")[0].action)
    pending = _log().needs_reset("0000:3b:00")  # an app fault after it changes nothing
    assert pending is not None and pending.xid.xid == 48
    assert _log().reset_done("0000:3b:00").needs_reset("0000:3b:00") is None
    assert _log().needs_reset("0000:99:00") is not None
    assert fold(_log(), "another boot", [], {})[0].needs_reset("0000:99:00") is None
    assert UNKNOWN.label == "unknown"


def test_gpus_section_reads_and_saves_nothing(tmp_path: Path) -> None:
    from tests.gpumaps import gmap
    from tests.harness.kmsg import Kmsg

    Kmsg(tmp_path / "kmsg").xid(pci="0000:3b:00", xid=95, pid="unknown", name="<unknown>",
                                text="Uncontained ECC error")
    cfg = dataclasses.replace(Config(), kmsg_path=str(tmp_path / "kmsg"),
                              state_dir=str(tmp_path / "state"))
    text, doc = xids.gpus_section(cfg, gmap([use(0, "0000:3b:00.0"), use(1, "0000:3c:00.0")]))
    assert "GPU 0: Xid 95 (reset) on 0000:3b:00: pid ?, unknown process: Uncontained" in text
    assert "`pveclean reset 0 --dry-run`" in text and list(doc) == ["0"]
    assert not (tmp_path / "state").exists()
    assert xids.gpus_section(cfg, gmap([use(1, "0000:3c:00.0")])) == ("", {})
