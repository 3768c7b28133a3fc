"""Redaction of a report: the configured patterns over every string a container can
influence, each value cut first so that the time stays bounded for any pattern."""

from __future__ import annotations

import dataclasses
import re
from enum import Enum

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing's import alone cost a hook run 2 ms (nothing else there needs it)
    from typing import TypeVar

    T = TypeVar("T")


MAX_VALUE = 64 << 10  # characters of one string value in a report


class Redactor:
    """Applies the configured patterns: a match's first group is kept, the rest becomes ***.
    Each value is cut to MAX_VALUE first, so the time stays bounded for any pattern. Verdicts
    and outcomes are pveclean's own words and stay as they are."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = [re.compile(p) for p in patterns]

    def text(self, s: str) -> str:
        if len(s) > MAX_VALUE:
            s = s[: MAX_VALUE - 1] + "…"
        for p in self.patterns:
            s = p.sub(self._replace, s)
        return s

    @staticmethod
    def _replace(m: re.Match[str]) -> str:
        head = (m.group(1) or "") if m.re.groups else ""
        tail = (m.group("tail") or "") if "tail" in m.re.groupindex else ""
        return f"{head}***{tail}"

    def argv(self, args: tuple[str, ...]) -> tuple[str, ...]:
        """A command line: the patterns run over its arguments joined by spaces, as it was
        typed (`--token s3cret` is two arguments), and each argument keeps its bounds: what
        a match hides becomes *** in each argument it covers. MAX_VALUE characters in all."""
        kept: list[str] = []
        total = 0
        for a in args:
            if total + len(a) >= MAX_VALUE:
                kept.append(a[: max(MAX_VALUE - 1 - total, 0)] + "…")
                break
            kept.append(a)
            total += len(a) + 1
        line = " ".join(kept)
        hidden = bytearray(len(line))
        for p in self.patterns:
            for m in p.finditer(line):
                hidden[m.start() : m.end()] = b"\1" * (m.end() - m.start())
                for g in (1 if p.groups else None, p.groupindex.get("tail")):
                    if g is not None and m.start(g) >= 0:
                        hidden[m.start(g) : m.end(g)] = bytes(m.end(g) - m.start(g))
        out, at = [], 0
        for a in kept:
            parts = [ch if not hidden[at + i] else "" if i and hidden[at + i - 1] else "***"
                     for i, ch in enumerate(a)]
            out.append("".join(parts))
            at += len(a) + 1
        return tuple(out)

    def value(self, v: T) -> T:
        """`v` (a report, a record, a list, a string...) with every string redacted."""
        return self._value(v)  # type: ignore[return-value]  # _value keeps v's shape

    def _value(self, v: object) -> object:
        if isinstance(v, Enum):
            return v
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, tuple) and all(isinstance(x, str) for x in v):
            return self.argv(v)  # a command line (Holder.argv)
        if isinstance(v, dict):
            return {k: self._value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self._value(x) for x in v]
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.replace(v, **{f.name: self._value(getattr(v, f.name))
                                             for f in dataclasses.fields(v) if f.init})
        return v
