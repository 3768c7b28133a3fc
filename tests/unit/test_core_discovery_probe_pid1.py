"""A probe that names the container's PID 1 changes nothing: its output is the tenant's."""

from __future__ import annotations

from pveclean.core.discovery import merge_probe
from pveclean.proxmox.probe import ProbeResult, parse_probe
from tests.unit.test_core_discovery import SCOPE, builder, view


def test_a_pid_1_only_the_probe_names_is_ignored_with_a_warning() -> None:
    v = view()
    del v.holders[1001]  # the host view does not see PID 1 (host 1001) hold anything
    calls: list[list[object]] = []
    result = parse_probe("fd 1 /dev/nvidia0\nmap 1 /dev/nvidia0\nend\n")
    warnings, new = merge_probe(v, result, SCOPE, builder(calls))  # type: ignore[arg-type]
    assert new == [] and calls == [[]]
    assert 1001 not in v.holders
    assert len(warnings) == 1 and "PID 1" in warnings[0] and "ignored" in warnings[0]


def test_a_pid_1_the_host_view_sees_holding_stays_as_the_host_view_says() -> None:
    v = view()
    warnings, new = merge_probe(v, ProbeResult({1: ["/dev/nvidia0"], 2: ["/dev/nvidia0"]}),
                                SCOPE, builder([]))
    assert new == []
    assert v.holders[1001].sources == ["host"]  # the probe adds nothing to it
    assert v.holders[1002].sources == ["host", "probe"]
    assert any("PID 1" in w for w in warnings)
