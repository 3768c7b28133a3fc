"""The report of one run: built from what the run saw and did, redacted, and the leak check
of a post-stop."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from pveclean import __version__
from pveclean.core.config import Config
from pveclean.core.records import Deadline, Discovery, GpuMemory, Holder
from pveclean.host import reportfiles
from pveclean.proxmox import pveconf

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


LEAK_SLACK_MIB = 64  # allocations NVML shows without a process: allocator slack, contexts


def find_leaks(gpus: list[GpuMemory], procs: dict[int, dict[int, int | None]],
               minors: set[int], used_by_ct: set[int]) -> list[dict[str, Any]]:
    """Memory allocated on the container's GPUs that no live process accounts for."""
    leaks = []
    for g in gpus:
        if g.reserved_mib is None:
            continue  # NVML v1 mixes reserved into used: unaccounted memory is unknowable
        if minors and g.minor is not None:
            if g.minor not in minors:
                continue  # not one of this container's GPUs
        elif used_by_ct and g.index not in used_by_ct:
            continue
        accounted = sum(m or 0 for per in procs.values() for i, m in per.items()
                        if i == g.index)
        unaccounted = g.used_mib - accounted
        if unaccounted > LEAK_SLACK_MIB:
            leaks.append({"index": g.index, "uuid": g.uuid, "unaccounted_mib": unaccounted,
                          "hint": f"no process holds this memory; once nothing uses GPU "
                                  f"{g.index}, reset it: nvidia-smi -r -i {g.index}"})
    return leaks


MAX_VALUE = 64 << 10  # characters of one string value in a report


class Redactor:
    """Applies the configured patterns: a match's first group is kept, the rest becomes ***.
    Each value is cut to MAX_VALUE first, so the time stays bounded for any pattern."""

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

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        return v


@dataclass
class RunResult:
    report: dict[str, Any]
    path: Path | None
    exit_code: int
    report_error: str | None = None
    ctconf: pveconf.CtConfig | None = None  # the container's config as the run read it

    @property
    def verdict(self) -> str:
        return str(self.report["verdict"])


def _busy_report(vmid: int, phase: str, started: float, dry_run: bool,
                 ctconf: pveconf.CtConfig, exc: Exception) -> dict[str, Any]:
    """The report of a run that found the container's lock held (by another cleanup)."""
    return {
        "pveclean": __version__, "vmid": vmid, "phase": phase,
        "host": os.uname().nodename, "start": reportfiles.iso(started),
        "duration_s": round(time.time() - started, 3), "dry_run": dry_run,
        "verdict": "busy", "summary": {"holders": 0, "stopped": 0, "outcomes": {},
                                       "freed_mib": 0, "rounds": 0},
        "container": {"running": None, "gpu_config": ctconf.gpu_lines()},
        "holders": [], "gpus": [], "warnings": [], "errors": [str(exc)],
        "_started": started,
    }


def memory_table(
    before: list[GpuMemory] | None, after: list[GpuMemory] | None
) -> list[dict[str, Any]]:
    out = []
    after_by = {g.index: g for g in after or []}
    for g in before or []:
        a = after_by.get(g.index)
        out.append({
            "index": g.index,
            "minor": g.minor,
            "uuid": g.uuid,
            "name": g.name,
            "total_mib": g.total_mib,
            "reserved_mib": g.reserved_mib,
            "used_before_mib": g.used_mib,
            "used_after_mib": a.used_mib if a else None,
            "freed_mib": (g.used_mib - a.used_mib) if a else None,
        })
    return out


def build_report(
    vmid: int,
    phase: str,
    started: float,
    deadline: Deadline,
    dry_run: bool,
    verdict: str,
    holders: list[Holder],
    disc: Discovery,
    before: list[GpuMemory] | None,
    after: list[GpuMemory] | None,
    rounds: int,
    ctconf: pveconf.CtConfig,
    errors: list[str],
    cfg: Config,
) -> dict[str, Any]:
    gpus = memory_table(before, after)
    freed = sum(max(g["freed_mib"] or 0, 0) for g in gpus)
    counts: dict[str, int] = {}
    for h in holders:
        counts[h.outcome or "unknown"] = counts.get(h.outcome or "unknown", 0) + 1
    warnings = list(disc.warnings)
    if disc.sources.get("nvml", "ok") != "ok" and not disc.sources["nvml"].startswith("not "):
        warnings.append(f"NVML not used ({disc.sources['nvml']}); verified by rescanning only")
    respawners = sorted({h.respawned_by for h in holders if h.respawned_by})
    if respawners:
        warnings.append(f"holders were respawned by: {', '.join(respawners)}")
    return {
        "pveclean": __version__,
        "vmid": vmid,
        "phase": phase,
        "host": os.uname().nodename,
        "start": reportfiles.iso(started),
        "duration_s": round(deadline.elapsed(), 3),
        "dry_run": dry_run,
        "verdict": verdict,
        "summary": {
            "holders": len(holders),
            "stopped": counts.get("terminated", 0) + counts.get("killed", 0),
            "outcomes": counts,
            "freed_mib": freed,
            "rounds": rounds,
        },
        "container": {
            "running": disc.running,
            "init_pid": disc.init_pid,
            "processes_in_cgroup_tree": disc.tree_pids,
            "gpu_config": ctconf.gpu_lines(),
        },
        "holders": [h.as_dict() for h in holders],
        "gpus": gpus,
        "other_gpu_users": disc.other_holders,
        "sources": disc.sources,
        "settings": {
            "grace_seconds": cfg.grace_seconds,
            "deadline_seconds": cfg.deadline_seconds,
            "config": cfg.source,
        },
        "warnings": warnings,
        "errors": errors,
        "_started": started,
    }
