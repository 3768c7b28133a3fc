"""The container is hostile (issue 12): each attack a tenant's root can mount, on a real lab
container. Every test here failed on the code before the fix."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pveclean.cleanup import clean
from pveclean.host import cgroupfs, devnodes, procfs
from pveclean.host.configfile import load
from tests.harness.lxclab import Lab, Workload


def run_json(lab: Lab, *args: str | int, env: dict[str, str] | None = None
             ) -> tuple[int, dict[str, Any]]:
    r = lab.pveclean("ct", *map(str, args), "--json", env=env)
    assert r.stdout.strip(), f"no JSON on stdout; stderr: {r.stderr}"
    return r.returncode, json.loads(r.stdout)


def start_in_ct(lab: Lab, vmid: int, name: str, flags: list[str], pre: str = "") -> Workload:
    """Like Lab.run_in_ct, with any holder flags and a shell prelude run before it."""
    tag, ready = lab.ct_holder(vmid, name, kind="x")
    argv = [f"/opt/lab/bin/{name}", *flags, "--ready", ready, "--exit-after", "900"]
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    lab.pct("exec", str(vmid), "--", "/bin/sh", "-c",
            f"{pre}{quoted} </dev/null >/dev/null 2>&1 &")
    w = Workload(vmid, tag, lab.rootfs(vmid) / ready.lstrip("/"))
    lab.workloads.append(w)
    lab._wait_ready(w, 1)
    return w


def host_pid_of_ready(lab: Lab, w: Workload) -> int:
    """The host PID of a holder by its ready line (its PID inside the container): a zombie
    leader's cmdline is empty, so Workload.host_pids cannot see it."""
    ct_pid = int(w.ready_file.read_text().split()[0])
    for pid in lab.tree_pids(w.vmid or 0):
        st = procfs.read_status(pid)
        if st and len(st.nspid) >= 2 and st.nspid[1] == ct_pid:
            return pid
    raise AssertionError(f"no host PID for container PID {ct_pid}")


def state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rfind(")") + 2]


# ---- no hiding ----------------------------------------------------------------------------

