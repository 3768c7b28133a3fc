"""core.text: displayed width, padding, the cut of container-controlled text, and safe(): what a
container controls is shown as inert, printable, bounded text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.core.text import ELLIPSIS, char_width, ljust, safe, width


@pytest.mark.parametrize(("ch", "cols"), [
    ("a", 1), ("日", 2), ("Ｗ", 2), ("é", 1), ("\u0301", 0), ("\u20dd", 0), ("한", 2)])
def test_char_width(ch: str, cols: int) -> None:
    assert char_width(ch) == cols


@pytest.mark.parametrize(("s", "cols"), [
    ("", 0), ("abc", 3), ("日本", 4), ("e\u0301", 1), ("a日b", 4)])
def test_width(s: str, cols: int) -> None:
    assert width(s) == cols


@pytest.mark.parametrize(("s", "w", "out"), [
    ("ab", 4, "ab  "), ("日本", 6, "日本  "), ("日本", 3, "日本"), ("abc", 0, "abc"),
    ("e\u0301", 3, "e\u0301  ")])
def test_ljust_pads_to_displayed_columns(s: str, w: int, out: str) -> None:
    assert ljust(s, w) == out


@pytest.mark.parametrize(("value", "limit", "out"), [
    ("abc", 3, "abc"),
    ("abcd", 3, "ab" + ELLIPSIS),
    ("abcd", 1, ELLIPSIS),
    ("abcd", 0, ""),
    ("a\x1b", 0, ""),
    ("日本語", 5, "日本" + ELLIPSIS),
    ("日本語", 4, "日" + ELLIPSIS),  # a wide character never half fits
    ("a\x1bb", 6, "a\\x1bb"),
    ("a\x1bb", 5, "a" + ELLIPSIS),  # cut: the ellipsis needs a column too
    ("a\x1bb", 4, "a" + ELLIPSIS),  # an escape is never split
    ("\U0001f600", 10, "\U0001f600"),  # printable emoji stay
    ("\U000e0001", 20, "\\U000e0001"),  # a format character outside the BMP
    ("\u2028", 20, "\\u2028"),  # line separator
    ("a\\b", None, "a\\\\b"),
    ("", 5, ""),
    (None, 10, "None"),
    (3.5, 10, "3.5"),
])
def test_safe(value: object, limit: int | None, out: str) -> None:
    assert safe(value, limit) == out


def test_safe_default_limit_is_80_columns() -> None:
    assert safe("x" * 80) == "x" * 80
    assert safe("x" * 81) == "x" * 79 + ELLIPSIS
    assert width(safe("日" * 100)) <= 80


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
