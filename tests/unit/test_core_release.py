"""core/release.py: a slow release is not a leak; what NVML did not answer for is not judged."""

from __future__ import annotations

import pytest

from pveclean.core import release
from pveclean.core.records import GpuMemory, GpuStatus, NvmlProcesses
from pveclean.core.release import (
    InExit,
    Release,
    exit_note,
    exit_step,
    exits_waited,
    progressed,
)


def gpu(used: int, index: int = 0, status: GpuStatus = GpuStatus.OK) -> GpuMemory:
    return GpuMemory(index, f"GPU-{index}", "H100", 81559, 512, used, index, status,
                     None if status is GpuStatus.OK else "Unknown Error")


def procs(by_pid: dict[int, dict[int, int | None]] | None = None,
          faults: dict[int, tuple[GpuStatus, str]] | None = None) -> NvmlProcesses:
    return NvmlProcesses(by_pid or {}, faults or {})


# before the run: our holder 10,000 MiB on GPU 0, another container's 2,000, 100 unaccounted
BEFORE = [gpu(12_100)]
MINE = [{0: 10_000}]
THEIRS = [{0: 2_000}]
AFTER = procs({77: {0: 2_000}})  # our holder gone; the other still listed


def rows() -> list[release.GpuRelease]:
    return release.targets(BEFORE, MINE, THEIRS)


def test_targets_one_row_per_gpu_of_ours_with_the_base_no_process_accounted_for():
    (r,) = rows()
    assert (r.index, r.state, r.set_out_mib, r.base_mib) == (0, Release.RELEASING, 10_000, 100)
    assert release.targets([*BEFORE, gpu(500, index=1)], MINE, THEIRS)[0].index == 0
    assert len(release.targets([*BEFORE, gpu(500, index=1)], MINE, THEIRS)) == 1


def test_memory_back_at_the_first_look_is_released_at_once():
    (r,) = release.step(rows(), [gpu(2_100)], AFTER, 0.2)
    assert (r.state, r.left_mib, r.after_s) == (Release.RELEASED, 0, 0.2)
    assert release.finished([r])


def test_a_three_second_release_is_releasing_then_released_never_leaked():
    rs = rows()
    for t in (0.1, 1.0, 2.0, 2.9):  # the driver keeps it, listed under no process
        rs = release.step(rs, [gpu(12_100)], AFTER, t)
        assert rs[0].state is Release.RELEASING and rs[0].left_mib == 10_000
        assert not release.finished(rs)
    rs = release.step(rs, [gpu(2_150)], AFTER, 3.1)
    assert (rs[0].state, rs[0].after_s) == (Release.RELEASED, 3.1)
    assert "released in 3.1 s" in rs[0].line()


def test_memory_that_stays_put_for_the_settle_time_is_leaked():
    rs = release.step(rows(), [gpu(12_100)], AFTER, 0.1)
    rs = release.step(rs, [gpu(12_100)], AFTER, 0.1 + release.SETTLE_S - 0.01)
    assert rs[0].state is Release.RELEASING
    rs = release.step(rs, [gpu(12_100)], AFTER, 0.1 + release.SETTLE_S)
    assert (rs[0].state, rs[0].left_mib) == (Release.LEAKED, 10_000)
    assert release.leaked(rs) == rs and release.finished(rs)


def test_memory_falling_in_steps_is_waited_for_past_the_settle_time():
    rs, t, used = rows(), 0.0, 12_100
    while used > 2_100:
        rs = release.step(rs, [gpu(used)], AFTER, t)
        assert rs[0].state is Release.RELEASING
        t, used = t + 4.0, used - 2_000  # a step every 4 s: each under SETTLE_S
    rs = release.step(rs, [gpu(used)], AFTER, t)
    assert rs[0].state is Release.RELEASED and t > release.SETTLE_S