def test_holder_whose_main_thread_exited_is_found_and_stopped(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/dev/nvidia0", "--thread-holds"])
    pid = host_pid_of_ready(lab, w)
    assert state(pid) == "Z" and not os.listdir(f"/proc/{pid}/fd")  # the hiding place
    assert lab.nvml is not None
    lab.nvml.set_process(0, pid, 4000)
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    assert rep["verdict"] == "clean"
    (h,) = rep["holders"]
    assert h["host_pid"] == pid and "host" in h["sources"] and "nvml" in h["sources"]
    assert h["gpu_memory_mib"] == {0: 4000} or h["gpu_memory_mib"] == {"0": 4000}
    assert not lab.alive(pid) and not Path(f"/proc/{pid}").exists()


def test_gpu_node_bind_mounted_at_another_path_is_found(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/opt/g"],
                    pre="touch /opt/g && mount --bind /dev/nvidia0 /opt/g && ")
    (pid,) = w.host_pids(lab)
    assert os.readlink(f"/proc/{pid}/fd/3") == "/opt/g"
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    (h,) = rep["holders"]
    assert h["host_pid"] == pid and "host" in h["sources"]
    assert h["devices"][0].startswith("/opt/g (")
    assert not lab.alive(pid)


def test_files_on_fuse_and_network_mounts_are_never_stated(lab: Lab, vmid: int) -> None:
    """The fs type comes from fdinfo's mnt_id and mountinfo: only local file systems are
    stat()ed. A mount whose type is not on the list is skipped without a stat."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/opt/g"],
                    pre="touch /opt/g && mount --bind /dev/nvidia0 /opt/g && ")
    (pid,) = w.host_pids(lab)
    devices = devnodes.gpu_devices([str(lab.root / "dev/nvidia*")])
    assert devnodes.device_fds(pid, devices)
    real = devnodes.read_mounts
    try:  # the same fd, as if its mount were a FUSE file system: no stat, no match
        devnodes.read_mounts = lambda base: devnodes.Mounts(  # type: ignore[assignment]
            {k: "fuse.sshfs" for k in real(base).by_id}, {})
        stated: list[str] = []
        orig_stat, orig_os_stat = devnodes.stat_nosync, os.stat

        def spy(path: Any, *a: Any, **kw: Any) -> Any:
            stated.append(str(path))
            return orig_os_stat(path, *a, **kw)

        devnodes.stat_nosync = spy  # type: ignore[assignment]
        os.stat = spy  # type: ignore[assignment]
        try:
            assert devnodes.device_fds(pid, devices) == []
            assert devnodes.device_maps(pid, devices) == []
        finally:
            devnodes.stat_nosync, os.stat = orig_stat, orig_os_stat  # type: ignore[assignment]
        assert not [p for p in stated if f"/proc/{pid}/" in p]
    finally:
        devnodes.read_mounts = real  # type: ignore[assignment]


def _deep_cgroup(lab: Lab, vmid: int, depth: int) -> Path:
    d = lab.cgroup(vmid) / "ns"
    for _ in range(depth):
        d = d / "d"
        os.mkdir(d)  # no Path.mkdir(parents=True): it recurses
    return d


def _remove_deep(top: Path) -> None:
    """rmdir the chain deepest first (the lab's tear-down walks recursively: it must not
    meet it); a just-killed process keeps its cgroup busy until it is reaped."""
    dirs = []
    d = top
    while d.is_dir():
        dirs.append(d)
        d = d / "d"
    for d in reversed(dirs):
        end = time.monotonic() + 10
        while True:
            try:
                os.rmdir(d)
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.05)


def test_holder_1100_cgroups_deep_is_found_and_stopped(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    leaf = _deep_cgroup(lab, vmid, 1100)
    try:
        (leaf / "cgroup.procs").write_text(str(pid))
        code, rep = run_json(lab, vmid)
        assert code == 0, rep
        assert rep["verdict"] == "clean"
        assert [h["host_pid"] for h in rep["holders"]] == [pid]
        assert not lab.alive(pid)
    finally:
        if lab.alive(pid):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        _remove_deep(lab.cgroup(vmid) / "ns" / "d")


def test_cgroup_walk_past_its_cap_is_residual_with_the_reason(
        lab: Lab, vmid: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    leaf = _deep_cgroup(lab, vmid, 60)
    try:
        (leaf / "cgroup.procs").write_text(str(pid))
        monkeypatch.setattr(cgroupfs, "MAX_CGROUPS", 40)
        res = clean(vmid, load(lab.config_path), write_report=True)
        assert res.verdict == "residual"
        (h,) = res.report["holders"]
        assert "more than 40 cgroups" in h["protected"]
        assert lab.alive(pid)  # not seen, so not signalled: and the verdict says so
        assert res.path is not None and res.path.exists()
    finally:
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        _remove_deep(lab.cgroup(vmid) / "ns" / "d")


def test_a_name_the_container_chose_protects_nothing(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "nvidia-persistenced", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "nvidia-persiste"
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    (h,) = rep["holders"]
    assert "protected" not in h and h["outcome"] in ("terminated", "killed")
    assert not lab.alive(pid)


def test_host_process_keeps_its_protected_name(lab: Lab, vmid: int) -> None:
    """A host-namespace process in the tree is never signalled, and the report says which
    protected name it carries (names of host processes are the admin's)."""
    lab.create_ct(vmid, gpus=(0,))
    cg = lab.cgroup(vmid) / "ns" / "hostside"
    w = lab.run_on_host("nvidia-smi", hold=[str(lab.nodes["nvidia0"])], cgroup=cg)
    assert w.popen is not None
    pid = w.popen.pid  # (host_pids matches "ready-host-N" of other labs on this host too)
    _code, rep = run_json(lab, vmid)
    h = next(h for h in rep["holders"] if h["host_pid"] == pid)
    assert h["protected"] == "in the host's PID namespace, protected name 'nvidia-smi'"
    assert lab.alive(pid)


# ---- container text is data ---------------------------------------------------------------

EVIL_PATH = "/opt/a\x1b[2J\x1b[31m X\u202e"
EVIL_NAME = "\x1b]0;pwned\x07"


def test_escape_sequences_never_reach_the_terminal_and_reports_keep_them(
        lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", EVIL_PATH, "--name", EVIL_NAME],
                    pre=f"touch '{EVIL_PATH}' && mount --bind /dev/nvidia0 '{EVIL_PATH}' && ")
    (pid,) = w.host_pids(lab)
    r = lab.pveclean("ct", str(vmid), "--dry-run")
    assert r.returncode == 0, r.stderr
    for out in (r.stdout, r.stderr):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b]0;pwned\\x07" in r.stdout  # the name, shown escaped
    head, row = [ln for ln in r.stdout.splitlines() if ln.startswith("  ")][:2]
    # alignment counts what is displayed: the columns after the name line up
    assert head.index("DEVICES") == row.index("/opt/a\\x1b[2J")
    assert head.index("OUTCOME") == row.index("would-stop")
    shown = lab.pveclean("reports", "show", "latest", str(vmid))
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "\\x1b[2J" in shown.stdout
    # the report keeps the exact values
    (path,) = sorted(lab.report_dir.glob(f"{vmid}-*.yaml"))
    import yaml

    rep = yaml.safe_load(path.read_text())
    (h,) = rep["holders"]
    assert h["name"] == EVIL_NAME[:15]
    assert h["devices"][0].startswith(EVIL_PATH + " (")
    assert lab.alive(pid)


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


# ---- trust only root's files --------------------------------------------------------------

NOBODY = 65534


def test_loose_config_is_refused_whatever_it_says(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    lab.write_config(strict_permissions=False)
    os.chown(lab.config_path, NOBODY, NOBODY)
    lab.config_path.chmod(0o666)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "not owned by root" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    os.chown(lab.config_path, 0, 0)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "writable by group or others" in r.stderr, r.stderr
    assert lab.alive(pid)  # a config that is not root's controls nothing


def test_programs_the_config_makes_root_run_must_be_roots(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    pct = lab.root / "bin" / "pct"
    pct.chmod(0o777)  # anyone could put their code into what every hook runs as root
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "pct_command" in r.stderr, r.stderr
    pct.chmod(0o755)
    assert lab.nvml is not None
    lib_dir = lab.nvml.lib_path.parent
    lib_dir.chmod(0o777)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "nvml_library" in r.stderr and "directory" in r.stderr
    lib_dir.chmod(0o755)
    os.chown(lab.nvml.lib_path, NOBODY, 0)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 2 and "nvml_library" in r.stderr
    os.chown(lab.nvml.lib_path, 0, 0)
    assert lab.pveclean("ct", str(vmid)).returncode == 0


def test_config_in_a_directory_others_can_write_is_refused(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    shared = lab.root / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: anyone can create (or, after a reboot, recreate) it
    cfg = shared / "x.yaml"
    cfg.write_text(lab.config_path.read_text())
    cfg.chmod(0o644)
    r = lab.pveclean("ct", str(vmid), "--config", str(cfg))
    assert r.returncode == 2 and f"directory {shared} is writable" in r.stderr, r.stderr


def test_install_refuses_a_config_or_binary_others_can_change(tmp_path: Path) -> None:
    from pveclean.errors import PvecleanError
    from pveclean.proxmox.hookscript import trusted

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    cfg = shared / "x.yaml"
    cfg.write_text("grace_seconds: 1\n")
    cfg.chmod(0o644)
    exe = tmp_path / "pveclean"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    with pytest.raises(PvecleanError, match="writable by group or others") as e:
        trusted(str(exe), str(cfg))
    assert e.value.exit_code == 2
    exe.chmod(0o775)
    with pytest.raises(PvecleanError, match="pveclean command"):
        trusted(str(exe), None)
    exe.chmod(0o755)
    trusted(str(exe), None)


def test_metrics_never_follow_a_symlink_and_the_lock_is_roots(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    secret = lab.root / "secret"
    secret.write_text("pveclean_root_only_line 1\nshadow:$6$hash\n")
    secret.chmod(0o600)
    textdir = lab.root / "textfile"
    textdir.mkdir()
    prom = textdir / "pveclean.prom"
    prom.symlink_to(secret)
    lab.write_config(metrics_path=str(prom))
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 0, r.stderr
    assert secret.read_text().startswith("pveclean_root_only_line")  # untouched
    for f in textdir.iterdir():  # nothing of the root-only file reached a readable file
        if not f.is_symlink():
            assert "shadow" not in f.read_text() and "root_only" not in f.read_text()
    assert oct((textdir / "pveclean.prom.lock").stat().st_mode & 0o777) == oct(0o600)
    prom.unlink()  # without the symlink, metrics are written
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert f'vmid="{vmid}"' in prom.read_text() and not prom.is_symlink()


def test_metrics_lock_held_by_someone_else_does_not_hang_the_run(
        lab: Lab, vmid: int) -> None:
    import fcntl

    lab.create_ct(vmid, gpus=(0,), start=False)
    prom = lab.root / "textfile" / "pveclean.prom"
    lab.write_config(metrics_path=str(prom), deadline_seconds=10)
    prom.parent.mkdir()
    lock = open(f"{prom}.lock", "a")  # noqa: SIM115 -- held for the whole run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        t = time.monotonic()
        r = lab.pveclean("ct", str(vmid))
        assert time.monotonic() - t < 10
        assert r.returncode == 0, r.stderr
        assert "metrics not written" in r.stdout + r.stderr or not prom.exists()
    finally:
        lock.close()


def test_an_existing_report_dir_keeps_its_mode(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    shared = lab.root / "varlog"
    shared.mkdir()
    shared.chmod(0o755)
    lab.write_config(report_dir=str(shared))
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert oct(shared.stat().st_mode & 0o777) == oct(0o755)
    assert list(shared.glob(f"{vmid}-*.yaml"))
    fresh = lab.root / "fresh" / "reports"
    lab.write_config(report_dir=str(fresh))
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert oct(fresh.stat().st_mode & 0o777) == oct(0o700)
