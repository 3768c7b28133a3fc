"""A tree that holds still (issue 26, item 3): processes that move while pveclean reads the
container's tree (a holder hopping between fresh cgroups, an fd relay that forks and exits
faster than the walk, a holder that multiplies on SIGTERM) are caught in one run; NVML's
holders are stopped when the host scan runs late; the container is never left frozen."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.lxclab import Lab
from tests.helpers import run_json, wait_for

GPU = "/dev/nvidia0"


def thawed(lab: Lab, vmid: int) -> bool:
    cg = lab.cgroup(vmid)
    return ((cg / "cgroup.freeze").read_text().strip() == "0"
            and "frozen 0" in (cg / "cgroup.events").read_text())


def holding(lab: Lab, vmid: int, node: Path) -> list[int]:
    """Processes of the container's tree with an fd on `node` now."""
    out = []
    rdev = os.stat(node).st_rdev
    for pid in lab.tree_pids(vmid):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                if st.st_rdev == rdev and (st.st_mode & 0o170000) == 0o020000:
                    out.append(pid)
                    break
        except OSError:
            continue
    return out


def test_a_holder_hopping_between_fresh_cgroups_is_stopped(lab: Lab, vmid: int) -> None:
    """It makes a cgroup, moves there, removes the old one, without end: a walk of the tree
    never finds it, and NVML's 4 GiB were put in `other_gpu_users` with a cgroup inside the
    container. Frozen, it stands still in one cgroup; its own cgroup proves it ours."""
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_program(vmid, "hopper", ["--hold", GPU])
    (pid,) = w.host_pids(lab)
    lab.set_gpu_memory(w, {0: 4096})
    # a dry run does not freeze: the walk may miss it, its own cgroup still makes it ours
    _code, dry = run_json(lab, vmid, "--dry-run")
    assert [h["host_pid"] for h in dry["holders"]] == [pid], dry
    assert not dry["other_gpu_users"], dry["other_gpu_users"]
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean", rep
    assert [h["host_pid"] for h in rep["holders"]] == [pid], rep["holders"]
    assert not rep["other_gpu_users"], rep["other_gpu_users"]
    assert rep["summary"]["freed_mib"] == 4096
    assert not lab.alive(pid) and thawed(lab, vmid)


def test_an_fd_relay_is_caught_in_one_run(lab: Lab, vmid: int) -> None:
    """Each process of the chain forks a child that inherits the GPU fd and exits at once:
    no process lives long enough for a walk to read it. 5 runs on 5 relays: each is caught
    and stopped in one run, and nothing holds the GPU after it."""
    lab.create_ct(vmid, gpus=(0,))
    node = lab.nodes["nvidia0"]
    for i in range(5):
        w = lab.run_program(vmid, "relay", ["--hold", GPU])  # its ready line: it runs
        code, rep = run_json(lab, vmid)
        assert code == 0 and rep["verdict"] == "clean", (i, rep)
        assert rep["holders"] and all(h["outcome"] in ("terminated", "killed")
                                      for h in rep["holders"]), (i, rep["holders"])
        time.sleep(0.2)
        assert holding(lab, vmid, node) == [], i  # the device's file is released
        assert not [p for p in w.host_pids(lab) if lab.alive(p)], i
        assert thawed(lab, vmid)


def test_a_holder_that_forks_on_sigterm_is_gone_after_one_run(lab: Lab, vmid: int) -> None:
    """It answers every SIGTERM with two children holding the same fd: every round of
    SIGTERMs doubled it (residual, twice as many after each run). The round where the
    holders outnumber those signalled before is SIGKILLed frozen: one run ends them."""
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_program(vmid, "forkstorm", ["--hold", GPU])
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean", rep
    time.sleep(0.2)
    assert not [p for p in w.host_pids(lab) if lab.alive(p)], rep["holders"]
    assert len(rep["holders"]) <= 3, rep["holders"]  # the holder and its first two children
    assert thawed(lab, vmid)
    code, rep = run_json(lab, vmid)  # and nothing is left for a second run
    assert code == 0 and rep["verdict"] == "nothing-to-do", rep


def test_a_late_host_scan_still_stops_an_nvml_holder(lab: Lab, vmid: int) -> None:
    """Thousands of processes make the host scan miss its share of the deadline: NVML's
    process list is still used; the holder with 8 GiB, in the container by its own cgroup,
    is proven and stopped, and the verdict stays residual with the scan's problem."""
    lab.write_config(grace_seconds=0.1, deadline_seconds=1.5)
    lab.create_ct(vmid, gpus=(0, 1))
    crowd = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia1"], children=2999)
    big = lab.run_in_ct(vmid, "vllm", hold=[GPU], gpu_mib={0: 8192})
    (pid,) = big.host_pids(lab)
    code, rep = run_json(lab, vmid)
    assert code == 1 and rep["verdict"] == "residual", rep
    assert rep["sources"]["host"] == "did not finish", rep["sources"]
    assert any(e.startswith("host scan did not finish") for e in rep["errors"]), rep["errors"]
    (h,) = [h for h in rep["holders"] if h["host_pid"] == pid]
    assert h["outcome"] == "terminated" and h["gpu_memory_mib"] == {"0": 8192}, h
    assert not lab.alive(pid)
    assert sum(lab.alive(p) for p in crowd.host_pids(lab)) == 3000  # unread: never signalled
    assert thawed(lab, vmid)


