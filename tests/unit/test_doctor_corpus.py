"""`pveclean doctor` on the shared corpus of 41 real container configs
(../shared/corpus/lxc-gpu-configs), against a modelled host: one GPU (nvidia0, PCI
0000:01:00.0, persistence on), nvidiactl and nvidia-modeset on 195, nvidia-uvm on 511 and
nvidia-caps on 236 (the dynamic majors of this host, as /proc/devices would list them), the
userspace and the module of the same version, no VM passing the GPU.

What doctor says of each config is in doctor_corpus.tsv beside this file (the shared
expected.tsv is read-only: its findings column lives here, keyed by the corpus's file name),
one `check@line` per finding, with why each is right. The output is also stable: the same
config read twice gives the same findings in the same order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pveclean.core import doctor
from pveclean.core.doctor import HostFacts, HostGpu, HostNode
from pveclean.core.pci import PciAddress
from pveclean.proxmox import doctorconf
from tests.unit.test_proxmox_corpus import CORPUS, MISSING

TABLE = Path(__file__).with_name("doctor_corpus.tsv")
HOST = HostFacts(
    "550.127.05", "/proc/driver/nvidia/version", "550.127.05",
    (HostNode("nvidia0", 195, 0), HostNode("nvidiactl", 195, 255),
     HostNode("nvidia-modeset", 195, 254), HostNode("nvidia-uvm", 511, 0),
     HostNode("nvidia-uvm-tools", 511, 1), HostNode("nvidia-caps", -1, -1),
     HostNode("nvidia-caps/nvidia-cap1", 236, 1), HostNode("nvidia-caps/nvidia-cap2", 236, 2)),
    frozenset({1, 4, 5, 7, 10, 13, 29, 89, 108, 116, 128, 136, 180, 189, 195, 202, 203, 226,
               236, 237, 238, 245, 511}),
    (HostGpu(0, 0, PciAddress.parse("0000:01:00.0"), True),))


def _table() -> dict[str, tuple[str, str]]:
    out = {}
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            file, found, why = line.split("\t")
            out[file] = (found, why)
    return out


def said(text: str) -> str:
    conf = doctorconf.grant_conf(text, 100)
    if not (conf.grants or any(r.major == doctor.NVIDIA_MAJOR for r in conf.allows)):
        return "-"  # not a GPU container: doctor does not look at it
    got = doctor.ct_findings(conf, HOST, None)
    lines = [f"{f.check}@{f.evidence.split(':')[0].removeprefix('line ')}" for f in got]
    return ",".join(lines) or "ok"


def _files() -> list[str]:
    if CORPUS is None:
        return []
    return sorted(p.name for p in (CORPUS / "configs").glob("*.conf"))


@pytest.mark.skipif(CORPUS is None, reason=MISSING)
def test_every_corpus_config_has_a_row() -> None:
    assert sorted(_table()) == _files() and len(_files()) >= 41


@pytest.mark.skipif(CORPUS is None, reason=MISSING)
@pytest.mark.parametrize("file", _files() or ["none"])
def test_doctor_says_of_each_config_what_the_table_says(file: str) -> None:
    assert CORPUS is not None
    text = (CORPUS / "configs" / file).read_text(encoding="utf-8", errors="replace")
    want, why = _table()[file]
    assert said(text) == want, why
    assert said(text) == said(text)
