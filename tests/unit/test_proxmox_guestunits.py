"""proxmox/guestunits: stopping a container's systemd units through a stand-in pct (bounded,
judged from the host's cgroups, one clear line without systemctl), and the hints that name a
unit and the exact command."""

from __future__ import annotations

import time
from pathlib import Path

from pveclean.core.verdicts import Outcome
from pveclean.proxmox import guestunits
from tests.helpers import unit_holder


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
    hs = [unit_holder(10, "/lxc/129/ns/system.slice/a.service"),
          unit_holder(11, "/lxc/129/ns/system.slice/b.service"),
          unit_holder(12, "/lxc/129/ns/init.scope"),
          unit_holder(13, "/lxc/129/ns/system.slice/p.service", protected="protected name 'x'"),
          unit_holder(14, "/lxc/129/ns/.lxc")]
    out = guestunits.stop_units(129, hs, None, root, _fake_pct(tmp_path, "exit 0"), 5).as_dict()
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
    out = guestunits.stop_units(129, [unit_holder(10, "/lxc/129/ns/system.slice/a.service")], None,
                           root, _fake_pct(tmp_path, "exec sleep 30"), 0.5).as_dict()
    assert time.monotonic() - t0 < 5
    assert out["units"][0]["action"] == "timed out"


def test_a_container_without_systemctl_gets_one_clear_line(tmp_path: Path) -> None:
    root = _cgroups(tmp_path, {"lxc/129/ns/system.slice/a.service": "77\n"})
    pct = _fake_pct(tmp_path, "echo 'lxc-attach: 129: attach.c: Failed to exec \"systemctl\"' "
                              ">&2; exit 127")
    out = guestunits.stop_units(129, [unit_holder(10, "/lxc/129/ns/system.slice/a.service")], None,
                           root, pct, 5).as_dict()
    assert out["units"][0]["action"] == "failed" and "exit 127" in out["note"]
    assert "cleaning up as usual" in out["note"]
    out = guestunits.stop_units(129, [unit_holder(10, "/lxc/129/ns")], None, root, pct, 5).as_dict()
    assert out["units"] == [] and "no GPU holder of CT 129 runs in a systemd unit" in out["note"]
    out = guestunits.stop_units(129, [], None, root, pct, 5).as_dict()
    assert out["units"] == [] and out["note"] == "CT 129 has no GPU holders: no unit to stop"


def test_hints_name_the_unit_and_the_exact_command(tmp_path: Path) -> None:
    root = _cgroups(tmp_path, {"lxc/129/ns/system.slice/a.service": "77\n",
                               "lxc/129/ns/system.slice/b.service": ""})
    hs = [unit_holder(1, "/lxc/129/ns/system.slice/a.service"),
          unit_holder(2, "/lxc/129/ns/system.slice/b.service"),
          unit_holder(3, "/lxc/129/ns/init.scope")]
    hs[1].respawned_by, hs[1].round = "systemd (host PID 9)", 1
    got = guestunits.hints(129, hs, root, False, set())
    assert got == [
        "a.service in CT 129 is still active (1 process(es) in its cgroup); stop it with: "
        "pct exec 129 -- systemctl stop a.service (or: pveclean ct 129 --stop-units)",
        "b.service in CT 129 restarted its GPU holders; stop it with: "
        "pct exec 129 -- systemctl stop b.service (or: pveclean ct 129 --stop-units)"]
    assert guestunits.hints(129, hs, root, False, {"a.service", "b.service"}) == []
    # after a manual cleanup, a service whose holders were stopped and are not back (yet)
    c = [unit_holder(4, "/lxc/129/ns/system.slice/c.service")]
    c[0].outcome = Outcome.TERMINATED
    assert guestunits.hints(129, c, root, False, set()) == []  # a hook: the container stops
    assert guestunits.hints(129, c, root, False, set(), manual=True) == [
        "c.service in CT 129 ran the GPU holders stopped now, and starts them again later if "
        "it has Restart=; stop it with: pct exec 129 -- systemctl stop c.service (or: "
        "pveclean ct 129 --stop-units)"]
