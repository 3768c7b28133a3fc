"""Container-controlled text made safe for a terminal, a log line or a metrics label.

A container's root chooses process names, command lines, fd paths and cgroup names, and the
probe's whole output. None of it may reach a terminal, the task log or syslog as anything but
inert, printable text: control characters (C0, C1, DEL), bidi overrides and every other
non-printable code point are shown escaped (``\\x1b``, ``\\u202e``), a backslash as ``\\\\``
so that an escape cannot be forged, and long values are cut with ``…``. Reports (YAML/JSON)
keep the exact value; only what is displayed goes through here.
"""

from __future__ import annotations

import unicodedata

TYPE_CHECKING = False



ELLIPSIS = "…"


def _escape(ch: str) -> str:
    o = ord(ch)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def char_width(ch: str) -> int:
    """Terminal columns of one printable character: 0 for combining marks, 2 for wide."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def width(s: str) -> int:
    """Displayed width of a string that is already safe (see `safe`)."""
    if s.isascii():
        return len(s)
    return sum(char_width(c) for c in s)


def ljust(s: str, w: int) -> str:
    """`s` padded with spaces to `w` displayed columns."""
    return s + " " * max(0, w - width(s))


def safe(value: object, limit: int | None = 80) -> str:
    """`value` as pure printable text: non-printables escaped, cut to `limit` columns."""
    s = value if isinstance(value, str) else str(value)
    if s.isascii() and s.isprintable() and "\\" not in s:
        if limit is None or len(s) <= limit:
            return s
        return s[: max(limit - 1, 0)] + ELLIPSIS if limit > 0 else ""
    parts: list[str] = []
    used = 0
    for ch in s:
        if ch == "\\":
            part = "\\\\"
        elif ch.isprintable():
            part = ch
        else:  # Cc, Cf (bidi controls, zero-width), Cs, Co, Cn, Zl, Zp, Zs but " "
            part = _escape(ch)
        w = width(part)
        if limit is not None and used + w > limit:
            # cut: keep what fits in limit - 1 columns, then the ellipsis
            if limit <= 0:
                return ""
            while parts and used > limit - 1:
                used -= width(parts.pop())
            return "".join(parts) + ELLIPSIS
        parts.append(part)
        used += w
    return "".join(parts)


def fit(shown: str, limit: int) -> str:
    """Text already made safe (by safe(), piece by piece) cut to `limit` columns, never
    escaped again: a backslash escaped twice would make a unit name pasted into a shell
    wrong."""
    if width(shown) <= limit:
        return shown
    out: list[str] = []
    used = 0
    for ch in shown:
        w = char_width(ch)
        if used + w > limit - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + ELLIPSIS
