"""What `gpus`' look could not read whole is typed (core/notjudged.py) and never innocent
(issue 39): a tree the scan could not walk, a process it could not judge, the host's
processes a reader gave up on each refuse a VM's start, naming it, and are a `not judged`
row in `gpus` (before, an unwalked tree was a "(cgroups not walked)" row with no GPU, which
the plan skipped, and the rest were warnings text)."""

from __future__ import annotations

from dataclasses import replace

from pveclean.commands.gpuview import render_gpus
from pveclean.core import notjudged
from pveclean.core.gpumap import GpuMap
from pveclean.core.owners import HOST
from pveclean.core.vmguard import Decision, VmStart, plan, still_held
from tests import gpumaps
from tests.gpumaps import pci, pcis

A0 = "0000:18:00.0"


def with_unread(*rows: notjudged.NotJudged) -> GpuMap:
    return replace(gpumaps.gmap([gpumaps.use(0, A0, [])]), not_judged=rows)


def test_each_part_not_read_whole_refuses_the_start_naming_it() -> None:
    rows = (notjudged.tree(129, "not looked at: a cgroup path past PATH_MAX"),
            *notjudged.of_container(130, {4242: ["io_uring ring (inode 7) kept by its "
                                                  "mapping: not judged"]}),
            *notjudged.of_host(["PID 77: reads stalled: not looked at"]))
    m = with_unread(*rows)
    for policy in ("refuse", "stop-containers"):
        p = plan(VmStart(200, pcis(A0)), m, policy, [])
        assert p.decision is Decision.REFUSE
        assert p.blockers == [
            "CT 129: its cgroup tree could not be read whole, so what it holds cannot be told "
            "(not looked at: a cgroup path past PATH_MAX): look with `pveclean gpus`",
            "CT 130: PID 4242 could not be read whole, so what it holds cannot be told "
            "(io_uring ring (inode 7) kept by its mapping: not judged): look with "
            "`pveclean gpus`",
            "host: the host's processes could not be read whole, so what it holds cannot be "
            "told (PID 77: reads stalled: not looked at): look with `pveclean gpus`"]
    assert len(still_held(pcis(A0), m, [])) == 3
    clear = plan(VmStart(200, pcis(A0)), with_unread(), "refuse", [])
    assert clear.decision is Decision.CLEAR


def test_a_gpu_already_off_the_nvidia_driver_is_not_blocked_by_them() -> None:
    m = replace(gpumaps.gmap([]), not_judged=(notjudged.tree(129, "x"),))
    p = plan(VmStart(200, pcis(A0), drivers={pci(A0): "vfio-pci"}), m, "refuse", [])
    assert p.decision is Decision.CLEAR


def test_many_processes_of_one_tree_are_counted_in_one_row() -> None:
    rows = notjudged.of_container(129, {p: ["capped"] for p in range(100, 130)})
    assert len(rows) == notjudged.MOST_PER_TREE + 1
    assert rows[-1].what == "10 more processes" and rows[0].host_pid == 100


def test_gpus_shows_them_and_its_json_carries_them_typed() -> None:
    m = with_unread(notjudged.NotJudged(HOST, "the host's processes", "PID 9: stalled"))
    text = render_gpus(m)
    assert "NOT JUDGED (could not be read whole; a VM's start is refused while any is):" in text
    assert "the host's processes" in text and "PID 9: stalled" in text
    assert m.as_dict()["not_judged"] == [{"owner": "host", "vmid": None, "host_pid": None,
                                          "what": "the host's processes",
                                          "why": "PID 9: stalled"}]
    assert "not_judged" not in with_unread().as_dict()
