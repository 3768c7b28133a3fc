"""YAML without PyYAML on every run: the reports pveclean writes, and the plain subset of YAML
its config uses.

Importing PyYAML costs more than a hook's whole run with nothing to clean (its reader and
resolver compile large regular expressions at import), and every run reads the config and
writes a report. tests/test_minyaml.py holds both halves to PyYAML with hypothesis:

- dump(): block style as PyYAML's safe dumper lays it out, for the plain data of a report
  (dict, list, str, int, float, bool, None); PyYAML's loaders read back the same data for
  any string a container can choose. Strings are plain only where nothing in YAML 1.1 could
  read them as another type or as syntax; otherwise single-quoted, or double-quoted with
  escapes where they hold a character that is not printable (or, for a terminal, not
  ASCII). Multi-line text is a literal block when it can be one verbatim. A lone surrogate
  (what os.fsdecode makes of bytes that are not UTF-8) is written as U+FFFD, as pveclean
  decodes /proc text.
- config_entries(): a config's top-level entries, the same as PyYAML's, or None where the
  text goes beyond the subset; PyYAML reads that (and says what is wrong with it).
"""

from __future__ import annotations

import math
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


INDENT = "  "

# Plain: starts with a letter, '_' or '/', so never a number, date, null (~), indicator or
# .inf/.nan; then no ': ', ' #', ':' at the end, or other syntax; one space between words.
_PLAIN = re.compile(r"[A-Za-z_/](?:[A-Za-z0-9_./+@=,()\[\]-]|:(?=[^\s])| (?=[^\s#]))*+")
# YAML 1.1 booleans and nulls, as PyYAML's resolver reads them
_TRUE = frozenset(("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"))
_FALSE = frozenset(("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"))
_NULLS = frozenset(("~", "null", "Null", "NULL"))
_RESERVED = _TRUE | _FALSE | _NULLS
# what YAML 1.1 does not allow unescaped in a stream (the complement of PyYAML's Reader's
# printable set: a small class, where that large one takes milliseconds to compile)
_NON_PRINTABLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")
_SURROGATES = re.compile("[\ud800-\udfff]")  # os.fsdecode's stand-ins for undecodable bytes
_BREAKS = re.compile("[\r\x85\u2028\u2029]")  # line breaks besides \n: only escaped
_ESCAPES = {"\0": "0", "\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f",
            "\r": "r", "\x1b": "e", '"': '"', "\\": "\\", "\x85": "N", "\xa0": "_",
            "\u2028": "L", "\u2029": "P"}


def dump(data: Any, terminal: bool = False) -> str:
    """`data` as a YAML document in block style; for a terminal everything but printable
    ASCII is escaped (bidi overrides and other format characters included)."""
    out: list[str] = []
    if isinstance(data, dict) and data:
        _mapping(data, 0, out, terminal)
    elif isinstance(data, list) and data:
        _sequence(data, 0, out, terminal)
    else:
        out.append(("{}" if isinstance(data, dict) else "[]" if isinstance(data, list)
                    else _scalar(data, terminal)) + "\n")
    return "".join(out)


def _mapping(d: dict[Any, Any], level: int, out: list[str], terminal: bool) -> None:
    pad = INDENT * level
    for k, v in d.items():
        key = _scalar(k, terminal, key=True)
        if len(key) > 1000:  # an implicit key is at most 1024 characters: explicit then
            out.append(f"{pad}? {key}\n{pad}:")
        else:
            out.append(f"{pad}{key}:")
        if isinstance(v, dict) and v:
            out.append("\n")
            _mapping(v, level + 1, out, terminal)
        elif isinstance(v, list) and v:
            out.append("\n")
            _sequence(v, level, out, terminal)  # PyYAML does not indent a mapping's list
        else:
            out.append(" " + _inline(v, level + 1, terminal) + "\n")


def _sequence(items: list[Any], level: int, out: list[str], terminal: bool) -> None:
    pad = INDENT * level
    for v in items:
        if isinstance(v, (dict, list)) and v:
            inner: list[str] = []
            if isinstance(v, dict):
                _mapping(v, level + 1, inner, terminal)
            else:
                _sequence(v, level + 1, inner, terminal)
            # the first line goes on the dash's line: "- key: value", "- - item"
            out.append(f"{pad}- " + "".join(inner)[len(pad) + len(INDENT):])
        else:
            out.append(f"{pad}- " + _inline(v, level + 1, terminal) + "\n")


