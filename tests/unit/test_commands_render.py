"""text.safe: what a container controls is shown as inert, printable, bounded text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.commands.render import holders_table
from pveclean.core.text import safe, width
from pveclean.host.notify import label


def test_control_and_bidi_characters_are_escaped() -> None:
    assert safe("a\x1b[2J\x1b[31m X") == "a\\x1b[2J\\x1b[31m X"
    assert safe("\x9b31m") == "\\x9b31m"  # C1 CSI
    assert safe("x\x7f") == "x\\x7f"
    assert safe("ab\u202ecd\u2066") == "ab\\u202ecd\\u2066"
    assert safe("tab\there\nnl") == "tab\\x09here\\x0anl"
    assert safe("a\\x1b") == "a\\\\x1b"  # a literal backslash cannot forge an escape
    assert safe("über 日本") == "über 日本"
    assert safe(129) == "129"


def test_long_values_are_cut_by_displayed_width() -> None:
    assert safe("x" * 100, 10) == "x" * 9 + "…"
    assert width(safe("日本" * 50, 10)) <= 10 and safe("日本" * 50, 10).endswith("…")
    assert safe("\x1b" * 100, 10) == "\\x1b\\x1b…"  # escapes are never split
    assert safe("x" * 100, None) == "x" * 100
    assert len(safe("a" * 10**7)) == 80  # a huge value costs no more than its cut


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=1, max_value=120))
def test_output_is_printable_and_bounded(s: str, limit: int) -> None:
    out = safe(s, limit)
    assert out.isprintable()
    assert width(out) <= limit
    assert safe(s, None).isprintable()


def test_metrics_label_is_escaped() -> None:
    assert label('a"b\\c\nd') == 'a\\"b\\\\c\\x0ad'


def test_table_alignment_counts_displayed_width() -> None:
    rep = {"holders": [
        {"host_pid": 1, "ct_pid": 2, "name": "日本語", "devices": ["/dev/nvidia0 (195:0)"],
         "outcome": "killed", "signals": []},
        {"host_pid": 3, "ct_pid": 4, "name": "a\x1bb", "devices": ["/dev/nvidia1 (195:1)"],
         "outcome": "killed", "signals": []},
    ]}
    lines = holders_table(rep)
    cols = [width(ln[: ln.index("/dev/nvidia")]) for ln in lines[1:]]
    assert cols[0] == cols[1] == width(lines[0][: lines[0].index("DEVICES")])
