"""commands/render: tables aligned by displayed width, and what containers control shown
escaped."""

from __future__ import annotations

from pveclean.commands import gpuview
from pveclean.commands.render import holders_table
from pveclean.commands.table import table
from pveclean.core.records import Sent, Sig
from pveclean.core.text import width
from tests.reportkit import holder, report


def test_table_alignment_counts_displayed_width() -> None:
    rep = report(holders=[
        holder(1, "killed", ct_pid=2, name="日本語", devices=["/dev/nvidia0 (195:0)"]),
        holder(3, "killed", ct_pid=4, name="a\x1bb", devices=["/dev/nvidia1 (195:1)"]),
    ])
    lines = holders_table(rep)
    # each row's DEVICES value is one character ("0", "1"): where it starts
    cols = [width(ln[: ln.index(" killed")].rstrip()[:-1]) for ln in lines[1:]]
    assert cols[0] == cols[1] == width(lines[0][: lines[0].index("DEVICES")])


def test_the_table_names_nvidia_nodes_short_and_other_paths_whole() -> None:
    h = holder(7, "killed", ct_pid=8, name="python3",
               devices=["/dev/nvidia0 (195:0)", "/dev/nvidiactl (195:255)",
                        "/dev/nvidia-uvm (511:0)", "/opt/g (mmap 195:1)"],
               signals=[Sent(Sig.TERM, 0.0), Sent(Sig.KILL, 2.0), Sent(note="null signal")])
    _head, row = holders_table(report(holders=[h]))
    assert row.split()[-3:] == ["0,ctl,uvm,/opt/g", "killed", "TERM,KILL"], row
    assert len(row) <= 80


def test_render_escapes_what_containers_control() -> None:
    from pveclean.core.gpumap import GpuHolding
    from pveclean.core.owners import Owner, OwnerKind
    from tests.gpumaps import gmap, proc, use

    p = proc(5, "ct", 129, name="evil\x1b[2J", ct_pid=2, cgroup="/lxc/129/ns",
             devices=("/dev/nvidia0\n (195:0)",), memory={0: 10})
    data = gmap([use(0, None, [GpuHolding(p, 10)], name="G\x07", uuid="U", total=100,
                     used=10, reserved=1, by_owner=[(Owner(OwnerKind.CT, 129), 10)])],
                other=[proc(5, "ct", 129, name="x\r\x1b]0;t\x07", ct_pid=2,
                            devices=("/dev/nvidia0\n (195:0)",))],
                hostnames={129: "h\x1b[31m"}, scanned=[129], seconds=0.01)
    text = gpuview.render_gpus(data)
    assert not any(c in text for c in "\x1b\x07\r")
    assert "evil\\x1b[2J" in text and "h\\x1b[31m" in text


def test_columns_are_two_spaces_apart_and_lines_have_no_trailing_spaces() -> None:
    rows = [("OWNER", "MiB", "NAME"), ("CT 129", "18,000", "python3"), ("host", "512", "")]
    assert table(rows, "  ", right={1}) == [
        "  OWNER      MiB  NAME",
        "  CT 129  18,000  python3",
        "  host       512",
    ]
    assert table(rows) == [
        "OWNER   MiB     NAME",
        "CT 129  18,000  python3",
        "host    512",
    ]


def test_a_wide_character_takes_two_columns_left_or_right() -> None:
    rows = [("NAME", "MiB", "X"), ("\u8a13\u7df4", "1", "a"), ("ab", "\u5168", "b")]
    assert table(rows, right={1}) == [
        "NAME  MiB  X",
        "\u8a13\u7df4    1  a",
        "ab     \u5168  b",
    ]
