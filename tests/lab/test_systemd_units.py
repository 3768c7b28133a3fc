"""Systemd units in lab containers (the stand-in in tests/harness/fakesystemd.py): --stop-units
ends respawn loops, restarting units are named, hostile unit names are never passed on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.harness import fakesystemd as labsd
from tests.harness.lxclab import Lab
from tests.helpers import run_json


def test_stop_units_ends_a_respawn_loop_that_plain_ct_leaves_residual(lab: Lab,
                                                                       vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    labsd.install_systemd(lab, vmid)
    unit = "sglang-qwen.service"
    w = labsd.add_unit(lab, vmid, unit, "python3", hold=["/dev/nvidia0", "/dev/nvidiactl"],
                       gpu_mib={0: 4096})
    init = lab.init_pid(vmid)
    assert labsd.state(lab, vmid, unit) == "active"
    assert Path(f"/proc/{init}/cgroup").read_text().endswith(f"/lxc/{vmid}/ns/init.scope\n")
    # plain ct: systemd brings the worker back after every kill -> residual, unit named
    code, rep = run_json(lab, vmid)
    assert code == 1 and rep["verdict"] == "residual"
    assert {h["unit"] for h in rep["holders"]} == {unit}
    assert rep["holders"][-1]["outcome"] == "survived"
    assert labsd.starts(lab, vmid, unit) == 5
    cmd = f"pct exec {vmid} -- systemctl stop {unit}"
    assert any(cmd in h and "restarted its GPU holders" in h for h in rep["hints"])
    text = lab.pveclean("ct", str(vmid), "--dry-run").stdout
    assert f"hint: {unit} in CT {vmid}" in text and unit in text.splitlines()[3]
    # --stop-units: the unit is stopped first, nothing comes back, the run is clean
    survivor = [p for p in w.host_pids(lab) if lab.alive(p)]
    assert len(survivor) == 1
    lab.set_gpu_memory(w, {0: 4096})  # the respawned worker loads its model again
    code, rep = run_json(lab, vmid, "--stop-units")
    assert code == 0 and rep["verdict"] == "clean", rep
    assert rep["summary"]["freed_mib"] == 4096
    assert rep["unit_stops"]["units"] == [{"unit": unit, "holders": survivor,
                                           "processes_left": 0, "action": "stopped",
                                           "detail": "its cgroup is empty"}]
    assert rep["unit_stops"]["command"] == cmd
    assert rep["summary"]["units_stopped"] == [unit] and "hints" not in rep
    assert labsd.state(lab, vmid, unit) == "inactive" and labsd.starts(lab, vmid, unit) == 5
    time.sleep(0.3)
    assert not [p for p in w.host_pids(lab) if lab.alive(p)]
    assert labsd.unit_pids(lab, vmid, unit) == []
    assert init is not None and lab.alive(init)  # the container's init is untouched


def test_a_unit_that_restarts_after_systemd_s_default_delay_is_named(lab: Lab,
                                                                      vmid: int) -> None:
    """systemd starts a service again RestartSec (100 ms by default) after its main process
    exits: later than the 50 ms a clean result must hold. A manual run looks at the unit's
    cgroup once that has passed, and names the unit that came back."""
    lab.create_ct(vmid, gpus=(0,))
    labsd.install_systemd(lab, vmid)
    unit = "vllm-worker.service"
    labsd.add_unit(lab, vmid, unit, "python3", hold=["/dev/nvidia0"], restart_sec=0.1)
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean", rep  # the GPU was free when it ended
    assert labsd.starts(lab, vmid, unit) == 2
    hint = f"{unit} in CT {vmid} is still active (1 process(es) in its cgroup); stop it with: " \
           f"pct exec {vmid} -- systemctl stop {unit}"
    assert any(h.startswith(hint) for h in rep.get("hints", [])), rep.get("hints")


def test_a_unit_that_restarts_after_the_run_is_named_too(lab: Lab, vmid: int) -> None:
    """RestartSec=3: the holders come back after the run has ended; the report names the
    unit all the same."""
    lab.create_ct(vmid, gpus=(0,))
    labsd.install_systemd(lab, vmid)
    unit = "sglang.service"
    labsd.add_unit(lab, vmid, unit, "python3", hold=["/dev/nvidia0"], restart_sec=3)
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean", rep
    assert labsd.starts(lab, vmid, unit) == 1  # not back yet
    assert rep["hints"] == [
        f"{unit} in CT {vmid} ran the GPU holders stopped now, and starts them again later if "
        f"it has Restart=; stop it with: pct exec {vmid} -- systemctl stop {unit} (or: "
        f"pveclean ct {vmid} --stop-units)"]


def test_stop_units_without_systemd_goes_on_with_the_cleanup(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    plain = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    unit_like = lab.run_in_ct(vmid, "vllm", hold=["/dev/nvidia0"],
                              cgroup="system.slice/vllm.service")
    r = lab.pveclean("ct", str(vmid), "--stop-units")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict clean" in r.stdout
    assert "unit vllm.service: failed (systemctl stop failed in CT" in r.stdout
    assert "cleaning up as usual" in r.stdout
    assert not [p for w in (plain, unit_like) for p in w.host_pids(lab) if lab.alive(p)]


def test_a_hostile_unit_name_is_never_passed_to_systemctl(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    labsd.install_systemd(lab, vmid)
    name = "x;touch${IFS}owned;.service"
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], cgroup=f"system.slice/{name}")
    code, rep = run_json(lab, vmid, "--stop-units")
    assert code == 0 and rep["verdict"] == "clean"
    (h,) = rep["holders"]
    assert h["unit"] is None and h["cgroup"].endswith(name)
    assert rep["unit_stops"]["units"] == []
    assert not (lab.rootfs(vmid) / "owned").exists()
    assert not [p for p in w.host_pids(lab) if lab.alive(p)]
    assert os.path.exists(lab.rootfs(vmid) / "usr/bin/systemctl")


def test_status_and_the_report_name_each_holders_unit(lab: Lab, vmid: int) -> None:
    from tests.harness import pvesh
    from tests.helpers import pveclean as pveclean_on_host

    pvesh.install(lab.root)
    lab.create_ct(vmid, gpus=(0,))
    labsd.install_systemd(lab, vmid)
    w = labsd.add_unit(lab, vmid, "sglang.service", "python3", hold=["/dev/nvidia0"],
                       gpu_mib={0: 512})
    (pid,) = w.host_pids(lab)
    res = pveclean_on_host(lab, "status", "--json")
    assert res.returncode == 0, res.stderr
    ct = next(e for e in json.loads(res.stdout)["containers"] if e["vmid"] == vmid)
    assert [(h["host_pid"], h["unit"]) for h in ct["holders"]] == [(pid, "sglang.service")]
    text = pveclean_on_host(lab, "status").stdout
    assert f"  holder: PID {pid} python3 in sglang.service (GPU 0: 512 MiB)" in text
    code, rep = run_json(lab, vmid, "--dry-run")
    assert code == 0 and rep["holders"][0]["unit"] == "sglang.service"
    assert rep["hints"] == [f"sglang.service in CT {vmid} runs GPU holders; stop it with: "
                            f"pct exec {vmid} -- systemctl stop sglang.service (or: pveclean "
                            f"ct {vmid} --stop-units)"]
