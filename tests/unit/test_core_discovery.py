"""Discovery's merges on hand-built host views (the probe's and NVML's findings), and the
records they work on: Deadline on a fake clock, protected names."""

from __future__ import annotations

from pathlib import Path

import pytest

from pveclean.core.discovery import merge_nvml, merge_probe, protected_name, unwalked
from pveclean.core.records import (
    Deadline,
    GpuDevices,
    Holder,
    HostView,
    NvmlProcesses,
    ProcStatus,
    Scope,
    SourceState,
    in_tree,
)
from pveclean.proxmox.probe import ProbeResult

SCOPE = Scope(129, Path("/sys/fs/cgroup/lxc/129"), GpuDevices({}, frozenset()), frozenset())


def status(pid: int, ct_pid: int | None, name: str = "python3") -> ProcStatus:
    nspid = (pid,) if ct_pid is None else (pid, ct_pid)
    return ProcStatus(pid, name, "S", 1, 0, nspid, pid * 100)


def holder(pid: int, ct_pid: int | None = None) -> Holder:
    return Holder(host_pid=pid, starttime=pid * 100, ct_pid=ct_pid, name="python3", exe=None,
                  argv=("python3",), uid=0, user="root", state="S", ppid=1,
                  cgroup="/lxc/129/ns", sources=["host"])


def view() -> HostView:
    """Host PIDs 1001 (CT 1, holder), 1002 (CT 2, holder), 1003 (CT 3, not a holder), 5 (host)."""
    statuses = {1001: status(1001, 1), 1002: status(1002, 2), 1003: status(1003, 3, "worker"),
                5: status(5, None)}
    return HostView(holders={1001: holder(1001, 1), 1002: holder(1002, 2)}, statuses=statuses,
                    tree={1003: "/ns/app.service"}, init_pid=1001)


def builder(calls: list[list[tuple[ProcStatus, str]]]):  # type: ignore[no-untyped-def]
    def make(found: list[tuple[ProcStatus, str]]) -> list[Holder]:
        calls.append(found)
        return [holder(st.pid, st.nspid[1]) for st, _cg in found]
    return make


def test_probe_holders_the_host_saw_gain_the_probe_as_a_source() -> None:
    v, calls = view(), []
    warnings, new = merge_probe(v, ProbeResult({2: ["/dev/nvidia0"]}), SCOPE, builder(calls))
    assert warnings == [] and new == [] and calls == [[]]
    assert v.holders[1002].sources == ["host", "probe"]
    assert v.holders[1001].sources == ["host"]


def test_a_process_only_the_probe_saw_is_built_and_added_with_its_paths() -> None:
    v, calls = view(), []
    warnings, new = merge_probe(v, ProbeResult({3: ["/dev/nvidia0", "/dev/nvidiactl"]}),
                                SCOPE, builder(calls))
    assert [h.host_pid for h in new] == [1003]
    assert calls[0][0][1] == "/ns/app.service"
    assert [str(d) for d in new[0].devices] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert new[0].sources == ["host", "probe"] and v.holders[1003] is new[0]
    assert warnings == ["probe found PID 1003 (worker) holding /dev/nvidia0, /dev/nvidiactl "
                        "that the host view did not match"]


def test_container_pids_no_process_has_are_one_warning_however_many() -> None:
    v = view()
    invented = {n: ["/dev/nvidia0"] for n in range(100, 120)}
    warnings, new = merge_probe(v, ProbeResult(invented), SCOPE, builder([]))
    assert new == [] and len(warnings) == 1
    assert warnings[0].startswith("probe named 20 container PID(s) that no process")
    assert warnings[0].endswith("100, 101, 102, 103, 104, 105, 106, 107, 108, 109 ...")


def test_nvml_memory_goes_to_the_holders_and_outsiders_are_named() -> None:
    v, asked = view(), []

    def read(found: list[tuple[ProcStatus, str]], outside: list[int]
             ) -> tuple[list[Holder], list[tuple[int, str | None, str | None]]]:
        asked.append(([st.pid for st, _ in found], outside))
        return [holder(st.pid, st.nspid[1]) for st, _ in found], \
            [(pid, "Xorg", "/system.slice/x.service") for pid in outside]

    others = merge_nvml(v, NvmlProcesses({1001: {0: 700}, 1003: {1: None}, 77: {0: 300}}), read)
    assert asked == [([1003], [77])]
    assert v.holders[1001].gpu_memory_mib == {0: 700}
    assert v.holders[1001].sources == ["host", "nvml"]
    assert v.holders[1003].gpu_memory_mib == {1: None} and v.holders[1003].sources == [
        "host", "nvml"]
    assert [o.as_dict() for o in others] == [
        {"host_pid": 77, "name": "Xorg", "cgroup": "/system.slice/x.service",
         "gpu_memory_mib": {0: 300}}]


