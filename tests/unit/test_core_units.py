"""core.units: systemd unit names read from cgroup paths (container-controlled text, fuzzed),
what is never stopped, the stop command, and which holders run in which unit."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.core import unitgroups, units
from tests.helpers import unit_holder


@pytest.mark.parametrize(("name", "kind"), [
    ("sglang.service", "service"),
    ("vllm@qwen.service", "service"),
    ("a:b_c.d-e.socket", "socket"),
    ("dev-sda1.swap", "swap"),
    ("var-lib.mount", "mount"),
    ("proc-sys.automount", "automount"),
    ("x.timer", "timer"),
    ("system.slice", "slice"),
    ("session-3.scope", "scope"),
    ("multi-user.target", "target"),
    ("dev-sda.device", "device"),
    ("run.path", "path"),
    ("x.Service", None),  # the type is lower case
    ("x.services", None),
    ("x.foo", None),
    ("service", None),
    (".service", None),
    ("@x.service", None),
    ("a@.service", None),  # a template, never a running unit
    ("a@b@c.service", None),
    ("-x.service", None),
    ("a b.service", None),
    ("a/b.service", None),
    ("ä.service", None),
    ("", None),
    ("a" * 247 + ".service", "service"),  # 255 characters
    ("a" * 248 + ".service", None),
])
def test_unit_type(name: str, kind: str | None) -> None:
    assert units.unit_type(name) == kind


@pytest.mark.parametrize(("cgroup", "unit"), [
    ("/lxc/129/ns/./system.slice//a.service", "a.service"),  # empty and . components
    ("/lxc/129/ns/system.slice/x.socket", "x.socket"),
    ("/lxc/129/ns/system.slice/var-lib.mount", "var-lib.mount"),
    ("/lxc/129/ns/system.slice/x.timer", None),  # a timer holds no process
    ("/lxc/129/ns/system.slice/x.path/y.service", None),  # the first non-slice decides
    ("lxc/129/ns/a.service", "a.service"),  # no leading slash
    ("/lxc/a.service", None),
    ("/machine.slice/qemu.scope", "qemu.scope"),
])
def test_unit_of_more_paths(cgroup: str, unit: str | None) -> None:
    assert units.unit_of(cgroup) == unit


@pytest.mark.parametrize(("cgroup", "unit", "cut"), [
    ("/system.slice/nv.service/sub", "nv.service", "/system.slice/nv.service"),
    ("/lxc/129/ns/a.service", "a.service", "/lxc/129/ns/a.service"),
    ("/lxc/a.service/ns/a.service/x", "a.service", "/lxc/a.service/ns/a.service"),  # below ns
    ("/lxc/129/ns/system.slice", "a.service", None),
    ("", "a.service", None),
    ("/lxc/129/ns/a.service.bak", "a.service", None),  # whole components only
])
def test_unit_cgroup(cgroup: str, unit: str, cut: str | None) -> None:
    assert units.unit_cgroup(cgroup, unit) == cut


@pytest.mark.parametrize(("unit", "needle"), [
    ("x.socket", "a socket unit"),
    ("x.mount", "a mount unit"),
    ("x.swap", "a swap unit"),
    ("x.timer", "a timer unit"),
    ("user@0.service", "user's service manager"),
    ("user-runtime-dir@0.service", None),
    ("", "not a valid systemd unit name"),
])
def test_refusal(unit: str, needle: str | None) -> None:
    why = units.refusal(unit)
    assert why is None if needle is None else (why is not None and needle in why)


def test_init_is_refused_by_name_or_by_the_containers_init_unit() -> None:
    assert units.refusal("init.scope") == "it holds the container's init (PID 1)"
    assert units.refusal("a.service", init_unit="b.service") is None
    assert units.refusal("b.service", init_unit="b.service") == \
        "it holds the container's init (PID 1)"


def test_shell_command_lists_every_unit() -> None:
    assert units.shell_command(7, ["a.service", "b@c.service"]) == \
        "pct exec 7 -- systemctl stop a.service b@c.service"


def test_units_of_groups_holders_by_unit() -> None:
    holders = [
        unit_holder(10, "/lxc/129/ns/system.slice/a.service"),
        unit_holder(11, "/lxc/129/ns/system.slice/a.service/worker"),
        unit_holder(12, "/lxc/129/ns/system.slice/b.service", protected="nvidia-persistenced"),
        unit_holder(13, "/lxc/129/ns"),  # no unit
        unit_holder(14, "/lxc/129/ns/init.scope"),
    ]
    found = unitgroups.units_of(holders, None)
    assert sorted(found) == ["a.service", "b.service", "init.scope"]
    a = found["a.service"]
    assert (a.cgroup, a.pids, a.refused) == ("/lxc/129/ns/system.slice/a.service", [10, 11], None)
    assert found["b.service"].refused == \
        "it runs a protected holder (PID 12: nvidia-persistenced)"
    assert found["init.scope"].refused == "it holds the container's init (PID 1)"


def test_units_of_refuses_the_unit_that_holds_init() -> None:
    holders = [unit_holder(5, "/lxc/1/ns/a.service"), unit_holder(6, "/lxc/1/ns")]
    found = unitgroups.units_of(holders, init_unit="a.service")
    assert list(found) == ["a.service"]
    assert found["a.service"].pids == [5]
    assert found["a.service"].refused == "it holds the container's init (PID 1)"


STRICT = re.compile(r"[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]+)?\.(service|scope|socket|mount|swap)")


@pytest.mark.parametrize(("cgroup", "unit"), [
    ("/lxc/129/ns/system.slice/sglang.service", "sglang.service"),
    ("/lxc/129/ns/system.slice/sglang-qwen.service", "sglang-qwen.service"),
    ("/lxc/129/ns/system.slice/vllm@qwen.service", "vllm@qwen.service"),
    ("/lxc/129/ns/system.slice/system-vllm.slice/vllm@a.service", "vllm@a.service"),
    ("/lxc/129/ns/system.slice/docker.service/sub", "docker.service"),  # Delegate=yes
    ("/lxc/129/ns/system.slice/docker-0123abcd.scope", "docker-0123abcd.scope"),
    ("/lxc/129/ns/init.scope", "init.scope"),
    ("/lxc/129/ns/user.slice/user-1000.slice/session-3.scope", "session-3.scope"),
    ("/lxc/129/ns/user.slice/user-0.slice/user@0.service/app.slice/x.service", "user@0.service"),
    ("/lxc/129/ns/system.slice/dev-disk-by\\x2duuid.swap", "dev-disk-by\\x2duuid.swap"),
    ("/lxc/129/ns", None),  # no systemd: everything in the container's root cgroup
    ("/lxc/129/ns/.lxc", None),  # pct exec
    ("/lxc/129", None),
    ("/lxc/129/ns/system.slice", None),  # a slice holds no process of its own
    ("/lxc/129/ns/system.slice/foo@.service", None),  # a template never runs
    ("/lxc/129/ns/system.slice/evil;reboot.service", None),
    ("/lxc/129/ns/system.slice/a b.service", None),
    ("/lxc/129/ns/system.slice/-x.service", None),
    ("/lxc/129/ns/system.slice/x.service\n", None),
    ("/lxc/129/ns/system.slice/x.target", None),
    ("/lxc/129/ns/system.slice/\x1b[2Jx.service", None),
    ("/lxc/129/ns/system.slice/" + "a" * 250 + ".service", None),  # over 255 characters
    ("/lxc/129/x/system.slice/a.service", None),  # not below ns/
    ("/system.slice/nvidia-persistenced.service", "nvidia-persistenced.service"),
    ("/user.slice/user-0.slice/session-1.scope", "session-1.scope"),
    ("/init.scope", "init.scope"),
    ("/lxc.monitor/129", None),
    ("/", None),
    ("", None),
    (None, None),
])
def test_unit_from_cgroup_path(cgroup: str | None, unit: str | None) -> None:
    assert units.unit_of(cgroup) == unit


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=6))
def test_unit_names_from_any_cgroup_path_are_strict(parts: list[str]) -> None:
    unit = units.unit_of("/lxc/129/ns/" + "/".join(parts))
    assert unit is None or (STRICT.fullmatch(unit) and len(unit) <= 255)


@pytest.mark.parametrize(("unit", "why"), [
    ("sglang.service", None),
    ("vllm@qwen.service", None),
    ("init.scope", "init"),
    ("system.slice", "slice"),
    ("session-3.scope", "scope unit"),
    ("user@1000.service", "user's service manager"),
    ("a;b.service", "not a valid"),
])
def test_what_is_never_stopped(unit: str, why: str | None) -> None:
    got = units.refusal(unit)
    assert (got is None) if why is None else (got is not None and why in got)


def test_the_unit_holding_the_container_init_is_never_stopped() -> None:
    assert units.refusal("fake-init.service", init_unit="fake-init.service")


def test_stop_command_passes_each_unit_as_its_own_argument() -> None:
    assert units.stop_command(129, ["a.service", "b@c.service"]) == [
        "exec", "129", "--", "systemctl", "stop", "--", "a.service", "b@c.service"]
    assert units.shell_command(129, ["a.service"]) == "pct exec 129 -- systemctl stop a.service"


def test_unit_cgroup_is_cut_out_of_a_member_path() -> None:
    assert units.unit_cgroup("/lxc/129/ns/system.slice/d.service/sub/x", "d.service") == \
        "/lxc/129/ns/system.slice/d.service"
    assert units.unit_cgroup("/lxc/129/ns", "d.service") is None
