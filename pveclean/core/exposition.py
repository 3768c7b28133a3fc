"""Prometheus' text exposition format (0.0.4), pure: families grouped each under its own HELP
and TYPE, label values escaped as the format says (only backslash, double quote and newline),
values in base units; and our own textfile read back (`parse`), so that its counters go on
across runs.

Node_exporter's textfile collector and prometheus_client's parser read what this writes; a
series' labels are always the same within a family (the parser and Prometheus take a family
whose series differ in labels, but joins and `sum by` over them silently lose series)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pveclean.core.lazyre import lazy

MIB = 1 << 20
MAX_LABEL = 256  # characters of one label value: a container's text cannot bloat the file
_NAME = lazy(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = lazy(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass
class Family:
    """One metric family: its name (a counter's ends in `_total`), kind, help, label names,
    and its samples keyed by the label values in that order."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]
    samples: dict[tuple[str, ...], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or self.kind not in ("gauge", "counter"):
            raise ValueError(f"not a metric family: {self.name} {self.kind}")
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"a counter's name ends in _total: {self.name}")
        if not all(_LABEL.fullmatch(x) and not x.startswith("__") for x in self.labels):
            raise ValueError(f"bad label names of {self.name}: {self.labels}")

    def set(self, value: float, *label_values: object) -> None:
        if len(label_values) != len(self.labels):
            raise ValueError(f"{self.name} has labels {self.labels}, given {label_values}")
        self.samples[tuple(cut(v) for v in label_values)] = value

    def add(self, value: float, *label_values: object) -> None:
        key = tuple(cut(v) for v in label_values)
        self.set(self.samples.get(key, 0.0) + value, *key)


def cut(value: object) -> str:
    """A label value: text, at most MAX_LABEL characters (escaping comes at the output)."""
    text = str(value)
    return text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 1] + "…"


def escape_label(value: str) -> str:
    """The format's three escapes in a label value, and nothing else."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: float) -> str:
    """A sample value: integers without a fraction, NaN and infinities as the format spells
    them, other floats in Python's shortest round-trip form."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def render(families: Iterable[Family]) -> str:
    """The exposition text: each family once, its HELP and TYPE right before its samples,
    samples in a stable order; a family without samples is left out."""
    out: list[str] = []
    seen: set[str] = set()
    for fam in families:
        if fam.name in seen:
            raise ValueError(f"family {fam.name} given twice")
        seen.add(fam.name)
        if not fam.samples:
            continue
        out.append(f"# HELP {fam.name} {escape_help(fam.help)}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        for key in sorted(fam.samples):
            labels = ",".join(f'{n}="{escape_label(v)}"' for n, v in zip(fam.labels, key,
                                                                         strict=True))
            out.append(f"{fam.name}{{{labels}}} {number(fam.samples[key])}" if labels
                       else f"{fam.name} {number(fam.samples[key])}")
    return "\n".join(out) + "\n" if out else ""


_SAMPLE = lazy(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?")
_PAIR = lazy(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of an exposition text (comments skipped): what is needed to carry our own
    counters over to the next write. A line this cannot read is skipped, never guessed."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line.strip())
        if not m:
            continue
        labels: dict[str, str] = {}
        body = m.group(2) or ""
        pos = 0
        while pos < len(body):
            p = _PAIR.match(body, pos)
            if not p or p.end() == pos:
                labels = {"": ""}  # unreadable: dropped below
                break
            labels[p.group(1)] = _unescape(p.group(2))
            pos = p.end()
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if "" not in labels:
            out.append((m.group(1), labels, value))
    return out