def test_at_the_end_of_the_allowance_what_is_left_is_leaked_at_the_deadline_releasing():
    rs = release.step(rows(), [gpu(12_100)], AFTER, 0.1)
    rs = release.step(rs, [gpu(8_100)], AFTER, 1.0)
    assert rs[0].state is Release.RELEASING  # a pre-stop's deadline: said as it stands
    assert "6000 MiB releasing after 1.0 s" in rs[0].line()
    assert release.at_allowance_end(rs)[0].state is Release.LEAKED


def test_another_processes_growth_is_not_ours_and_ours_is_at_most_what_we_had():
    grown = procs({77: {0: 5_000}})
    (r,) = release.step(rows(), [gpu(5_100)], grown, 0.2)
    assert r.state is Release.RELEASED
    (r,) = release.step(rows(), [gpu(40_000)], AFTER, 0.2)  # someone else, unlisted
    assert r.left_mib == 10_000


def test_no_answer_is_not_judged_never_leaked_and_a_later_answer_judges():
    rs = release.step(rows(), None, None, 0.1)
    assert rs[0].state is Release.NOT_JUDGED and "no answer" in (rs[0].reason or "")
    assert not release.leaked(rs) and not release.finished(rs)  # asked again after a stall
    rs = release.step(rs, [gpu(2_100)], AFTER, 0.5)
    assert rs[0].state is Release.RELEASED


def test_faults_and_na_are_not_judged_with_their_reason():
    lost = release.step(rows(), [gpu(0, status=GpuStatus.LOST)], AFTER, 0.1)[0]
    assert lost.state is Release.NOT_JUDGED and "lost" in (lost.reason or "")
    hung = release.step(rows(), [gpu(12_100)],
                        procs(faults={0: (GpuStatus.UNAVAILABLE, "Timeout")}), 0.1)[0]
    assert hung.state is Release.NOT_JUDGED and "process list" in (hung.reason or "")
    na = release.step(rows(), [gpu(12_100)], procs({77: {0: None}}), 0.1)[0]
    assert na.state is Release.NOT_JUDGED and "not available" in (na.reason or "")
    assert not release.leaked([lost, hung, na])
    assert release.at_allowance_end([na])[0].state is Release.NOT_JUDGED


def test_na_before_the_stop_is_never_judged():
    (r,) = release.targets(BEFORE, [{0: None}], THEIRS)
    assert r.state is Release.NOT_JUDGED and r.base_mib is None
    assert release.step([r], [gpu(12_100)], AFTER, 9.0) == [r]
    assert release.finished([r]) and not release.leaked([r])
    (r,) = release.targets(BEFORE, MINE, [{0: None}])
    assert r.state is Release.NOT_JUDGED and "another process" in (r.reason or "")
    (r,) = release.targets([gpu(0, status=GpuStatus.UNAVAILABLE)], MINE, THEIRS)
    assert r.state is Release.NOT_JUDGED


def test_as_dict_says_released_in_or_left_after():
    rs = release.step(rows(), [gpu(12_100)], AFTER, 0.1)
    assert release.at_allowance_end(rs)[0].as_dict() == {
        "gpu": 0, "uuid": "GPU-0", "state": "leaked", "set_out_to_free_mib": 10_000,
        "left_mib": 10_000, "after_s": 0.1}


def test_post_stop_waits_while_unaccounted_memory_falls_and_settles_when_still():
    seen = release.falls({}, {0: 8_000}, 0.0)
    assert not release.still(seen, release.SETTLE_S - 0.1)
    seen = release.falls(seen, {0: 4_000}, 3.0)  # fell: counts again from 3 s
    assert seen == {0: (4_000, 3.0)}
    seen = release.falls(seen, {0: 4_000 - release.SLACK_MIB}, 7.0)  # within slack: still
    assert not release.still(seen, 7.9) and release.still(seen, 8.0)
    assert release.still({}, 0.0)  # nothing unaccounted: nothing to wait for


