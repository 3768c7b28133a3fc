"""render's one table: columns padded by displayed width, right-aligned where asked (gpus'
MiB), no trailing spaces."""

from __future__ import annotations

from pveclean.commands.render import _table


def test_columns_are_two_spaces_apart_and_lines_have_no_trailing_spaces() -> None:
    rows = [("OWNER", "MiB", "NAME"), ("CT 129", "18,000", "python3"), ("host", "512", "")]
    assert _table(rows, "  ", right={1}) == [
        "  OWNER      MiB  NAME",
        "  CT 129  18,000  python3",
        "  host       512",
    ]
    assert _table(rows) == [
        "OWNER   MiB     NAME",
        "CT 129  18,000  python3",
        "host    512",
    ]


def test_a_wide_character_takes_two_columns_left_or_right() -> None:
    rows = [("NAME", "MiB", "X"), ("\u8a13\u7df4", "1", "a"), ("ab", "\u5168", "b")]
    assert _table(rows, right={1}) == [
        "NAME  MiB  X",
        "\u8a13\u7df4    1  a",
        "ab     \u5168  b",
    ]
