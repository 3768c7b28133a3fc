"""Unknown is not innocent (issue 26), on lab containers: a holder whose fd's mount is in no
mountinfo (a bind mount detached by `umount -l`, a mount point holding "\\f", a mountinfo past
4 MiB), a GPU node registered with io_uring as a fixed file, an O_PATH fd that never opened
the device, and a tenant that bloats its fd tables and its maps. Each was "not a GPU" (or a
holder, for O_PATH, or a run past its deadline and its memory) before. Last, what happens to
an fd in flight in an SCM_RIGHTS message (not caught by the scan; caught by NVML)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.bench.discovery import pveclean_exe
from tests.bench.measure import HOOK_ENV, Spawned, spawn_like_proxmox
from tests.harness.lxclab import Lab
from tests.helpers import run_json, start_in_ct

DEADLINE = 6.0
MAX_RSS_MB = 100.0


def fd_on(pid: int, wanted: str) -> str:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted:
                return fd
        except OSError:
            continue
    raise AssertionError(f"PID {pid} has no fd on {wanted!r}")


def mount_ids(pid: int) -> set[int]:
    data = Path(f"/proc/{pid}/mountinfo").read_bytes()
    return {int(line.split(b" ", 1)[0]) for line in data.split(b"\n") if line}


def mnt_id(pid: int, fd: str) -> int:
    info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
    return int(next(ln for ln in info.split("\n") if ln.startswith("mnt_id:")).split()[1])


def cleaned(lab: Lab, vmid: int, pid: int) -> dict[str, Any]:
    """A full `pveclean ct`: the holder is found by the host view, stopped, verdict clean."""
    code, rep = run_json(lab, vmid)
    assert code == 0, rep
    assert rep["verdict"] == "clean", rep
    (h,) = [h for h in rep["holders"] if h["host_pid"] == pid]
    assert "host" in h["sources"], h
    assert not lab.alive(pid)
    return dict(h)


def test_a_holder_through_a_detached_bind_mount_is_found(lab: Lab, vmid: int) -> None:
    """The fd was opened through a bind mount, then the mount was detached (`umount -l`):
    its mnt_id is in no mountinfo. It is judged by its device number."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/opt/g"],
                    pre="touch /opt/g && mount --bind /dev/nvidia0 /opt/g && ")
    (pid,) = w.host_pids(lab)
    fd = fd_on(pid, "/opt/g")
    lab.pct("exec", str(vmid), "--", "umount", "-l", "/opt/g")
    assert mnt_id(pid, fd) not in mount_ids(pid)  # the hiding place
    h = cleaned(lab, vmid, pid)
    assert h["devices"], h


def test_a_holder_through_a_mount_point_holding_a_form_feed_is_found(lab: Lab,
                                                                     vmid: int) -> None:
    """mountinfo does not escape "\\f": a parser splitting lines on it dropped the mount."""
    lab.create_ct(vmid, gpus=(0,))
    g = "/opt/a\fb/g"
    w = start_in_ct(lab, vmid, "python3", ["--hold", g],
                    pre="d=\"/opt/a$(printf '\\f')b\" && mkdir -p \"$d\" && touch \"$d/g\" && "
                        "mount --bind /dev/nvidia0 \"$d/g\" && ")
    (pid,) = w.host_pids(lab)
    fd = fd_on(pid, g)
    assert b"/opt/a\fb/g" in Path(f"/proc/{pid}/mountinfo").read_bytes()
    assert mnt_id(pid, fd) in mount_ids(pid)
    h = cleaned(lab, vmid, pid)
    assert h["devices"][0].startswith(g), h


def test_a_holder_past_a_4_mib_mountinfo_is_found(lab: Lab, vmid: int) -> None:
    """600 bind mounts with long names put the GPU's bind mount past 4 MiB of mountinfo."""
    lab.create_ct(vmid, gpus=(0,))
    lab.pct("exec", str(vmid), "--", "/opt/lab/bin/mount_flood", "--count", "600")
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/opt/g"],
                    pre="touch /opt/g && mount --bind /dev/nvidia0 /opt/g && ")
    (pid,) = w.host_pids(lab)
    text = Path(f"/proc/{pid}/mountinfo").read_bytes()
    assert text.find(b" /opt/g ") > 4 << 20, len(text)
    cleaned(lab, vmid, pid)


