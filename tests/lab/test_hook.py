"""The guest hookscript, driven through the pct stand-in exactly as Proxmox runs hooks."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pveclean.core.config import Config, parse
from pveclean.proxmox import chain
from pveclean.proxmox.hookscript import stamp
from tests.harness import pct as pct_harness
from tests.harness.lxclab import REPO, Lab
from tests.harness.scenarios import NCCL_MIB, TP_MIB, VLLM_MIB, seeds
from tests.helpers import hook, reports, wait_for


def leftover_after_stop(lab: Lab, vmid: int, **holder: object) -> list[int]:
    """Stop the container, then leave a GPU holder of 'its earlier run' in its cgroup tree
    (own PID namespace, as a process that escaped the container's end would be)."""
    lab.pct("stop", str(vmid))
    # LXC tears the container down (post-stop hook, cgroups) after `pct stop` returns; a
    # leftover made before its monitor is gone could be swept away with it
    monitor = lab.cgroup(vmid).parent.parent / "lxc.monitor" / str(vmid) / "cgroup.procs"
    wait_for(lambda: bool(reports(lab, vmid, "post-stop")), 5)
    wait_for(lambda: not monitor.exists() or not monitor.read_text().strip(), 5)
    w = lab.run_on_host("python3", hold=[str(lab.nodes["nvidia0"])], pidns=True,
                        cgroup=lab.cgroup(vmid) / "ns", **holder)  # type: ignore[arg-type]
    return [p for p in w.host_pids(lab) if w.popen is None or p != w.popen.pid]


def test_pct_stop_cleans_seeds_and_post_stop_reports_clean(lab: Lab, vmid: int) -> None:
    s = seeds(lab, vmid, host=True)
    lab.install_hook(vmid)
    conf_before = (lab.root / "etc/pve/lxc" / f"{vmid}.conf").read_text()
    pids = [p for w in s.targets() for p in w.host_pids(lab)]
    res = lab.pct("stop", str(vmid))
    said = [ln for ln in res.stdout.splitlines() if ln.startswith("pveclean:")]
    assert said[0].startswith(f"pveclean: CT {vmid} pre-stop: stopping 6 GPU holder(s)")
    line = said[-1]
    freed = 4 * TP_MIB + VLLM_MIB + NCCL_MIB
    assert line.startswith(f"pveclean: CT {vmid} pre-stop: stopped 6 GPU holders "
                           f"({freed} MiB freed) in ")
    assert "; report " + str(lab.report_dir) in line
    assert not any(lab.alive(p) for p in pids)
    assert s.host is not None and all(lab.alive(p) for p in s.host.host_pids(lab))
    (pre,) = reports(lab, vmid, "pre-stop")
    assert pre["verdict"] == "clean" and pre["summary"]["stopped"] == 6
    assert wait_for(lambda: reports(lab, vmid, "post-stop"))
    (post,) = reports(lab, vmid, "post-stop")
    assert post["verdict"] == "nothing-to-do" and post["leaks"] == []
    assert post["pre_stop_report"]["freed_mib"] == freed
    # the hook never touched the container's config (Proxmox holds its lock meanwhile)
    assert (lab.root / "etc/pve/lxc" / f"{vmid}.conf").read_text() == conf_before


def test_shutdown_runs_pre_stop_too(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 1000})
    pids = w.host_pids(lab)
    lab.install_hook(vmid)
    res = lab.pct("shutdown", str(vmid), "--timeout", "10")
    assert (f"pveclean: CT {vmid} pre-stop: clean shutdown (a vzshutdown task): 1 GPU "
            "holder(s) left to the guest") in res.stdout
    assert not any(lab.alive(p) for p in pids)  # the guest's init ended it


