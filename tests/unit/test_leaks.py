"""Leak detection: GPU memory no process accounts for, on the container's GPUs only."""

from __future__ import annotations


def test_leaks_only_on_the_containers_gpus() -> None:
    from pveclean.core.records import GpuMemory
    from pveclean.core.report import find_leaks

    gpus = [GpuMemory(i, f"GPU-{i}", "H100", 81559, 512, used, minor=i)
            for i, used in enumerate([5000, 3000, 2000])]
    procs = {111: {0: 5000}, 222: {1: 1000}}  # GPU 1: 2000 unaccounted; GPU 2: 2000
    leaks = find_leaks(gpus, procs, minors={1}, used_by_ct=set())
    assert [(x["index"], x["unaccounted_mib"]) for x in leaks] == [(1, 2000)]
    assert {x["index"] for x in find_leaks(gpus, procs, set(), set())} == {1, 2}
    assert [x["index"] for x in find_leaks(gpus, procs, set(), {2})] == [2]
    v1 = [GpuMemory(0, "GPU-0", "H100", 81559, None, 9000, minor=0)]
    assert find_leaks(v1, {}, {0}, set()) == []  # v1: reserved is inside used, cannot tell