def _inline(v: Any, level: int, terminal: bool) -> str:
    """A scalar, an empty collection, or a literal block (its lines at `level`)."""
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    if isinstance(v, str) and "\n" in v:
        v = _SURROGATES.sub("\ufffd", v)
        block = _literal(v, INDENT * level, terminal)
        if block is not None:
            return block
    return _scalar(v, terminal)


def _scalar(v: Any, terminal: bool, key: bool = False) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _float(v)
    if not isinstance(v, str):
        raise TypeError(f"cannot write {type(v).__name__} as YAML")
    v = _SURROGATES.sub("\ufffd", v)  # no UTF-8 for them, and libyaml reads no escape of them
    if _PLAIN.fullmatch(v) and v not in _RESERVED:
        return v
    if "\n" not in v and _printable(v, terminal) and not _BREAKS.search(v):
        return "'" + v.replace("'", "''") + "'"
    return _double_quoted(v, terminal)


def _float(f: float) -> str:
    if math.isnan(f):
        return ".nan"
    if math.isinf(f):
        return ".inf" if f > 0 else "-.inf"
    text = repr(f)
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:  # YAML 1.1 floats need a dot: 1e+20 would be a string
        mantissa += ".0"
    if e and exponent[0] not in "+-":
        exponent = "+" + exponent
    return mantissa + (f"e{exponent}" if e else "")


def _printable(s: str, terminal: bool) -> bool:
    if terminal:
        return all(" " <= c <= "~" for c in s)
    return _NON_PRINTABLE.search(s) is None


def _double_quoted(s: str, terminal: bool) -> str:
    parts = ['"']
    for c in s:
        esc = _ESCAPES.get(c)
        if esc is not None:
            parts.append("\\" + esc)
        elif " " <= c <= "~" or (not terminal and c != "\ufeff" and _printable(c, False)):
            parts.append(c)
        elif ord(c) <= 0xFF:
            parts.append(f"\\x{ord(c):02X}")
        elif ord(c) <= 0xFFFF:
            parts.append(f"\\u{ord(c):04X}")
        else:
            parts.append(f"\\U{ord(c):08X}")
    parts.append('"')
    return "".join(parts)


def _literal(s: str, pad: str, terminal: bool) -> str | None:
    """`|` text kept verbatim, or None where a literal block cannot hold `s` exactly: a
    character to escape, a leading space (it would set the indentation), a trailing space
    or a text of line breaks only."""
    body = s.rstrip("\n")
    if (not body or body.lstrip("\n")[0] == " "
            or not _printable(s.replace("\n", ""), terminal) or _BREAKS.search(s)
            or "\t" in s or any(line.endswith(" ") for line in body.split("\n"))):
        return None
    trailing = len(s) - len(body)
    chomp = "-" if trailing == 0 else ("" if trailing == 1 else "+")
    lines = [(pad + line) if line else "" for line in body.split("\n")]
    return f"|{chomp}\n" + "\n".join(lines) + "\n" * max(trailing - 1, 0)


# ---- reading: the plain subset a config uses ---------------------------------------------
# A key, then its value: nothing, a scalar, and an optional comment after a space.
_KEY_LINE = re.compile(r"(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_-]*+):(?: +(?P<rest>.*))?")
_ITEM_LINE = re.compile(r"(?P<indent> *)- +(?P<rest>.*)")
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # tabs and CRs included
_SKIP = re.compile(r" *(?:#.*)?")  # blank or comment-only
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*+)")
_FLOAT = re.compile(r"[-+]?[0-9]++\.[0-9]++")
_NOT_STR_START = frozenset("-+0123456789.<~=?:,[]{}#&*!|>'\"%@`")  # types and indicators


class _Beyond(Exception):
    """The text uses YAML beyond the plain subset: PyYAML decides."""


