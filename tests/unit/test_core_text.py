"""core.text: displayed width, padding and the cut of container-controlled text."""

from __future__ import annotations

import pytest

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
