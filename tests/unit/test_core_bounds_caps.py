"""The report's caps (core/bounds.py): a report of any number of holders, any number of
device paths and any text stays under 1 MiB of YAML, lists what matters first and counts
what it leaves out; the size estimate is never below the YAML it stands for."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.core import bounds, report
from pveclean.core.amendments import Leak, UnitStop, UnitStops
from pveclean.core.config import Config
from pveclean.core.records import (
    DeviceHow,
    DeviceUse,
    Discovery,
    Holder,
    OtherUser,
    Sent,
    Source,
    SourceState,
    device_labels,
)
from pveclean.core.reportread import gpus_used
from pveclean.core.verdicts import Outcome, Verdict
from pveclean.host.reportfiles import to_yaml

LONG = "/tmp/x/" + "/".join("p" * 250 for _ in range(15))  # ~3,800 characters


def holder(pid: int, outcome: Outcome = Outcome.KILLED, paths: int = 64, text: str = "a",
           mib: int | None = None) -> Holder:
    return Holder(host_pid=pid, starttime=1, ct_pid=pid - 1000, name=f"w{pid % 3}",
                  exe=f"/opt/{text}", argv=("run", text), uid=0, user="root", state="S",
                  ppid=1, cgroup="/lxc/129/ns", outcome=outcome,
                  devices=[DeviceUse(f"{LONG}/gpu{i}", 195, i % 2, DeviceHow.FD)
                           for i in range(paths)],
                  gpu_memory_mib={0: mib} if mib else {})


def make_report(holders: list[Holder], **extra: object) -> report.Report:
    disc = Discovery(holders, True, 1, len(holders), {"host": Source(SourceState.OK)})
    found = report.Findings(Verdict.CLEAN, holders, disc, None, None, 1, [])
    rep = report.build_report(report.Stamp("t", "h", 0.0, 1.0), 129, "manual", False, found,
                              [], Config())
    return rep if not extra else rep.__class__(**{**rep.__dict__, **extra})


def yaml_bytes(rep: report.Report, terminal: bool = False) -> int:
    return len(to_yaml(rep.as_dict(), terminal=terminal).encode("utf-8"))


def test_four_hundred_holders_of_64_long_paths_stay_under_a_megabyte_and_are_counted() -> None:
    hs = [holder(1000 + i) for i in range(400)]
    t0 = time.perf_counter()
    b = make_report(hs).bounded()
    red = report.Redactor(Config().redact).value(b)
    size = yaml_bytes(red)
    took = time.perf_counter() - t0
    assert size <= bounds.MAX_REPORT_BYTES
    assert took < 2.0  # bounding, redaction and the dump: about 0.1 s here
    assert len(b.holders) == bounds.HOLDERS
    more = b.holders_not_listed
    assert more is not None and more.count == 300 and more.outcomes == {"killed": 300}
    assert more.host_pids == "1100-1399"
    assert b.summary.holders == 400 and b.summary.outcomes == {"killed": 400}
    for h in b.holders:  # each device kept (195:0 and 195:1), then up to the cap, then a count
        shown = device_labels(h.devices, h.devices_more)
        assert len(shown) == bounds.DEVICES + 1
        assert shown[-1] == f"{bounds.MORE}+{64 - bounds.DEVICES} more"
        assert {d[-6:] for d in shown[:-1]} == {"195:0)", "195:1)"}
        assert all(len(d) <= bounds.DEVICE_CHARS for d in shown)


def test_the_holders_left_behind_are_listed_first_and_the_order_is_kept() -> None:
    hs = [holder(1000 + i) for i in range(300)]
    hs[250].outcome = Outcome.SURVIVED
    hs[260].outcome = Outcome.PROTECTED
    hs[270].outcome = Outcome.SKIPPED
    hs[280] = holder(1280, mib=4096)
    b = make_report(hs).bounded()
    pids = [h.host_pid for h in b.holders]
    assert {1250, 1260, 1270, 1280} <= set(pids) and pids == sorted(pids)
    assert b.remaining_count() == 2 and len(b.remaining()) == 2
    assert gpus_used(b) == {0}
    assert gpus_used(make_report([holder(1, mib=5)] * 1)) == {0}


def test_unlisted_memory_still_names_the_gpus_a_post_stop_checks() -> None:
    hs = [holder(1000 + i, paths=1, mib=10) for i in range(150)]
    hs.append(holder(2000, paths=1))
    hs[-1].gpu_memory_mib = {1: 77}
    b = make_report(hs).bounded()
    assert 2000 not in [h.host_pid for h in b.holders]
    assert b.holders_not_listed is not None
    assert b.holders_not_listed.gpu_memory_mib == {0: 500, 1: 77}
    assert gpus_used(b) == {0, 1}


def test_bounding_twice_changes_nothing() -> None:
    b = make_report([holder(1000 + i) for i in range(150)]).bounded()
    assert b.bounded() == b


def test_worst_case_text_everywhere_stays_under_a_megabyte() -> None:
    """Escapes, line breaks and astral characters in every string, lists of everything."""
    nasty = "\x01\n\u202e\U000e0001\"\\'é" * 10_000
    hs = [Holder(host_pid=i, starttime=1, ct_pid=i, name=nasty, exe=nasty, argv=(nasty, nasty),
                 uid=0, user=nasty, state="S", ppid=1, cgroup=nasty, unit=nasty,
                 devices=[DeviceUse.named(nasty)] * 200, signals=[Sent(note=nasty)] * 200,
                 protected=nasty,
                 wchan=nasty, respawned_by=nasty, outcome=Outcome.SURVIVED)
          for i in range(1, 300)]
    rep = make_report(hs, warnings=[nasty] * 100, errors=[nasty] * 100, hints=[nasty] * 100,
                      other_gpu_users=[OtherUser(0, nasty, None, {})] * 1000,
                      removed_cgroups=[nasty] * 1000, leaks=[Leak(0, "", 0, nasty)] * 100,
                      unit_stops=UnitStops([UnitStop(nasty, [], "stopped")] * 1000))
    b = rep.bounded()
    for terminal in (False, True):
        assert yaml_bytes(b, terminal) <= bounds.MAX_REPORT_BYTES
    assert b.warnings[-1].endswith("more not listed")
    assert b.unit_stops is not None and b.unit_stops.stopped() == {bounds.cut(nasty)}
    assert b.more_other_gpu_users and b.more_leaks and b.unit_stops.units_more


def test_cap_devices_keeps_each_device_and_is_idempotent() -> None:
    uses = ([DeviceUse(f"/a{i}", 195, i, DeviceHow.FD) for i in range(12)]
            + [DeviceUse(f"/b{i}", 195, 0, DeviceHow.MMAP) for i in range(20)])
    capped = bounds.cap_devices(uses)
    assert capped == (uses[:12], 20)
    assert bounds.cap_devices(*capped) == capped
    assert bounds.cap_devices(uses[:3]) == (uses[:3], 0)
    probe = [DeviceUse.named(f"/p{i}") for i in range(30)]  # the probe names no device number
    assert bounds.cap_devices(probe) == (probe[:8], 22)
    assert device_labels(*bounds.cap_devices(probe)) == [
        *(f"/p{i}" for i in range(8)), f"{bounds.MORE}+22 more"]


def test_pid_ranges_are_cut_with_a_count() -> None:
    assert bounds.pid_ranges([5, 1, 2, 3, 9, 10]) == "1-3, 5, 9-10"
    assert bounds.pid_ranges(list(range(0, 1000, 2)), limit=3) == f"0, 2, 4, {bounds.MORE} 497 more"


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec=None, exclude_categories=()), max_size=300))
def test_the_size_estimate_is_never_below_the_yaml(s: str) -> None:
    value = {"holders": [{"devices": [s], "cmdline": s}], "key": s}
    for terminal in (False, True):
        assert len(to_yaml(value, terminal).encode("utf-8")) <= bounds.size(value), repr(s)


def test_clip_cuts_lists_with_a_count_and_strings_with_an_ellipsis() -> None:
    out = bounds.clip(["x" * 100] * 50, budget=1000, text=10)
    assert out[:-1] == ["x" * 9 + bounds.MORE] * (len(out) - 1)
    assert out[-1] == f"{bounds.MORE} {50 - len(out) + 1} more not listed"