def config_entries(text: str) -> list[tuple[str, int, Any]] | None:
    """A config's top-level (key, line, value) entries, as PyYAML's safe loader reads them,
    when the text keeps to the plain subset a config needs: `key: scalar`, and under a key
    either `- scalar` items or `subkey: scalar` entries, with comments and blank lines.
    None for anything else (flow style, anchors, tags, multi-line or escaped scalars,
    numbers YAML 1.1 reads in other bases, tabs...): PyYAML reads that, and says what
    is wrong with it. tests/test_minyaml.py holds the two to the same result."""
    if not text.isascii() or _CONTROL.search(text):
        return None  # PyYAML says what is wrong with a control character, or reads Unicode
    lines = text.split("\n")
    try:
        return _entries(lines)
    except _Beyond:
        return None


def _entries(lines: list[str]) -> list[tuple[str, int, Any]]:
    out: list[tuple[str, int, Any]] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if _SKIP.fullmatch(line):
            i += 1
            continue
        m = _KEY_LINE.fullmatch(line)
        if m is None or m["indent"] or m["key"] in _RESERVED:
            raise _Beyond
        key, lineno, rest = m["key"], i + 1, _strip_comment(m["rest"] or "")
        i += 1
        block_start = i
        while i < n and (_SKIP.fullmatch(lines[i]) or lines[i].startswith((" ", "-"))):
            i += 1
        block = [(j + 1, lines[j]) for j in range(block_start, i) if not _SKIP.fullmatch(lines[j])]
        if rest:
            if block:
                raise _Beyond  # a continued scalar, or a mapping where a scalar was
            out.append((key, lineno, _scalar_value(rest)))
        else:
            out.append((key, lineno, _block(block)))
    return out


def _block(block: list[tuple[int, str]]) -> Any:
    """The value of a key with nothing after its colon: null, or a list or mapping of scalars."""
    if not block:
        return None
    indent = len(block[0][1]) - len(block[0][1].lstrip(" "))
    if block[0][1][indent] == "-":
        items = []
        for _, line in block:
            m = _ITEM_LINE.fullmatch(line)
            if m is None or len(m["indent"]) != indent:
                raise _Beyond
            items.append(_scalar_value(_strip_comment(m["rest"])))
        return items
    if indent == 0:
        raise _Beyond
    mapping: dict[str, Any] = {}
    for _, line in block:
        m = _KEY_LINE.fullmatch(line)
        if (m is None or len(m["indent"]) != indent or m["key"] in mapping
                or m["key"] in _RESERVED or not m["rest"]):
            raise _Beyond
        rest = _strip_comment(m["rest"])
        if not rest:
            raise _Beyond
        mapping[m["key"]] = _scalar_value(rest)
    return mapping


def _strip_comment(rest: str) -> str:
    """`rest` without a trailing comment; quoted scalars keep their '#'."""
    rest = rest.strip(" ")
    if rest.startswith(("'", '"')):
        q = rest[0]
        end = rest.find(q, 1)
        if q == "'":
            while end != -1 and rest[end + 1:end + 2] == "'":
                end = rest.find(q, end + 2)
        if end == -1:
            raise _Beyond  # a quoted scalar that goes on to the next line
        tail = rest[end + 1:]
        if (tail.strip(" ") and not tail.lstrip(" ").startswith("#")) or tail[:1] == "#":
            raise _Beyond  # more after the closing quote, or a comment without a space
        return rest[: end + 1]
    if rest.startswith("#"):
        return ""
    cut = rest.find(" #")
    return (rest if cut == -1 else rest[:cut]).rstrip(" ")


def _scalar_value(s: str) -> Any:
    """A one-line scalar as YAML 1.1 resolves it, where there is no doubt what it is."""
    if not s:
        raise _Beyond  # an item with nothing after its dash
    if s[0] == "'":
        return s[1:-1].replace("''", "'")
    if s[0] == '"':
        if "\\" in s:
            raise _Beyond  # escapes: PyYAML reads them
        return s[1:-1]
    if ": " in s or s.endswith(":"):
        raise _Beyond  # a mapping where a scalar was
    if s in _NULLS:
        return None
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    if _INT.fullmatch(s):
        return int(s)
    if _FLOAT.fullmatch(s):
        return float(s)
    if s[0] in _NOT_STR_START:
        raise _Beyond  # other numbers, dates, .inf, merge keys, indicators
    return s