def test_thawed_after_a_run_that_hits_its_deadline(lab: Lab, vmid: int) -> None:
    """A holder that cannot die (frozen by the v1 freezer: SIGKILL waits, as for a task stuck
    in a driver) keeps the run until its deadline, and never lets the v2 freeze settle: the
    run goes on after its small bound, says so, and leaves the container thawed."""
    lab.write_config(grace_seconds=0.3, deadline_seconds=2)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=[GPU], ignore_term=True)
    cg = lab.make_unkillable(w.host_pids(lab))
    try:
        code, rep = run_json(lab, vmid)
        assert code == 1 and rep["verdict"] == "residual", rep
        assert rep["holders"][0]["outcome"] == "survived"
        assert "not every task stopped" in rep["sources"]["freeze"], rep["sources"]
        assert thawed(lab, vmid)
    finally:
        lab.thaw(cg)


def _start(lab: Lab, vmid: int) -> subprocess.Popen[str]:
    exe = Path(sys.executable).parent / "pveclean"
    return subprocess.Popen([str(exe), "ct", str(vmid), "--json"], env=lab.env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _stop_while_frozen(lab: Lab, vmid: int, run: subprocess.Popen[str]) -> bool:
    """SIGSTOP the run at a moment it holds the container frozen (True), or False if the
    run ended first."""
    freeze = lab.cgroup(vmid) / "cgroup.freeze"
    while run.poll() is None:
        if freeze.read_text().strip() == "1":
            os.kill(run.pid, signal.SIGSTOP)
            if freeze.read_text().strip() == "1":
                return True
            os.kill(run.pid, signal.SIGCONT)
    return False


def test_a_run_killed_while_it_holds_the_freeze_never_leaves_the_container_frozen(
        lab: Lab, vmid: int) -> None:
    """pveclean SIGKILLed while the container is frozen: its guard thaws at once. The whole
    process group SIGKILLed (the guard too): the container stays frozen until the next run,
    which thaws it first, says so, and cleans as usual."""
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=[], children=300)  # a scan of 300 to freeze for
    for group in (False, True):
        w = lab.run_in_ct(vmid, "python3", hold=[GPU])
        for _ in range(20):
            run = _start(lab, vmid)
            if _stop_while_frozen(lab, vmid, run):
                break
            run.wait()
        else:
            raise AssertionError("never caught the run while it held the freeze")
        if group:
            os.killpg(run.pid, signal.SIGKILL)
        else:
            os.kill(run.pid, signal.SIGKILL)
        run.wait()
        if not group:
            assert wait_for(lambda: thawed(lab, vmid), 2), "the guard did not thaw"
            continue
        time.sleep(0.3)
        assert not thawed(lab, vmid)  # nobody left to thaw it
        code, rep = run_json(lab, vmid)
        assert thawed(lab, vmid)
        assert any("did not end its run; thawed now" in x for x in rep["warnings"]), rep
        assert rep["verdict"] == "clean" and code == 0, rep
        assert not [p for p in w.host_pids(lab) if lab.alive(p)]


def test_what_a_freeze_costs(lab: Lab, vmid: int) -> None:
    """A cleanup freezes a running container while it reads the tree: how long, for a
    container of N processes (printed: docs/security.md quotes these)."""
    lab.write_config(deadline_seconds=30)
    lab.create_ct(vmid, gpus=(0,))
    have = 1
    for n in (10, 100, 1000):
        lab.run_in_ct(vmid, "python3", hold=[], children=n - have - 1)
        have = n
        code, rep = run_json(lab, vmid)  # nothing holds the GPU: one freeze, for the scan
        assert code == 0 and rep["verdict"] == "nothing-to-do", rep
        freeze = rep["sources"]["freeze"]
        assert freeze.startswith("frozen 1 time(s)"), freeze
        print(f"\n{len(lab.tree_pids(vmid))} processes: {freeze}")
        assert thawed(lab, vmid)
    code, rep = run_json(lab, vmid, "--dry-run")  # a dry run changes nothing: no freeze
    assert rep["sources"]["freeze"].startswith("not used: a dry run changes nothing"), rep
