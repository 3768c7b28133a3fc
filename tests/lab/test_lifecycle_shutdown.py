"""A clean shutdown stays the guest's: `pct shutdown` (a vzshutdown task: `lxc-stop --nokill
--timeout T`) gets no pveclean kill in pre-stop; pre-stop records the holders, post-stop
cleans and verifies what the guest leaves. `pct stop` (vzstop, a kill) still gets the grace."""

from __future__ import annotations

from tests.harness.lxclab import Lab
from tests.helpers import reports, wait_for


def test_a_shutdown_that_times_out_leaves_the_guest_as_it_was(lab: Lab, vmid: int) -> None:
    """The guest's init ignores the halt signal: `pct shutdown --timeout 2` fails with
    "container did not stop", and its GPU holder lives on, the container running."""
    lab.create_ct(vmid, gpus=(0,), extra=[("lxc.signal.halt", "SIGWINCH")])
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 4096})
    lab.install_hook(vmid)
    res = lab.pct("shutdown", str(vmid), "--timeout", "2", check=False)
    assert res.returncode != 0 and "container did not stop" in res.stderr
    assert all(lab.alive(p) for p in w.host_pids(lab))
    assert lab.init_pid(vmid) is not None
    (pre,) = reports(lab, vmid, "pre-stop")
    assert pre["verdict"] == "deferred"
    assert [h["host_pid"] for h in pre["holders"]] == w.host_pids(lab)
    assert all(h["signals"] == [] for h in pre["holders"])
    assert any("clean shutdown (a vzshutdown task)" in x for x in pre["warnings"])
    assert "left to the guest" in res.stdout
    assert reports(lab, vmid, "post-stop") == []


def test_a_completed_shutdown_is_cleaned_and_verified_in_post_stop(lab: Lab,
                                                                   vmid: int) -> None:
    """The guest shuts down (its init ends its own processes); a holder in the container's
    cgroup but outside the guest's PID namespace outlives it, as an escaped worker does:
    post-stop stops it, verifies and reports."""
    lab.create_ct(vmid, gpus=(0,))
    inside = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 4096},
                           ignore_term=True)
    escaped = lab.run_on_host("python3", hold=[str(lab.nodes["nvidia0"])], pidns=True,
                              cgroup=lab.cgroup(vmid) / "ns", gpu_mib={0: 2048})
    stuck = [p for p in escaped.host_pids(lab) if escaped.popen is None
             or p != escaped.popen.pid]
    guest = inside.host_pids(lab)
    lab.install_hook(vmid)
    res = lab.pct("shutdown", str(vmid), "--timeout", "10")
    assert res.returncode == 0, res.stderr
    (pre,) = reports(lab, vmid, "pre-stop")
    assert pre["verdict"] == "deferred"
    assert {h["host_pid"] for h in pre["holders"]} == set(guest) | set(stuck)
    (post,) = reports(lab, vmid, "post-stop")
    assert post["verdict"] == "clean", post
    assert {h["host_pid"] for h in post["holders"]} == set(stuck)
    assert not any(lab.alive(p) for p in [*guest, *stuck])


def test_pct_stop_still_gives_the_holders_their_grace_in_pre_stop(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 1000})
    lab.install_hook(vmid)
    out = lab.pct("stop", str(vmid)).stdout
    assert f"pveclean: CT {vmid} pre-stop: stopped 1 GPU holders (1000 MiB freed)" in out
    (pre,) = reports(lab, vmid, "pre-stop")
    assert pre["verdict"] == "clean"
    assert not any(lab.alive(p) for p in w.host_pids(lab))


def test_a_task_aborted_with_sigterm_keeps_the_pre_stop_report(lab: Lab, vmid: int) -> None:
    """`pct stop --overrule-shutdown` sends SIGTERM to the shutdown task's process group
    (kill_process_group): the pre-stop under way ends by its deadline with its report."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.harness import pct as pct_harness

    lab.write_config(grace_seconds=1, deadline_seconds=4)
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    lab.install_hook(vmid)
    lab.freeze(lab.cgroup(vmid) / "ns")  # its pct exec probe hangs: the run lasts its deadline
    try:
        argv = [pct_harness.task_title(str(vmid), "vzstop"), "-c", pct_harness.WORKER,
                str(lab.snippets / "pveclean-hook"), str(vmid), "pre-stop"]
        task = subprocess.Popen(argv, executable=sys.executable, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                env={"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"})
        time.sleep(1.0)
        os.killpg(task.pid, signal.SIGTERM)
        task.wait(10)
        assert wait_for(lambda: bool(reports(lab, vmid, "pre-stop")), 8)
    finally:
        lab.freeze(lab.cgroup(vmid) / "ns", False)
    (pre,) = reports(lab, vmid, "pre-stop")
    assert pre["verdict"] in ("clean", "residual")