def test_a_gpu_node_held_as_an_io_uring_fixed_file_is_found(lab: Lab, vmid: int) -> None:
    """The node is registered with a ring (IORING_REGISTER_FILES) and its fd closed: it is in
    no fd table, only in the ring's fdinfo."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "uring_holder", ["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    targets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert "/dev/nvidia0" not in targets and "anon_inode:[io_uring]" in targets
    h = cleaned(lab, vmid, pid)
    assert any("io_uring fixed file" in d for d in h["devices"]), h


def test_an_o_path_fd_is_no_holder(lab: Lab, vmid: int) -> None:
    """O_PATH names the node without opening it: the device was never opened."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "opath_holder", ["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    fd_on(pid, "/dev/nvidia0")
    code, rep = run_json(lab, vmid, "--dry-run")
    assert code == 0, rep
    assert pid not in [h["host_pid"] for h in rep["holders"]], rep
    assert lab.alive(pid)


def measured(lab: Lab, *args: str) -> Spawned:
    """A run as Proxmox makes it (cleared environment; PYTHONPATH kept: a checkout under
    test), with its wall time and the peak RSS of its process tree."""
    env = {**HOOK_ENV, "PVECLEAN_CONFIG": str(lab.config_path)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return spawn_like_proxmox([*pveclean_exe(), *args], lab.root, env)


def test_fd_bloat_stays_within_deadline_and_memory_and_the_nvml_holder_is_stopped(
        lab: Lab, vmid: int) -> None:
    """40 processes with 20,000 fds each (as many as RLIMIT_NOFILE allows) and a process
    with 8 GiB in NVML elsewhere in the container: the scan finishes within the deadline
    (per-process fd caps), the NVML holder is stopped, the bloaters are named as not judged."""
    lab.write_config(deadline_seconds=DEADLINE, grace_seconds=1.0)
    lab.create_ct(vmid, gpus=(0,))
    bloat = start_in_ct(lab, vmid, "fd_bloat", ["--procs", "40", "--fds", "20000"])
    assert len(bloat.host_pids(lab)) == 40
    nvml = lab.run_in_ct(vmid, "python3", gpu_mib={0: 8192})
    (holder,) = nvml.host_pids(lab)
    run = measured(lab, "ct", str(vmid))
    rss_mb = run.max_rss_kib * 1024 / 1e6
    print(f"fd bloat: ct took {run.seconds:.2f} s, peak RSS {rss_mb:.1f} MB\n{run.output}")
    assert run.seconds <= DEADLINE + 1, run
    assert rss_mb <= MAX_RSS_MB, run
    assert not lab.alive(holder), run.output
    assert "not judged" in run.output, run.output
    assert all(lab.alive(p) for p in bloat.host_pids(lab))  # never proven holders


def test_maps_bloat_stays_within_deadline_and_memory(lab: Lab, vmid: int) -> None:
    """One process with 65,000 mappings of a file whose ~4,000-byte path is newlines: about
    1 GB of maps text. `ct --dry-run` and `gpus` read at most MAX_MAPS of it."""
    lab.write_config(deadline_seconds=DEADLINE)
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "maps_bloat", ["--maps", "65000", "--depth", "16"])
    (pid,) = w.host_pids(lab)
    holder = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    for args in (("ct", str(vmid), "--dry-run"), ("gpus",)):
        run = measured(lab, *args)
        rss_mb = run.max_rss_kib * 1024 / 1e6
        print(f"maps bloat: {' '.join(args)} took {run.seconds:.2f} s, peak RSS {rss_mb:.1f} MB")
        assert run.seconds <= DEADLINE + 1, (args, run)
        assert rss_mb <= MAX_RSS_MB, (args, rss_mb, run.output[-2000:])
        assert str(holder.host_pids(lab)[0]) in run.output, (args, run.output[-2000:])
    assert lab.alive(pid)


def test_an_fd_in_flight_is_seen_only_through_nvml(lab: Lab, vmid: int) -> None:
    """What happens (docs/security.md): a GPU node's only open file sits in an unread
    SCM_RIGHTS message, in no fd table. The scan does not see it; NVML does, once the
    process has GPU memory, and the run stops it."""
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "scm_inflight", ["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    targets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert "/dev/nvidia0" not in targets
    code, rep = run_json(lab, vmid, "--dry-run")
    assert code == 0 and pid not in [h["host_pid"] for h in rep["holders"]], rep  # the gap
    assert lab.nvml is not None
    lab.nvml.set_process(0, pid, 2048)
    code, rep = run_json(lab, vmid)
    assert code == 0 and rep["verdict"] == "clean", rep
    (h,) = [h for h in rep["holders"] if h["host_pid"] == pid]
    assert h["sources"] == ["nvml"], h
    assert not lab.alive(pid)
