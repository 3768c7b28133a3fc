"""Typed reports for tests: a Report and its Holders built field by field, with the defaults
a test does not care about."""

from __future__ import annotations

import dataclasses

from pveclean.core.records import Holder
from pveclean.core.report import ContainerState, Report, Summary
from pveclean.core.reportread import devices_of
from pveclean.core.verdicts import Outcome, Verdict


def holder(pid: int = 4242, outcome: Outcome | str | None = None, **kw: object) -> Holder:
    base = Holder(host_pid=pid, starttime=1, ct_pid=None, name="p", exe=None, argv=(), uid=0,
                  user="root", state="S", ppid=1, cgroup="/lxc/129/ns",
                  outcome=None if outcome is None else Outcome(outcome))
    if "devices" in kw:  # the report's labels, as a report file gives them
        kw["devices"], kw["devices_more"] = devices_of(kw["devices"])
    return dataclasses.replace(base, **kw) if kw else base  # type: ignore[arg-type]


def summary(**kw: object) -> Summary:
    base = Summary(holders=0, stopped=0, outcomes={}, freed_mib=0, rounds=0)
    return dataclasses.replace(base, **kw) if kw else base  # type: ignore[arg-type]


def report(vmid: int = 129, verdict: Verdict | str = Verdict.CLEAN, phase: str = "manual",
           **kw: object) -> Report:
    base = Report("t", vmid, phase, "h", "2026-12-03T06:53:12.253+00:00", 1.0, False,
                  Verdict(verdict), summary(), ContainerState(True, []), 0.0)
    return dataclasses.replace(base, **kw) if kw else base  # type: ignore[arg-type]