def test_na_process_memory_is_not_counted_as_zero_in_the_leak_check():
    from pveclean.core.gpufaults import unchecked
    from pveclean.core.report import find_leaks
    g = GpuMemory(0, "GPU-0", "H100", 81559, 512, 6_144, 0)
    na = procs({42: {0: None}})
    assert find_leaks([g], na, set(), set()) == []  # was: 6,144 MiB "leaked", reset advised
    (why,) = unchecked([g], na, set())
    assert "not available" in why and "not judged" in why
    assert [x.unaccounted_mib for x in find_leaks([g], procs(), set(), set())] == [6_144]
    assert unchecked([g], na, {5}) == []  # not the container's GPU


def test_gpus_with_no_process_list_judges_no_gpu_a_leak():
    """A process list that failed or hung: `gpus` no longer calls every GPU's used memory a
    leak ("reset with nvidia-smi -r"); each GPU is marked with why, not judged."""
    from pveclean.commands.gpulook import _ask_nvml
    from pveclean.core.gpumap import gpu_use
    from pveclean.host.nvml import NvmlUnavailable

    class Hung:
        def memory(self) -> list[GpuMemory]:
            return [gpu(30_000), gpu(12_000, index=1)]

        def processes(self) -> NvmlProcesses:
            raise NvmlUnavailable("NVML processes did not answer within 5.0 s")

        def pci_bus_ids(self) -> dict[int, object]:
            return {}

    warnings: list[str] = []
    gpus, used, _buses, source = _ask_nvml(Hung(), warnings)  # type: ignore[arg-type]
    assert set(used.faults) == {0, 1} and str(source.state) == "partial"
    uses = [gpu_use(g, None, []) for g in gpus]
    assert [u.leak_mib for u in uses] == [0, 0]
    assert all(u.unaccounted_mib is None for u in uses)
    assert any("no processes" in w for w in warnings)


def test_metrics_say_per_gpu_whether_nvml_answered_and_whether_it_was_usable():
    from prometheus_client.parser import text_string_to_metric_families

    from pveclean.core import metrics, metrics_gpus
    from tests.gpumaps import gmap, use

    def samples(m: object) -> dict[str, dict[str, float]]:
        text = metrics.render(metrics_gpus.families(m, "pve1", {}, [], 1.0))  # type: ignore
        return {f.name: {x.labels.get("gpu", "-"): x.value for x in f.samples}
                for f in text_string_to_metric_families(text)}

    s = samples(gmap([use(0, None, used=9000, unaccounted_mib=0),
                      use(1, None, used=9000, status="unavailable", unaccounted_mib=None)]))
    assert s["pveclean_gpu_nvml_ok"] == {"0": 1, "1": 0}
    assert s["pveclean_gpu_unaccounted_memory_bytes"] == {"0": 0}  # GPU 1 not judged
    assert s["pveclean_gpus_nvml_up"] == {"-": 1}
    assert samples(gmap([], nvml="NVML Shared Library Not Found"))[
        "pveclean_gpus_nvml_up"] == {"-": 0}


def test_a_reports_release_section_reads_back_equal():
    from pveclean.core.reportread import from_dict
    rs = release.step(rows(), [gpu(12_100)], AFTER, 0.1)
    rs = [*release.at_allowance_end(rs), release.GpuRelease(
        1, "GPU-1", Release.NOT_JUDGED, 5, reason="NVML gave no answer")]
    head = {"vmid": 129, "phase": "manual", "verdict": "leaked", "start": "x"}
    d = from_dict({**head, "release": [r.as_dict() for r in rs]})
    assert [r.as_dict() for r in d.release or []] == [r.as_dict() for r in rs]
    assert from_dict(head).release is None
    odd = from_dict({**head, "release": [{"gpu": 0, "state": "later-word"}]})
    assert odd.release is not None and odd.release[0].state is Release.NOT_JUDGED


