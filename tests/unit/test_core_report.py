"""core.report: the run's report as a typed record: its dict (keys, order, plain values), the
phases' amendments, redaction of secrets (bounded work on hostile lines), and the leak check
(only on the container's GPUs)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from pveclean.core import config, gpumap
from pveclean.core.amendments import Leak, PreStopBrief, UnitStop, UnitStops
from pveclean.core.config import Config
from pveclean.core.records import (
    Discovery,
    GpuMemory,
    Holder,
    NvmlProcesses,
    Source,
    SourceState,
)
from pveclean.core.report import (
    LEAK_SLACK_MIB,
    MAX_VALUE,
    Findings,
    Redactor,
    Report,
    Stamp,
    build_report,
    busy_report,
    find_leaks,
    iso,
    memory_table,
)
from pveclean.core.reportread import from_dict, gpus_used
from pveclean.core.verdicts import Outcome, Verdict
from pveclean.host import reportfiles

OK = Source(SourceState.OK)
STAMP = Stamp("9.9.9", "node1", 1_780_000_000.25, 1.234)
TOP = ["pveclean", "vmid", "phase", "host", "start", "duration_s", "dry_run", "verdict",
       "summary", "container", "holders", "gpus", "other_gpu_users", "sources", "settings",
       "warnings", "errors"]


def holder(pid: int, outcome: Outcome | None = None, **kw: Any) -> Holder:
    return Holder(host_pid=pid, starttime=pid * 10, ct_pid=pid - 1000, name=f"p{pid}",
                  exe="/usr/bin/python3", argv=("python3", "train.py", f"--token=s3cret{pid}"),
                  uid=0, user="root", state="S", ppid=1, cgroup="/lxc/129/ns/x.service",
                  devices=["/dev/nvidia0"], gpu_memory_mib={1: 300, 0: None},
                  sources=["host"], outcome=outcome, **kw)


def discovery(**kw: Any) -> Discovery:
    base: dict[str, Any] = dict(holders=[], running=True, init_pid=4242, tree_pids=7,
                                sources={k: OK for k in ("host", "nvml", "probe")})
    base.update(kw)
    return Discovery(**base)


GPU0 = GpuMemory(0, "GPU-a", "H100", 81559, 500, 1200, minor=0)
GPU0_AFTER = GpuMemory(0, "GPU-a", "H100", 81559, 500, 700, minor=0)


def full_report(verdict: Verdict = Verdict.CLEAN, **found: Any) -> Report:
    hs = [holder(2001, Outcome.TERMINATED), holder(2002, Outcome.KILLED, round=1,
                                                   respawned_by="systemd (host PID 9)"),
          holder(2003, Outcome.PROTECTED, protected="the container's PID 1")]
    args: dict[str, Any] = dict(verdict=verdict, holders=hs, disc=discovery(), before=[GPU0],
                                after=[GPU0_AFTER], rounds=1, errors=[], verify_s=0.061)
    args.update(found)
    return build_report(STAMP, 129, "manual", False, Findings(**args), ["dev0: /dev/nvidia0"],
                        Config(grace_seconds=3.0, deadline_seconds=20.0, source="/etc/x.yaml"))


def roundtrip(d: dict[str, Any]) -> Any:
    return yaml.safe_load(yaml.safe_dump(d, sort_keys=False))


def test_a_report_dict_has_the_fixed_keys_in_order_and_survives_yaml() -> None:
    d = full_report().as_dict()
    assert list(d) == TOP
    assert list(d["summary"]) == ["holders", "stopped", "outcomes", "freed_mib", "rounds",
                                  "verified_after_last_exit_s"]
    assert list(d["container"]) == ["running", "init_pid", "processes_in_cgroup_tree",
                                    "gpu_config"]
    assert roundtrip(d) == d


def test_the_dict_holds_plain_strings_not_enums() -> None:
    d = full_report().as_dict()
    assert type(d["verdict"]) is str and d["verdict"] == "clean"
    assert [type(h["outcome"]) for h in d["holders"]] == [str, str, str]
    assert all(type(k) is str for k in d["summary"]["outcomes"])
    assert json.loads(json.dumps(d)) == json.loads(json.dumps(roundtrip(d)))


def test_summary_counts_outcomes_and_stopped_and_freed() -> None:
    s = full_report().as_dict()["summary"]
    assert s["holders"] == 3 and s["stopped"] == 2 and s["rounds"] == 1
    assert s["outcomes"] == {"terminated": 1, "killed": 1, "protected": 1}
    assert s["freed_mib"] == 500 and s["verified_after_last_exit_s"] == 0.061
    rep = build_report(STAMP, 1, "manual", True, Findings(Verdict.DRY_RUN, [holder(5)],
                       discovery(), None, None, 0, []), [], Config())
    assert rep.as_dict()["summary"]["outcomes"] == {"unknown": 1}


def test_values_come_from_the_stamp_the_discovery_and_the_config() -> None:
    rep = full_report()
    d = rep.as_dict()
    assert (d["pveclean"], d["host"], d["duration_s"], rep.started) == \
        ("9.9.9", "node1", 1.234, 1_780_000_000.25)
    assert "_started" not in d  # the file's name takes it from the typed report
    assert d["start"] == "2026-05-28T20:26:40.250+00:00"
    assert d["container"] == {"running": True, "init_pid": 4242, "processes_in_cgroup_tree": 7,
                              "gpu_config": ["dev0: /dev/nvidia0"]}
    assert d["settings"] == {"grace_seconds": 3.0, "deadline_seconds": 20.0,
                             "config": "/etc/x.yaml"}
    assert d["holders"][1]["round"] == 1 and "round" not in d["holders"][0]
    assert d["holders"][0]["gpu_memory_mib"] == {0: None, 1: 300}


def test_warnings_say_nvml_was_not_used_and_who_respawned() -> None:
    disc = discovery(sources={"host": OK,
                              "nvml": Source(SourceState.FAILED, "failed: no library")},
                     warnings=["probe found PID 5"])
    w = full_report(disc=disc).warnings
    assert w == ["probe found PID 5",
                 "NVML not used (failed: no library); verified by rescanning only",
                 "holders were respawned by: systemd (host PID 9)"]
    quiet = discovery(sources={"host": OK, "nvml": Source(SourceState.NOT_RUN,
                                                          "not needed: container stopped")})
    assert full_report(disc=quiet, holders=[]).warnings == []


def test_optional_summary_keys_appear_only_when_they_say_something() -> None:
    d = full_report(readers_killed=2).as_dict()
    assert list(d["summary"])[-2:] == ["verified_after_last_exit_s", "readers_killed"]
    assert d["summary"]["readers_killed"] == 2
    assert "readers_killed" not in full_report().as_dict()["summary"]


def test_units_add_unit_stops_hints_and_units_stopped_at_the_end() -> None:
    stops = UnitStops([UnitStop("a.service", [], "stopped"), UnitStop("b.service", [], "failed")],
                      "x")
    d = full_report().with_units(stops, ["b.service in CT 129 ..."]).as_dict()
    assert list(d)[-3:] == ["errors", "unit_stops", "hints"]
    assert d["unit_stops"] == {"units": [
        {"unit": "a.service", "holders": [], "action": "stopped", "detail": None},
        {"unit": "b.service", "holders": [], "action": "failed", "detail": None}],
        "command": "x", "note": None}
    assert d["summary"]["units_stopped"] == ["a.service"]
    assert list(d["summary"])[-1] == "units_stopped"
    plain = full_report().with_units(None, []).as_dict()
    assert "unit_stops" not in plain and "hints" not in plain
    assert "units_stopped" not in plain["summary"]
    only_hints = full_report().with_units(None, ["h"]).as_dict()
    assert only_hints["hints"] == ["h"] and "unit_stops" not in only_hints


def test_via_comes_right_after_the_phase() -> None:
    d = full_report().ran_by("systemd drop-in").as_dict()
    assert list(d)[:5] == ["pveclean", "vmid", "phase", "via", "host"]
    assert full_report().ran_by(None) == full_report()


def test_a_busy_report_says_less() -> None:
    rep = busy_report(STAMP, 129, "pre-stop", False, ["dev0: /dev/nvidia0"], "lock held by 77")
    d = rep.as_dict()
    assert list(d) == ["pveclean", "vmid", "phase", "host", "start", "duration_s", "dry_run",
                       "verdict", "summary", "container", "holders", "gpus", "warnings",
                       "errors"]
    assert d["verdict"] == "busy" and rep.busy
    assert d["summary"] == {"holders": 0, "stopped": 0, "outcomes": {}, "freed_mib": 0,
                            "rounds": 0}
    assert d["container"] == {"running": None, "gpu_config": ["dev0: /dev/nvidia0"]}
    assert d["errors"] == ["lock held by 77"] and d["holders"] == [] and d["gpus"] == []
    assert roundtrip(d) == d
    via = rep.ran_by("drop-in").as_dict()
    assert list(via)[3] == "via" and via["via"] == "drop-in"


def test_post_stop_leaks_flip_clean_and_empty_to_leaked_only() -> None:
    leak = [Leak(0, "GPU-a", 900, "reset")]
    pre = PreStopBrief("2026-05-28T20:00:00.000+00:00", "clean", 1200)
    for verdict, want in [(Verdict.CLEAN, Verdict.LEAKED), (Verdict.NOTHING_TO_DO,
                          Verdict.LEAKED), (Verdict.RESIDUAL, Verdict.RESIDUAL)]:
        rep = full_report(verdict).with_leaks(leak, pre)
        assert rep.verdict == want
    d = full_report().with_leaks(leak, pre).as_dict()
    assert list(d)[-3:] == ["errors", "leaks", "pre_stop_report"]
    assert d["leaks"] == [{"index": 0, "uuid": "GPU-a", "unaccounted_mib": 900, "hint": "reset"}]
    assert d["pre_stop_report"] == {"start": pre.start, "verdict": "clean",
                                    "freed_mib": 1200}
    none = full_report(Verdict.NOTHING_TO_DO).with_leaks([], None).as_dict()
    assert none["verdict"] == "nothing-to-do" and none["leaks"] == []
    assert "pre_stop_report" not in none


def test_the_amendments_make_new_reports_and_leave_the_old_one_alone() -> None:
    rep = full_report()
    before = rep.as_dict()
    rep.with_warning("w").with_error("e").with_leaks([Leak(1, "", 0, "")], None)
    rep.with_removed_cgroups(["/lxc/129/ns"]).ran_by("x").with_units(None, ["h"])
    assert rep.as_dict() == before
    assert rep.with_warning("w").warnings[-1] == "w" and rep.with_error("e").errors == ["e"]


def test_removed_cgroups_only_when_some_were_removed() -> None:
    d = full_report(Verdict.NOTHING_TO_DO).with_removed_cgroups(["/lxc/129/ns/a"]).as_dict()
    assert list(d)[-2:] == ["errors", "removed_cgroups"]
    assert "removed_cgroups" not in full_report().with_removed_cgroups([]).as_dict()


def test_remaining_are_the_survivors_and_the_protected() -> None:
    rep = full_report(holders=[holder(1, Outcome.SURVIVED), holder(2, Outcome.KILLED),
                               holder(3, Outcome.PROTECTED), holder(4)])
    assert [h.host_pid for h in rep.remaining()] == [1, 3]


def test_redacting_the_report_is_redacting_its_dict() -> None:
    red = Redactor([r"(--token=)\S+", r"(/usr/)bin"])
    rep = full_report().with_error("failed with --token=abc").ran_by("via /usr/bin/x")
    redacted = red.value(rep)
    assert isinstance(redacted, Report) and redacted.verdict is Verdict.CLEAN
    assert redacted.as_dict() == red.value(rep.as_dict())
    assert redacted.holders[0].argv == ("python3", "train.py", "--token=***")
    assert rep.holders[0].argv[-1].endswith("s3cret2001")  # the original is left alone


def test_a_pattern_never_rewrites_a_verdict_or_an_outcome() -> None:
    red = Redactor([r"clean|terminated"])
    d = red.value(full_report()).as_dict()
    assert d["verdict"] == "clean" and d["holders"][0]["outcome"] == "terminated"


@given(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False))
def test_start_is_datetimes_isoformat(t: float) -> None:
    assert iso(t) == datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def test_start_is_utc_to_the_millisecond() -> None:
    assert iso(1796280792.2539) == "2026-12-03T06:53:12.253+00:00"
    assert iso(0) == "1970-01-01T00:00:00.000+00:00"


def test_memory_table_pairs_before_and_after_by_index() -> None:
    gone = GpuMemory(1, "GPU-b", "H100", 81559, 500, 600, minor=1)
    rows = memory_table([GPU0, gone], [GPU0_AFTER])
    assert [r.freed_mib for r in rows] == [500, None]
    assert rows[1].used_after_mib is None and rows[0].used_before_mib == 1200
    assert memory_table(None, [GPU0]) == []


def gpu(index: int, used: int, reserved: int | None = 500, minor: int | None = None
        ) -> GpuMemory:
    return GpuMemory(index, f"GPU-{index}", "H100", 81559, reserved, used,
                     minor=index if minor is None else minor)


def test_find_leaks_counts_only_memory_no_process_holds_beyond_the_slack() -> None:
    procs = NvmlProcesses({10: {0: 1000}, 11: {0: None, 1: 50}})
    at_slack = gpu(0, 1000 + LEAK_SLACK_MIB)
    over = gpu(1, 50 + LEAK_SLACK_MIB + 1)
    leaks = find_leaks([at_slack, over], procs, set(), set())
    assert [(x.index, x.unaccounted_mib) for x in leaks] == [(1, LEAK_SLACK_MIB + 1)]
    assert leaks[0].hint.endswith("pveclean reset 1 (--dry-run first)")


def test_find_leaks_looks_only_at_the_containers_gpus() -> None:
    gs = [gpu(0, 5000), gpu(1, 5000), gpu(2, 5000, minor=None)]
    gs[2] = GpuMemory(2, "GPU-2", "H100", 81559, 500, 5000, minor=None)
    assert [x.index for x in find_leaks(gs, NvmlProcesses(), {1}, set())] == [1, 2]
    assert [x.index for x in find_leaks(gs, NvmlProcesses(), set(), {0, 2})] == [0, 2]
    assert find_leaks([gpu(0, 5000, reserved=None)], NvmlProcesses(), set(), set()) == []


def test_gpumap_and_the_post_stop_share_one_slack() -> None:
    assert gpumap.LEAK_SLACK_MIB is LEAK_SLACK_MIB == 64


def test_gpus_used_reads_a_pre_stop_reports_holders() -> None:
    head = {"vmid": 129, "phase": "pre-stop", "verdict": "clean", "start": "x"}
    pre = from_dict({**head, "holders": [{"gpu_memory_mib": {0: 100, "3": None}},
                                         {"gpu_memory_mib": None}, {}]})
    assert gpus_used(pre) == {0, 3}
    assert gpus_used(from_dict(head)) == set()


def test_a_written_report_reads_back_equal(tmp_path: Path) -> None:
    rep = full_report().with_leaks([], None)
    rep = rep.with_units(UnitStops([UnitStop("a.service", [1, 2], "stopped", "its cgroup is "
                                             "empty", 0, True)], "pct exec", None, True, 0),
                         ["h"]).with_notify_errors(["not logged"])
    d = rep.as_dict()
    path = reportfiles.write_report(rep, str(tmp_path))
    assert path.name == reportfiles.report_name(129, "manual", rep.started)
    assert reportfiles.load(path) == d
    assert reportfiles.load_report(path).as_dict() == d  # the one reader gives it back whole


def test_leaks_only_on_the_containers_gpus() -> None:
    gpus = [GpuMemory(i, f"GPU-{i}", "H100", 81559, 512, used, minor=i)
            for i, used in enumerate([5000, 3000, 2000])]
    procs = NvmlProcesses({111: {0: 5000}, 222: {1: 1000}})  # GPU 1, 2: 2000 unaccounted
    leaks = find_leaks(gpus, procs, minors={1}, used_by_ct=set())
    assert [(x.index, x.unaccounted_mib) for x in leaks] == [(1, 2000)]
    assert {x.index for x in find_leaks(gpus, procs, set(), set())} == {1, 2}
    assert [x.index for x in find_leaks(gpus, procs, set(), {2})] == [2]
    v1 = [GpuMemory(0, "GPU-0", "H100", 81559, None, 9000, minor=0)]
    assert find_leaks(v1, NvmlProcesses(), {0}, set()) == []  # v1: reserved is in used


def test_redaction_defaults() -> None:
    r = Redactor(config.DEFAULT_REDACT)
    line = ("python3 serve --hf-token hf_1 --db-password=pw2 --api-key k3 OPENAI_API_KEY=k4 "
            "HF_TOKEN=t5 https://u:p6@host/x --model llama")
    out = r.text(line)
    for secret in ("hf_1", "pw2", "k3", "k4", "t5", "p6"):
        assert secret not in out
    assert out.endswith("--model llama") and "https://u:***@host/x" in out


def _best(f: object, s: str) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        f(s)  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return best


def test_redaction_grows_linearly_on_hostile_lines() -> None:
    """The old patterns took ~20 s on 40 KB of dashes (quadratic): doubling the input must
    not quadruple the time."""
    r = Redactor(config.DEFAULT_REDACT)
    for unit in ("-", "--token", "KEY", "://a:", "x--x", "--tokentoken"):
        small, big = unit * (8000 // len(unit)), unit * (32000 // len(unit))
        t_small, t_big = _best(r.text, small), _best(r.text, big)
        assert t_big < max(8 * t_small, 0.05), (unit, t_small, t_big)


def test_redaction_input_is_cut() -> None:
    r = Redactor([r"(a)b"])
    assert len(r.text("x" * (MAX_VALUE * 3))) == MAX_VALUE
