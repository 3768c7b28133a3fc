"""The series of one cleanup run, in the exposition format of core/exposition.py: counters
by container, phase and verdict, and the last outcome per container and phase. The format's
names are re-exported here for the callers that use them with the series."""

from __future__ import annotations

import math
from collections.abc import Iterable

from pveclean.core.exposition import (
    MAX_LABEL,
    MIB,
    Family,
    cut,
    escape_help,
    escape_label,
    number,
    parse,
    render,
)
from pveclean.core.verdicts import VERDICTS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.report import Report

__all__ = ["MAX_LABEL", "MIB", "RUN_FAMILIES", "Family", "cut", "escape_help", "escape_label",
           "guest_id", "number", "parse", "render", "run_families", "survived"]

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


def survived(rep: Report) -> int:
    return rep.survived()


def _num(value: float) -> float:
    return float(value) if math.isfinite(value) else 0.0


def run_families(rep: Report, now: float,
                 old: Iterable[tuple[str, dict[str, str], float]] = ()) -> list[Family]:
    """The textfile after a run: `old` (the file's samples) with this run's counters added
    and its container's last-run gauges for its phase replaced. Samples of other families,
    or with other labels than ours (an older layout), are dropped."""
    fams = {n: Family(n, kind, hlp, labels) for n, (kind, hlp, labels) in RUN_FAMILIES.items()}
    ident, phase = guest_id(rep.vmid), cut(rep.phase)
    for name, labels, value in old:
        fam = fams.get(name)
        if fam is None or set(labels) != set(fam.labels) or not math.isfinite(value):
            continue
        key = tuple(labels[x] for x in fam.labels)
        if name in _LAST and (labels["id"], labels["phase"]) == (ident, phase):
            continue
        fam.set(value, *key)
    stopped = rep.summary.stopped
    freed = rep.summary.freed_mib * MIB
    leaked = rep.leaked_mib() * MIB
    verdict = str(rep.verdict)
    fams["pveclean_runs_total"].add(1, ident, phase, cut(verdict))
    fams["pveclean_holders_stopped_total"].add(stopped, ident)
    fams["pveclean_freed_bytes_total"].add(freed, ident)
    for v in dict.fromkeys([*VERDICTS, verdict]):
        fams["pveclean_last_verdict"].set(1 if verdict == v else 0, ident, phase, v)
    last = {"pveclean_last_run_timestamp_seconds": float(round(now)),
            "pveclean_last_run_duration_seconds": _num(rep.duration_s),
            "pveclean_last_holders_stopped": stopped,
            "pveclean_last_residual_holders": survived(rep),
            "pveclean_last_freed_bytes": freed, "pveclean_last_leaked_bytes": leaked}
    for name, value in last.items():
        fams[name].set(value, ident, phase)
    return list(fams.values())