def test_a_stops_leaked_release_is_leaked_bytes_in_metrics_and_the_verdict():
    from pveclean.core import metrics
    from tests.reportkit import report

    rs = release.at_allowance_end(release.step(rows(), [gpu(12_100)], AFTER, 0.1))
    rep = report(129, "clean").with_release(rs)
    assert rep.verdict == "leaked" and rep.leaked_mib() == 10_000
    assert any("10000 MiB leaked after 0.1 s" in w for w in rep.warnings)
    fams = {f.name: f for f in metrics.run_families(rep, 1.0, [])}
    assert list(fams["pveclean_last_leaked_bytes"].samples.values()) == [10_000 * (1 << 20)]
    released = release.step(rows(), [gpu(2_100)], AFTER, 0.2)
    ok = report(129, "clean").with_release(released)
    assert ok.verdict == "clean" and ok.warnings == [] and ok.leaked_mib() == 0
    assert report(129, "residual").with_release(rs).verdict == "residual"  # already worse


# ---- a holder in the kernel's exit, waited for while it makes progress ----------------------


@pytest.mark.parametrize(("before", "now", "moved"), [
    ((1000, 4, 50, 8000), (1000, 4, 50, 8000), False),  # nothing changed: a D-state wait
    ((1000, 4, 50, 8000), (900, 4, 50, 8000), True),  # its resident memory fell
    ((1000, 4, 50, 8000), (1000, 3, 50, 8000), True),  # a task is gone
    ((1000, 4, 50, 8000), (1000, 4, 51, 8000), True),  # CPU time: the kernel unpins pages
    ((1000, 4, 50, 8000), (1000, 4, 50, 6000), True),  # NVML lists less for it
    ((1000, 4, 50, 8000), (1100, 5, 50, 9000), False),  # growing is no way out
    ((None, None, None, None), (0, 1, 7, 0), False),  # nothing to compare
])
def test_progress_is_memory_or_tasks_falling_or_cpu_time_used(
        before: tuple[int | None, ...], now: tuple[int | None, ...], moved: bool) -> None:
    assert progressed(before, now) is moved  # type: ignore[arg-type]


def test_a_holder_in_exit_is_waited_for_while_it_progresses_and_not_after() -> None:
    still = (0, 1, 10, 4000)
    w = exit_step(None, True, still, 100.0)  # first seen: counts as progress
    assert (w.first_s, w.moved_s) == (100.0, 100.0)
    t, mib = 100.0, 4000
    for _ in range(10):  # 10 s in exit, NVML's figure falling every 2 s
        t += 2.0
        mib -= 400
        w = exit_step(w, True, (0, 1, 10, mib), t)
        assert w.moved_s == t and not exits_waited({7: w}, t, allowance_end=200.0)
    w = exit_step(w, True, (0, 1, 10, mib), t + 4.9)  # no progress for 4.9 s: still waited
    assert not exits_waited({7: w}, t + 4.9, 200.0)
    w = exit_step(w, True, (0, 1, 10, mib), t + 5.0)
    assert w.moved_s == t and exits_waited({7: w}, t + 5.0, 200.0)  # stalled for SETTLE_S
    assert exits_waited({7: exit_step(None, True, still, 150.0)}, 150.0, allowance_end=150.0)


def test_a_holder_not_in_exit_is_waited_for_until_the_deadline_as_before() -> None:
    frozen = InExit(False, (100, 1, 5, 0), 0.0, 0.0)
    assert not exits_waited({1: frozen}, 60.0, allowance_end=30.0)
    stalled = InExit(True, (0, 1, 5, 0), 0.0, 0.0)
    assert not exits_waited({1: stalled, 2: frozen}, 60.0, 30.0) and exits_waited(
        {1: stalled}, 60.0, 30.0) and not exits_waited({}, 60.0, 30.0)
    assert exit_step(frozen, True, frozen.marks, 9.0).moved_s == 9.0  # entering exit: moved


def test_the_report_says_how_long_each_was_in_exit() -> None:
    w = InExit(True, (0, 1, 5, 0), 10.2, 12.0)
    assert exit_note(w, 10.0, 20.5, 21.0) == ("gone 10.5 s after its SIGKILL: in the "
                                              "kernel's exit, waited for while it made "
                                              "progress")
    assert exit_note(w, 10.0, None, 17.5).startswith("in the kernel's exit 7.5 s after its "
                                                     "SIGKILL; no progress (memory, tasks, "
                                                     "CPU time) for the last 5.5 s")
