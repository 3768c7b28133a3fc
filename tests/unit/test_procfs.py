"""/proc parsing: stat and status, the keys a scan needs, fuzzing, and NVIDIA's majors."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.host import devnodes, procfs


def test_stat_and_status_parsing() -> None:
    stat = "123 (we ird) name)) S 1 123 123 0 -1 4194560 " + " ".join(["0"] * 12) + " 98765 0"
    assert procfs.parse_stat(stat) == ("S", 1, 98765)
    assert procfs.parse_stat("garbage") is None
    st = procfs.parse_status("Name:\tpython3\nNSpid:\t4242\t17\t2\nUid:\t0\t0\t0\t0\n")
    assert st["NSpid"] == "4242\t17\t2" and st["Name"] == "python3"


def test_status_parsing_of_the_needed_keys_matches_the_whole_parse() -> None:
    for pid in ("self", "1"):
        text = Path(f"/proc/{pid}/status").read_text()
        whole = procfs.parse_status(text)
        assert procfs.parse_status(text, procfs.STATUS_KEYS) == {
            k: whole[k] for k in procfs.STATUS_KEYS}
    assert procfs.read_status(os.getpid()) == procfs.read_status(os.getpid())
    st = procfs.read_status(os.getpid())
    assert st is not None and st.nspid[0] == os.getpid() and st.uid == os.getuid()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_proc_parsers_never_crash(text: str) -> None:
    procfs.parse_stat(text)
    procfs.parse_status(text)


def test_nvidia_majors_from_proc_devices(tmp_path: Path) -> None:
    f = tmp_path / "devices"
    f.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n"
                 "508 nvidia-uvm\n509 nvidia-caps\n10 misc\n\nBlock devices:\n 259 nvidia-x\n")
    assert devnodes.nvidia_majors(str(f)) == frozenset({195, 508, 509})