def test_nvml_asks_no_reads_when_every_process_is_a_known_holder() -> None:
    v = view()

    def read(*_a: object) -> tuple[list[Holder], list[tuple[int, str | None, str | None]]]:
        raise AssertionError("no reads needed")

    assert merge_nvml(v, NvmlProcesses({1002: {0: 5}}), read) == []
    assert v.holders[1002].gpu_memory_mib == {0: 5}
    assert merge_nvml(v, NvmlProcesses(), read) == []


def test_protected_names_match_comm_cut_to_15_the_exe_and_argv0() -> None:
    protect = frozenset({"nvidia-persistenced"})
    assert protected_name("nvidia-persiste", None, (), protect) == "nvidia-persistenced"
    assert protected_name("x", "/usr/bin/nvidia-persistenced (deleted)", (), protect) == \
        "nvidia-persistenced"
    assert protected_name("x", None, ("/opt/nvidia-persistenced", "--verbose"), protect) == \
        "nvidia-persistenced"
    assert protected_name("x", None, ("/opt/my dir/nvidia-persistenced",), protect) == \
        "nvidia-persistenced"  # argv[0] whole, spaces and all
    assert protected_name("python3", "/usr/bin/python3", ("python3", "a.py"), protect) is None
    assert protected_name("x", None, ("/opt/nvidia-persistenced x",), protect) is None


def test_an_unwalked_tree_stands_as_a_protected_holder() -> None:
    h = unwalked("more than 40 cgroups", SCOPE)
    assert h.protected == "not looked at: more than 40 cgroups" and h.cgroup == "/lxc/129"


def test_in_tree_is_the_container_and_below_only() -> None:
    assert in_tree("/lxc/129", 129) and in_tree("/lxc/129/ns/a", 129)
    assert not in_tree("/lxc/1290", 129) and not in_tree(None, 129)


class FakeClock:
    def __init__(self, t: float = 50.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_deadline_reads_only_the_clock_it_is_given() -> None:
    clock = FakeClock()
    d = Deadline(10.0, clock)
    assert (d.start, d.end, d.remaining(), d.elapsed(), d.expired()) == (50.0, 60.0, 10.0, 0.0,
                                                                         False)
    clock.t = 57.5
    assert d.remaining() == 2.5 and d.elapsed() == 7.5 and not d.expired()
    assert d.cap(1.0) == 1.0 and d.cap(5.0) == 2.5
    clock.t = 60.0
    assert d.expired() and d.remaining() == 0.0
    assert d.cap(5.0) == pytest.approx(0.05)  # one last short try, never zero
    clock.t = 70.0
    assert d.remaining() == 0.0 and d.elapsed() == 20.0


def test_only_gpus_keeps_the_scope_s_gpus_and_their_faults() -> None:
    from dataclasses import replace

    from pveclean.core.discovery import only_gpus
    from pveclean.core.records import GpuStatus

    procs = NvmlProcesses({10: {0: 5, 1: 7}, 11: {1: None}, 12: {2: 3}},
                          {1: (GpuStatus.LOST, "handle: GpuIsLost"),
                           3: (GpuStatus.UNAVAILABLE, "process list: Unknown")})
    assert only_gpus(procs, SCOPE) is procs and only_gpus(None, SCOPE) is None
    got = only_gpus(procs, replace(SCOPE, gpu_indices=frozenset({0, 1})))
    assert got == NvmlProcesses({10: {0: 5, 1: 7}, 11: {1: None}},
                                {1: (GpuStatus.LOST, "handle: GpuIsLost")})
    assert only_gpus(procs, replace(SCOPE, gpu_indices=frozenset({0}))) == NvmlProcesses(
        {10: {0: 5}})


def test_nvml_source_says_why_nvml_has_no_answer() -> None:
    from pveclean.core.discovery import nvml_source

    def said(answered: bool, on: bool, error: str | None, failed: str | None) -> str:
        return str(nvml_source(answered, on, error, failed))  # as the report shows it

    assert nvml_source(True, True, "an earlier error", "failed").ok
    assert said(True, True, "an earlier error", "failed") == "ok"
    assert said(False, False, "disabled", None) == "disabled"
    assert said(False, True, "NVML init failed: x", None) == (
        "unavailable: NVML init failed: x")
    assert said(False, True, "NVML init failed: x", "failed") == (
        "unavailable: NVML init failed: x")
    assert said(False, True, None, "did not finish") == (
        "not asked: the host scan did not finish")
    assert nvml_source(False, True, None, "did not finish").state is SourceState.NOT_RUN