def test_leaked_memory_after_stop(lab: Lab, vmid: int) -> None:
    assert lab.nvml is not None
    lab.create_ct(vmid, gpus=(1,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia1"], gpu_mib={1: 3000})
    lab.install_hook(vmid)
    lab.nvml.leak(1, 2048)  # the driver keeps memory no process accounts for
    lab.pct("stop", str(vmid))
    assert wait_for(lambda: reports(lab, vmid, "post-stop"))
    (post,) = reports(lab, vmid, "post-stop")
    assert post["verdict"] == "leaked"
    (leak,) = post["leaks"]
    assert leak["index"] == 1 and leak["unaccounted_mib"] == 2048
    assert "pveclean reset 1" in leak["hint"]
    log = (lab.root / "log" / f"poststop-{vmid}.log").read_text()
    assert len([ln for ln in log.splitlines() if ln.startswith("pveclean:")]) == 1


def test_pre_start_cleans_leftovers_of_an_earlier_run(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    lab.install_hook(vmid)
    left = leftover_after_stop(lab, vmid, gpu_mib={0: 700})
    assert left
    res = lab.pct("start", str(vmid))
    assert f"pveclean: CT {vmid} pre-start: stopped" in res.stdout
    assert not any(lab.alive(p) for p in left)
    assert lab.pct("status", str(vmid)).stdout == "status: running\n"
    (pre,) = reports(lab, vmid, "pre-start")
    assert pre["verdict"] == "clean" and pre["container"]["running"] is False


def test_refuse_policy_aborts_start_with_unkillable_leftover(lab: Lab, vmid: int) -> None:
    lab.write_config(pre_start_policy="refuse", grace_seconds=0.3, deadline_seconds=2)
    lab.create_ct(vmid, gpus=(0,))
    lab.install_hook(vmid)
    freezer = lab.make_unkillable(leftover_after_stop(lab, vmid))
    res = lab.pct("start", str(vmid), check=False)
    assert res.returncode != 0
    assert f"pveclean: CT {vmid} pre-start: refusing to start" in res.stdout
    assert f"hookscript error for {vmid} on pre-start" in res.stderr
    assert lab.pct("status", str(vmid)).stdout == "status: stopped\n"
    lab.thaw(freezer)


def test_warn_policy_lets_the_start_go_on(lab: Lab, vmid: int) -> None:
    lab.write_config(grace_seconds=0.3, deadline_seconds=2)
    lab.create_ct(vmid, gpus=(0,))
    lab.install_hook(vmid)
    freezer = lab.make_unkillable(leftover_after_stop(lab, vmid))
    res = lab.pct("start", str(vmid), check=False)
    lab.thaw(freezer)
    assert "WARNING" in res.stdout and "starting anyway" in res.stdout
    # the hook did not abort the start; LXC itself then refuses a cgroup that is still busy,
    # which is why `pre_start_policy: refuse` exists (a clear message instead of LXC's)
    assert "hookscript error" not in res.stderr


def test_frozen_container_cannot_hang_pre_stop(lab: Lab, vmid: int) -> None:
    lab.write_config(grace_seconds=1, deadline_seconds=4)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    pids = w.host_pids(lab)
    lab.install_hook(vmid)
    lab.freeze(lab.cgroup(vmid) / "ns")  # pct exec into it now hangs
    t0 = time.monotonic()
    res = hook(lab, vmid, "pre-stop")
    elapsed = time.monotonic() - t0
    lab.freeze(lab.cgroup(vmid) / "ns", False)
    assert res.returncode == 0
    assert elapsed < 4 + 1.5, elapsed
    (pre,) = reports(lab, vmid, "pre-stop")
    assert pre["sources"]["probe"].startswith("late: not finished when the run ended")
    assert pre["verdict"] == "clean"  # cgroup v2 lets SIGKILL through a freeze
    assert not any(lab.alive(p) for p in pids)


def test_hung_nvml_cannot_hang_a_phase(lab: Lab, vmid: int) -> None:
    assert lab.nvml is not None
    lab.write_config(grace_seconds=1, deadline_seconds=3)
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    lab.install_hook(vmid)
    lab.nvml.hang(30)
    for phase in ("pre-stop", "post-stop", "pre-start"):
        t0 = time.monotonic()
        res = hook(lab, vmid, phase)
        assert res.returncode == 0
        assert time.monotonic() - t0 < 3 + 1.5, phase


def test_unknown_phase_and_bad_vmid(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    lab.install_hook(vmid)
    res = hook(lab, vmid, "pre-migrate")
    assert res.returncode == 0 and "unknown hook phase 'pre-migrate'" in res.stdout
    res = hook(lab, "abc", "pre-start")  # a usage error is no refusal: a warning, exit 0
    assert res.returncode == 0 and "invalid VMID" in res.stderr  # the task log has both
    assert "pveclean-hook: WARNING: " in res.stdout


def test_disabled_phase_does_nothing(lab: Lab, vmid: int) -> None:
    lab.write_config(phases={"pre-stop": False})
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    lab.install_hook(vmid)
    res = hook(lab, vmid, "pre-stop")
    assert res.returncode == 0 and res.stdout == ""
    assert all(lab.alive(p) for p in w.host_pids(lab))
    assert reports(lab, vmid, "pre-stop") == []


def test_post_start_is_silent_and_writes_nothing(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    lab.install_hook(vmid)
    res = hook(lab, vmid, "post-start")
    assert res.returncode == 0 and res.stdout == ""
    assert list(lab.report_dir.glob(f"{vmid}-*")) == []


def test_pre_start_with_nothing_left_never_touches_nvml(lab: Lab, vmid: int) -> None:
    """A start must not pay NVML's init (seconds without nvidia-persistenced) for nothing."""
    assert lab.nvml is not None
    lab.create_ct(vmid, gpus=(0,), start=False)
    lab.install_hook(vmid)
    lab.nvml.hang(20)
    t0 = time.monotonic()
    res = hook(lab, vmid, "pre-start")
    assert res.returncode == 0 and res.stdout == ""
    assert time.monotonic() - t0 < 2


def test_busy_container_lock_is_said_in_the_task_log(lab: Lab, vmid: int) -> None:
    from pveclean.host.lock import container_lock

    lab.write_config(lock_wait_seconds=0.3)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    lab.install_hook(vmid)
    with container_lock(str(lab.root / "state"), vmid, 1, "pveclean ct (manual)"):
        res = hook(lab, vmid, "pre-stop")  # another process: it waits for our flock
    assert res.returncode == 0
    assert f"pveclean: WARNING: CT {vmid} pre-stop: skipped, another pveclean run holds" in \
        res.stdout and "pveclean ct (manual)" in res.stdout
    assert all(lab.alive(p) for p in w.host_pids(lab))


def test_chained_hookscript_runs_as_proxmox_would(lab: Lab, vmid: int) -> None:
    """No owner or mode check (PVE::GuestHelpers::check_hookscript has none: NFS with
    root_squash, CIFS): a chained script that worked before install --chain still works."""
    from pveclean.proxmox import chain

    lab.create_ct(vmid, gpus=(0,), start=False)
    lab.install_hook(vmid)
    other = lab.snippets / "other-hook"
    other.write_text("#!/bin/sh\necho other ran $2\n")
    other.chmod(0o777)
    cfg = Config(state_dir=str(lab.root / "state"))
    chain.write_record(cfg, vmid, "local:snippets/other-hook", str(other))
    res = lab.pct("start", str(vmid))
    assert "other ran pre-start" in res.stdout and "other ran post-start" in res.stdout


def test_interpreter_gone_the_container_starts(lab: Lab, vmid: int) -> None:
    """A Proxmox 8 -> 9 upgrade replaced the Python under pveclean's venv."""
    lab.create_ct(vmid, gpus=(0,), start=False)
    broken = lab.root / "broken-pveclean"
    broken.write_text("#!/nonexistent/venv/bin/python3\n")
    broken.chmod(0o755)
    (lab.snippets / "pveclean-hook").write_text(stamp(
        (REPO / "hookscripts/pveclean-hook").read_text(), str(broken), str(lab.config_path)))
    (lab.snippets / "pveclean-hook").chmod(0o755)
    lab.pct("set", str(vmid), "--hookscript", "local:snippets/pveclean-hook")
    res = lab.pct("start", str(vmid), check=False)
    assert res.returncode == 0, res.stderr
    assert "pveclean-hook: WARNING: " in res.stdout
    assert lab.pct("status", str(vmid)).stdout == "status: running\n"


def test_broken_config_the_container_starts(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    lab.install_hook(vmid)
    lab.config_path.write_text("grace_seconds: [oops\n")
    res = lab.pct("start", str(vmid), check=False)
    assert res.returncode == 0, res.stderr
    assert f"pveclean: CT {vmid} pre-start: config error, nothing done" in res.stdout
    assert lab.pct("status", str(vmid)).stdout == "status: running\n"


def test_failing_chained_script_is_a_refusal(lab: Lab, vmid: int) -> None:
    """Proxmox would have aborted the start on the chained script's failure: so does pveclean."""
    lab.create_ct(vmid, gpus=(0,), start=False)
    lab.install_hook(vmid)
    script = lab.snippets / "site-hook"
    script.write_text('#!/bin/sh\n[ "$2" = pre-start ] && { echo "site: no"; exit 3; }\nexit 0\n')
    script.chmod(0o755)
    cfg = parse(lab.config_path.read_text())
    chain.write_record(cfg, vmid, "local:snippets/site-hook", str(script))
    res = lab.pct("start", str(vmid), check=False)
    assert res.returncode != 0
    assert "site: no" in res.stdout
    assert f"pveclean: CT {vmid} pre-start: refusing to start: the chained hookscript exited 3" \
        in res.stdout
    assert lab.pct("status", str(vmid)).stdout == "status: stopped\n"
    os.unlink(script)


def test_a_phase_that_waits_says_so_first(lab: Lab, vmid: int) -> None:
    """The task log is not silent while holders get their grace: the phase says what it
    stops and for how long before it waits, then the outcome."""
    lab.write_config(grace_seconds=2)
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], ignore_term=True, gpu_mib={0: 1000})
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 500})
    lab.install_hook(vmid)
    argv = [pct_harness.task_title(str(vmid), "vzstop"), "-c", pct_harness.WORKER,
            str(lab.snippets / "pveclean-hook"), str(vmid), "pre-stop"]  # as helpers.hook
    proc = subprocess.Popen(argv, executable=sys.executable, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            env={"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"})
    assert proc.stdout is not None
    t0 = time.monotonic()
    said = [(time.monotonic() - t0, line.rstrip("\n")) for line in proc.stdout]
    assert proc.wait(30) == 0
    ends = time.monotonic() - t0
    lines = [ln for _t, ln in said if ln.startswith("pveclean:")]
    assert lines[0] == (f"pveclean: CT {vmid} pre-stop: stopping 2 GPU holder(s) of CT "
                        f"{vmid}, grace 2 s ..."), said
    assert ends - said[0][0] >= 1.5, said  # said before the grace, not at the end
    assert lines[-1].startswith(f"pveclean: CT {vmid} pre-stop: stopped 2 GPU holders"), said


def test_a_pre_stop_with_nothing_to_do_writes_no_report_unless_asked(lab: Lab,
                                                                     vmid: int) -> None:
    """A no-op stop wrote two reports (keep_reports: 100 was about 50 stops): the post-stop's
    is the stop's record; `report_nothing_to_do: true` brings the pre-stop's back."""
    lab.create_ct(vmid, gpus=(0,))
    lab.install_hook(vmid)
    res = hook(lab, vmid, "pre-stop")
    assert res.returncode == 0 and f"CT {vmid} pre-stop: no GPU holders (" in res.stdout
    assert "no report (report_nothing_to_do: false)" in res.stdout
    assert reports(lab, vmid, "pre-stop") == []
    lab.write_config(report_nothing_to_do=True)
    res = hook(lab, vmid, "pre-stop")
    (pre,) = reports(lab, vmid, "pre-stop")
    assert pre["verdict"] == "nothing-to-do" and "; report " in res.stdout
