"""The in-container probe on lab containers: floods are cut, invented PIDs ignored, a missing `ls`
said, and the host's environment never enters the container."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.harness.lxclab import Lab, Workload
from tests.helpers import run_json

# ---- the probe is bounded -----------------------------------------------------------------

def replace_sh(lab: Lab, vmid: int, body: str) -> None:
    """The container's root replaces the /bin/sh that `pct exec` runs the probe with."""
    sh = lab.rootfs(vmid) / "bin/sh"
    sh.unlink()
    sh.write_text("#!/bin/busybox sh\n" + body + "\n")
    sh.chmod(0o755)


def keep_the_run_going(lab: Lab, vmid: int) -> Workload:
    """The probe never gates a run (issue 16): a holder that ignores SIGTERM keeps the run
    going through a 1.5 s grace, long enough for the probe's answer to arrive and be judged."""
    lab.write_config(grace_seconds=1.5)
    return lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidia0"], ignore_term=True)


def test_probe_flood_is_cut_and_the_run_goes_on(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    (pid,) = keep_the_run_going(lab, vmid).host_pids(lab)
    replace_sh(lab, vmid, "/bin/busybox yes 'fd 1 /dev/nvidia0' | "
                          "/bin/busybox head -c 67108864")
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    assert rep["verdict"] == "clean" and not lab.alive(pid)
    # The probe gates nothing (issue 16): read while the run goes on, it is cut at its cap,
    # or still unfinished when the run ends (then killed unread). Never more than the cap kept.
    probe_src = rep["sources"]["probe"]
    assert ("over its limit" in probe_src and "1048576" in probe_src) or probe_src.startswith(
        "late: "), probe_src
    (path,) = sorted(lab.report_dir.glob(f"{vmid}-*.yaml"))
    assert path.stat().st_size < 64 << 10


def test_probe_that_invents_thousands_of_pids_is_ignored(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    (pid,) = keep_the_run_going(lab, vmid).host_pids(lab)
    replace_sh(lab, vmid, "i=2; while [ $i -lt 5000 ]; do echo \"fd $i /dev/nvidia0\"; "
                          "i=$((i+1)); done; echo end")
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    assert "more than 1024 processes" in rep["sources"]["probe"]
    assert [h["host_pid"] for h in rep["holders"]] == [pid]
    (path,) = sorted(lab.report_dir.glob(f"{vmid}-*.yaml"))
    assert path.stat().st_size < 64 << 10


def _libs(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return [p for ln in out.splitlines() for p in ln.split() if p.startswith("/")]


def test_probe_without_ls_says_it_could_not_look(lab: Lab, vmid: int) -> None:
    """A container whose pct exec PATH has no `ls` (NixOS): the probe must not say ok."""
    lab.create_ct(vmid, gpus=(0,))
    keep_the_run_going(lab, vmid)
    dash = shutil.which("dash")
    if dash is None:
        pytest.skip("no dash on this host to stand in for a shell without busybox applets")
    root = lab.rootfs(vmid)
    for lib in _libs(dash):  # dash with its libc: a plain shell, as NixOS has
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)
    shutil.copy2(dash, root / "bin/dash")
    (root / "bin/sh").unlink()
    (root / "bin/sh").symlink_to("dash")
    (root / "bin/ls").unlink()  # ls lives elsewhere on NixOS, not on pct exec's PATH
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    assert rep["sources"]["probe"].startswith("failed") and "'ls'" in rep["sources"]["probe"]




def test_host_environment_does_not_enter_the_container(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    keep_the_run_going(lab, vmid)
    replace_sh(lab, vmid, "/bin/busybox env > /tmp/env-seen; exec /bin/busybox sh \"$@\"")
    env = {**lab.env(), "PVECLEAN_CANARY": "s3cr3t-host-token"}
    code, rep = run_json(lab, vmid, env=env)
    assert code == 0, rep
    assert rep["sources"]["probe"] == "ok"
    seen = (lab.rootfs(vmid) / "tmp/env-seen").read_text()
    assert "PATH=" in seen  # the probe did run, with the fixed environment
    assert "s3cr3t-host-token" not in seen and "PVECLEAN_CONFIG" not in seen
