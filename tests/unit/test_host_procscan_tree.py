"""An NVML process belongs to the container by its own cgroup, not by whether the walk saw
it; a verification look does not read again the fds of processes known to hold nothing."""

from __future__ import annotations

from pathlib import Path

from pveclean.core.discovery import merge_nvml
from pveclean.core.records import HostView, NvmlProcesses
from pveclean.host.procscan import scan_host, w_nvml_pids
from tests.unit.test_host_devnodes import task
from tests.unit.test_host_reads import fake_process, scope_of


def test_an_nvml_pid_the_walk_missed_is_ours_by_its_own_cgroup(proc: Path,
                                                              tmp_path: Path) -> None:
    scope = scope_of(tmp_path, [])
    fake_process(proc, 300, cgroup="/lxc/129/ns/hop-7")  # hopped after the walk
    fake_process(proc, 301, cgroup="/lxc/1290/ns")  # another container: a prefix only
    fake_process(proc, 302, cgroup="/lxc/129")
    built, named = w_nvml_pids([], [300, 301, 302, 303], scope)
    assert [(h.host_pid, h.cgroup) for h in built] == [(300, "/lxc/129/ns/hop-7"),
                                                       (302, "/lxc/129")]
    assert named == [(301, "python3", "/lxc/1290/ns"), (303, None, None)]
    view = HostView({}, {}, {}, None)
    others = merge_nvml(view, NvmlProcesses({300: {0: 4096}, 301: {1: 10}}),
                        lambda found, unseen: w_nvml_pids(found, unseen, scope))
    assert view.holders[300].gpu_memory_mib == {0: 4096} and "nvml" in view.holders[300].sources
    assert [o.host_pid for o in others] == [301]


def test_a_look_skips_the_fds_of_known_non_holders_only(proc: Path, tmp_path: Path) -> None:
    scope = scope_of(tmp_path, [400, 401])
    for pid in (400, 401):
        d = fake_process(proc, pid)
        d.joinpath("fd").rmdir()
        task(d, {"3": ("/dev/null", 25)})  # the scope's GPU, on devtmpfs
    assert sorted(scan_host(scope).holders) == [400, 401]
    view = scan_host(scope, quiet={400: 500, 401: 999})  # 401's PID is another process now
    assert sorted(view.holders) == [401] and sorted(view.statuses) == [400, 401]
