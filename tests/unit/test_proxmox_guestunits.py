"""The systemd units behind GPU holders without a lab: read from cgroup paths
(container-controlled text), what is never stopped, bounded stops, and hints."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.core import units
from pveclean.core.records import Holder
from pveclean.proxmox import guestunits

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


def _holder(pid: int, cgroup: str, protected: str | None = None) -> Holder:
    return Holder(host_pid=pid, starttime=1, ct_pid=pid, name="python3", exe=None, cmdline="",
                  uid=0, user="root", state="S", ppid=1, cgroup=cgroup, protected=protected,
                  unit=units.unit_of(cgroup))


def _fake_pct(tmp_path: Path, body: str) -> str:
    pct = tmp_path / "pct"
    pct.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/argv\n{body}\n")
    pct.chmod(0o755)
    return str(pct)


def _cgroups(tmp_path: Path, procs: dict[str, str]) -> Path:
    root = tmp_path / "cg"
    for rel, text in procs.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        (root / rel / "cgroup.procs").write_text(text)
    return root


def test_stop_units_stops_only_stoppable_units_and_judges_from_the_host(tmp_path: Path) -> None:
    root = _cgroups(tmp_path, {"lxc/129/ns/system.slice/a.service": "",
                               "lxc/129/ns/system.slice/b.service": "4242\n"})
    hs = [_holder(10, "/lxc/129/ns/system.slice/a.service"),
          _holder(11, "/lxc/129/ns/system.slice/b.service"),
          _holder(12, "/lxc/129/ns/init.scope"),
          _holder(13, "/lxc/129/ns/system.slice/p.service", protected="protected name 'x'"),
          _holder(14, "/lxc/129/ns/.lxc")]
    out = guestunits.stop_units(129, hs, None, root, _fake_pct(tmp_path, "exit 0"), 5)
    assert (tmp_path / "argv").read_text() == \
        "exec 129 -- systemctl stop -- a.service b.service\n"
    by = {u["unit"]: u for u in out["units"]}
    assert by["a.service"]["action"] == "stopped"
    assert by["b.service"]["action"] == "incomplete" and by["b.service"]["processes_left"] == 1
    assert by["init.scope"]["action"] == "not stopped"
    assert "protected" in by["p.service"]["detail"]
    assert set(by) == {"a.service", "b.service", "init.scope", "p.service"}


def test_stop_units_is_bounded_and_says_so(tmp_path: Path) -> None:
    root = _cgroups(tmp_path, {"lxc/129/ns/system.slice/a.service": "77\n"})
    t0 = time.monotonic()
    out = guestunits.stop_units(129, [_holder(10, "/lxc/129/ns/system.slice/a.service")], None,
                           root, _fake_pct(tmp_path, "exec sleep 30"), 0.5)
    assert time.monotonic() - t0 < 5
    assert out["units"][0]["action"] == "timed out"


def test_a_container_without_systemctl_gets_one_clear_line(tmp_path: Path) -> None:
    root = _cgroups(tmp_path, {"lxc/129/ns/system.slice/a.service": "77\n"})
    pct = _fake_pct(tmp_path, "echo 'lxc-attach: 129: attach.c: Failed to exec \"systemctl\"' "
                              ">&2; exit 127")
    out = guestunits.stop_units(129, [_holder(10, "/lxc/129/ns/system.slice/a.service")], None,
                           root, pct, 5)
    assert out["units"][0]["action"] == "failed" and "exit 127" in out["note"]
    assert "cleaning up as usual" in out["note"]
    out = guestunits.stop_units(129, [_holder(10, "/lxc/129/ns")], None, root, pct, 5)
    assert out["units"] == [] and "no GPU holder of CT 129 runs in a systemd unit" in out["note"]
    out = guestunits.stop_units(129, [], None, root, pct, 5)
    assert out["units"] == [] and out["note"] == "CT 129 has no GPU holders: no unit to stop"


def test_hints_name_the_unit_and_the_exact_command(tmp_path: Path) -> None:
    root = _cgroups(tmp_path, {"lxc/129/ns/system.slice/a.service": "77\n",
                               "lxc/129/ns/system.slice/b.service": ""})
    hs: list[dict[str, Any]] = [
        {"host_pid": 1, "unit": "a.service", "cgroup": "/lxc/129/ns/system.slice/a.service"},
        {"host_pid": 2, "unit": "b.service", "cgroup": "/lxc/129/ns/system.slice/b.service",
         "respawned_by": "systemd (host PID 9)", "round": 1},
        {"host_pid": 3, "unit": "init.scope", "cgroup": "/lxc/129/ns/init.scope"}]
    got = guestunits.hints(129, hs, root, False, set())
    assert got == [
        "a.service in CT 129 is still active (1 process(es) in its cgroup); stop it with: "
        "pct exec 129 -- systemctl stop a.service (or: pveclean ct 129 --stop-units)",
        "b.service in CT 129 restarted its GPU holders; stop it with: "
        "pct exec 129 -- systemctl stop b.service (or: pveclean ct 129 --stop-units)"]
    assert guestunits.hints(129, hs, root, False, {"a.service", "b.service"}) == []
    # after a manual cleanup, a service whose holders were stopped and are not back (yet)
    c = [{"host_pid": 4, "unit": "c.service", "cgroup": "/lxc/129/ns/system.slice/c.service",
          "outcome": "terminated"}]
    assert guestunits.hints(129, c, root, False, set()) == []  # a hook: the container stops
    assert guestunits.hints(129, c, root, False, set(), manual=True) == [
        "c.service in CT 129 ran the GPU holders stopped now, and starts them again later if "
        "it has Restart=; stop it with: pct exec 129 -- systemctl stop c.service (or: "
        "pveclean ct 129 --stop-units)"]
