"""Prometheus' text exposition format (0.0.4), pure: families grouped each under its own HELP
and TYPE, label values escaped as the format says (only backslash, double quote and newline),
values in base units; our own textfile read back so that its counters go on across runs; and
the series of one cleanup run (counters by container, phase and verdict, the last outcome per
container and phase).

Node_exporter's textfile collector and prometheus_client's parser read what this writes; a
series' labels are always the same within a family (the parser and Prometheus take a family
whose series differ in labels, but joins and `sum by` over them silently lose series)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pveclean.core.verdicts import VERDICTS, Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MIB = 1 << 20
MAX_LABEL = 256  # characters of one label value: a container's text cannot bloat the file
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


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


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?")
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


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


# ---- one cleanup run ----------------------------------------------------------------------
RUN_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "pveclean_runs_total": ("counter", "Cleanup runs on a container, by phase and verdict.",
                            ("id", "phase", "verdict")),
    "pveclean_holders_stopped_total": ("counter", "GPU holders stopped on a container.",
                                       ("id",)),
    "pveclean_freed_bytes_total": ("counter", "GPU memory freed on a container.", ("id",)),
    "pveclean_last_verdict": ("gauge", "1 for the verdict of the last run on a container in "
                              "a phase, 0 for the others.", ("id", "phase", "verdict")),
    "pveclean_last_run_timestamp_seconds": ("gauge", "When the last run on a container in a "
                                            "phase ended (Unix time).", ("id", "phase")),
    "pveclean_last_run_duration_seconds": ("gauge", "Wall time of the last run on a container "
                                           "in a phase.", ("id", "phase")),
    "pveclean_last_holders_stopped": ("gauge", "GPU holders stopped by the last run on a "
                                      "container in a phase.", ("id", "phase")),
    "pveclean_last_residual_holders": ("gauge", "GPU holders that survived the last run on a "
                                       "container in a phase.", ("id", "phase")),
    "pveclean_last_freed_bytes": ("gauge", "GPU memory freed by the last run on a container "
                                  "in a phase.", ("id", "phase")),
    "pveclean_last_leaked_bytes": ("gauge", "GPU memory no process accounts for after the "
                                   "last run on a container in a phase.", ("id", "phase")),
}
_LAST = {n for n, (kind, _h, _l) in RUN_FAMILIES.items() if kind == "gauge"}


def guest_id(vmid: object, kind: str = "lxc") -> str:
    """A guest as prometheus-pve-exporter names it (`lxc/129`, `qemu/102`)."""
    return f"{kind}/{vmid}"


def survived(rep: Mapping[str, Any]) -> int:
    """Holders that survived: counted in the summary (a report lists only some, see
    core/bounds.py), else in the holders listed."""
    counted = (rep.get("summary") or {}).get("outcomes", {}).get(str(Outcome.SURVIVED))
    if isinstance(counted, int):
        return counted
    return sum(1 for h in rep.get("holders", []) if h.get("outcome") == Outcome.SURVIVED)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _num(value: object) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(float(value)) else 0.0  # type: ignore[arg-type]


def run_families(rep: Mapping[str, Any], now: float,
                 old: Iterable[tuple[str, dict[str, str], float]] = ()) -> list[Family]:
    """The textfile after a run: `old` (the file's samples) with this run's counters added
    and its container's last-run gauges for its phase replaced. Samples of other families,
    or with other labels than ours (an older layout), are dropped."""
    fams = {n: Family(n, kind, hlp, labels) for n, (kind, hlp, labels) in RUN_FAMILIES.items()}
    ident, phase = guest_id(rep["vmid"]), cut(rep["phase"])
    for name, labels, value in old:
        fam = fams.get(name)
        if fam is None or set(labels) != set(fam.labels) or not math.isfinite(value):
            continue
        key = tuple(labels[x] for x in fam.labels)
        if name in _LAST and (labels["id"], labels["phase"]) == (ident, phase):
            continue
        fam.set(value, *key)
    s = rep.get("summary") or {}
    stopped = _int(s.get("stopped"))
    freed = _int(s.get("freed_mib")) * MIB
    leaked = sum(_int(x.get("unaccounted_mib")) for x in rep.get("leaks") or []) * MIB
    fams["pveclean_runs_total"].add(1, ident, phase, cut(rep["verdict"]))
    fams["pveclean_holders_stopped_total"].add(stopped, ident)
    fams["pveclean_freed_bytes_total"].add(freed, ident)
    for v in dict.fromkeys([*VERDICTS, str(rep["verdict"])]):
        fams["pveclean_last_verdict"].set(1 if rep["verdict"] == v else 0, ident, phase, v)
    last = {"pveclean_last_run_timestamp_seconds": float(round(now)),
            "pveclean_last_run_duration_seconds": _num(rep.get("duration_s")),
            "pveclean_last_holders_stopped": stopped,
            "pveclean_last_residual_holders": survived(rep),
            "pveclean_last_freed_bytes": freed, "pveclean_last_leaked_bytes": leaked}
    for name, value in last.items():
        fams[name].set(value, ident, phase)
    return list(fams.values())
