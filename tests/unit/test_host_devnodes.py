"""host/devnodes through a fake /proc under tmp_path: NVIDIA's majors from /proc/devices, which
fds, io_uring fixed files and mappings lead to a GPU node (the real /dev/null stands in for
one), what is never stat()ed (a mount whose file system may ask a server), and what is said
when part of a process cannot be judged (never "not a GPU")."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

import pytest

from pveclean.core.records import DeviceHow, DeviceUse, GpuDevices
from pveclean.host import devnodes, statx, uring
from tests.helpers import DEVICES, NULL

HIT = f"({os.major(NULL)}:{os.minor(NULL)})"
MOUNTINFO = ("25 1 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw\n"
             "26 1 253:1 / / rw,relatime shared:1 - ext4 /dev/mapper/root rw\n"
             "27 26 0:42 / /mnt/far rw - 9p far rw,trans=tcp\n"
             "28 26 0:43 / /mnt/fuse rw - fuse.sshfs me@far:/ rw\n")
SAFE_MOUNTINFO = MOUNTINFO.replace(" 9p ", " nfs4 ")


def labels(held: Iterable[DeviceUse] | None) -> list[str] | None:
    """The report's labels of what a scan found held."""
    return None if held is None else [str(d) for d in held]


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path statx is asked about (it still answers)."""
    seen: list[str] = []
    real = statx.statx

    def spy(path: str | bytes, dir_fd: int = statx.AT_FDCWD, flags: int = 0
            ) -> statx.Stat | int:
        seen.append(path if isinstance(path, str) else path.decode())
        return real(path, dir_fd, flags)

    monkeypatch.setattr(statx, "statx", spy)
    return seen


def task(base: Path, fds: dict[str, tuple[str, int | None]], mountinfo: str = MOUNTINFO,
         flags: str = "02") -> Path:
    """A task directory: fd N -> (link target, its mount ID in fdinfo or None)."""
    (base / "fd").mkdir(parents=True)
    (base / "fdinfo").mkdir()
    (base / "ns").mkdir(exist_ok=True)
    (base / "mountinfo").write_text(mountinfo)
    os.symlink("mnt:[4026531840]", base / "ns" / "mnt")
    os.symlink("/", base / "root")
    for fd, (target, mnt_id) in fds.items():
        os.symlink(target, base / "fd" / fd)
        info = f"pos:\t0\nflags:\t{flags}\n" + (f"mnt_id:\t{mnt_id}\nino:\t7\n" if mnt_id else "")
        (base / "fdinfo" / fd).write_text(info)
    return base


def test_read_risky_names_the_mounts_never_stated(proc: Path) -> None:
    base = task(proc / "70", {})
    assert devnodes.read_risky(str(base)) == devnodes.Risky(frozenset({27}),
                                                            frozenset({(0, 42)}))
    (base / "mountinfo").write_text(MOUNTINFO.replace("9p", "nfs4"))
    assert devnodes.read_risky(str(base)) is devnodes.NO_RISK
    assert devnodes.read_risky(str(proc / "gone")) is devnodes.NO_RISK


def test_nvidia_majors_are_the_character_drivers_named_nvidia(proc: Path) -> None:
    proc.mkdir()
    (proc / "devices").write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n"
                                  "195 nvidia\n508 nvidia-uvm\n509 nvidia-caps\n"
                                  "510 mynvidia\n\nBlock devices:\n259 blkext\n"
                                  "300 nvidia-fake\n")
    assert devnodes.nvidia_majors() == frozenset({195, 508, 509})
    assert devnodes.nvidia_majors(str(proc / "none")) == frozenset()


def test_gpu_devices_take_only_character_devices(tmp_path: Path, proc: Path) -> None:
    (tmp_path / "nvidia9").write_text("a regular file named like a node")
    proc.mkdir()
    (proc / "devices").write_text("Character devices:\n195 nvidia\n")
    got = devnodes.gpu_devices(["/dev/null", str(tmp_path / "nvidia*"), "/nonexistent*"])
    assert got == GpuDevices({NULL: "/dev/null"}, frozenset({195}))


def test_statx_answers_mode_device_and_identity(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    for lib in (None, False):  # statx, then the os.stat fallback of a libc without it
        monkeypatch.setattr(statx, "_libc", lib)
        got = statx.statx("/dev/null")
        assert isinstance(got, statx.Stat) and stat.S_ISCHR(got.mode) and got.rdev == NULL
        st = os.stat("/dev/null")
        assert got.ino == st.st_ino and got.dev == (os.major(st.st_dev), os.minor(st.st_dev))
        assert statx.statx(str(tmp_path / "gone")) == 2  # ENOENT


def test_an_fd_on_a_gpu_node_is_found_once_and_nothing_else(proc: Path, tmp_path: Path,
                                                            stats: list[str]) -> None:
    (tmp_path / "data.bin").write_bytes(b"x")
    task(proc / "70", {"0": ("/dev/null", 25), "1": (str(tmp_path / "data.bin"), 26),
                       "2": ("socket:[123]", None), "3": ("/dev/null", 25)},
         mountinfo=SAFE_MOUNTINFO)
    got = devnodes.judge_fds(70, DEVICES)
    assert got is not None and labels(got.held) == [f"/dev/null {HIT}"] and got.unjudged == []
    # one raw statx each; a second look only at the GPU nodes (the dangling pipe link's failed
    # statx says why through its errno: it is not asked again)
    assert sorted(stats) == ["0", "3"]
    assert devnodes.judge_fds(70, GpuDevices({}, frozenset({195}))) == devnodes.Judged()


def test_an_fd_on_a_risky_mount_is_never_stated_an_unknown_one_is(proc: Path,
                                                                   stats: list[str]) -> None:
    """9p may ask its server even with DONT_SYNC: not stat()ed. A mount ID that no
    mountinfo line names (a detached bind mount) is judged by its device number."""
    task(proc / "70", {"0": ("/dev/null", 27), "1": ("/dev/null", 99)})
    assert labels(devnodes.device_fds(70, DEVICES)) == [f"/dev/null {HIT}"]
    assert stats == ["1"]


def test_fuse_and_nfs_fds_are_stated_with_dont_sync(proc: Path, stats: list[str]) -> None:
    task(proc / "70", {"0": ("/dev/null", 28)})
    assert labels(devnodes.device_fds(70, DEVICES)) == [f"/dev/null {HIT}"]
    assert stats == ["0"]


def test_an_o_path_fd_never_opened_the_device(proc: Path) -> None:
    task(proc / "70", {"0": ("/dev/null", 25)}, flags="012000000")  # O_PATH | O_CLOEXEC
    assert labels(devnodes.device_fds(70, DEVICES)) == []


def test_an_fd_whose_stat_fails_is_not_judged(proc: Path) -> None:
    task(proc / "70", {"0": ("/gone/model.bin", 26), "1": ("pipe:[9]", None)})
    got = devnodes.judge_fds(70, DEVICES)
    assert got is not None and labels(got.held) == []
    assert got.unjudged == ["fd 0 (/gone/model.bin): statx failed (No such file or "
                            "directory); not judged"]


def test_an_fd_table_past_the_cap_is_judged_by_what_was_read(
        proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devnodes, "MAX_FDS", 2)
    monkeypatch.setattr(devnodes, "EXTRA_FDS", 3)  # scan-wide, past each process's MAX_FDS
    for pid in (70, 71):
        task(proc / str(pid), {str(n): ("/dev/null", 25) for n in range(4)},
             mountinfo=SAFE_MOUNTINFO)
    cache = devnodes.ScanCache()
    got = devnodes.judge_fds(70, DEVICES, cache)
    null = DeviceUse("/dev/null", os.major(NULL), os.minor(NULL), DeviceHow.FD)
    assert got == devnodes.Judged([null], [], rdevs={NULL})  # 2 + 2 of 3 extra
    got = devnodes.judge_fds(71, DEVICES, cache)
    assert got is not None and labels(got.held) == [f"/dev/null {HIT}"]
    assert got.unjudged == ["more than 3 open fds: those past the first 3 not judged"]


def test_a_gone_process_has_no_fds_but_none(proc: Path) -> None:
    assert devnodes.device_fds(71, DEVICES) is None


def test_a_zombie_leader_holds_through_its_live_threads(proc: Path) -> None:
    (proc / "80" / "fd").mkdir(parents=True)  # the leader exited: its fd table is empty
    task(proc / "80" / "task" / "81", {"5": ("/dev/null", 25)})
    assert labels(devnodes.device_fds(80, DEVICES)) == [f"/dev/null {HIT}"]


RING = ("pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1073\nSqMask:\t0x3\nSQEs:\t0\nCQEs:\t0\n"
        "SqThread:\t-1\nSqThreadCpu:\t-1\nSqTotalTime:\t0\nSqWorkTime:\t0\nUserFiles:\t4\n"
        "    0: /dev/null\n    2: socket:[77]\n    3: /dev/null\nUserBufs:\t0\nPollList:\n")


def ring_task(proc: Path, pid: int, fdinfo: str) -> Path:
    base = task(proc / str(pid), {"4": (uring.URING, None)})
    (base / "fdinfo" / "4").write_text(fdinfo)
    return base


def test_a_gpu_node_registered_with_io_uring_is_held(proc: Path) -> None:
    ring_task(proc, 70, RING)
    assert labels(devnodes.device_fds(70, DEVICES)) == [
        f"/dev/null (io_uring fixed file, {HIT[1:]}"]


def test_a_ring_whose_files_the_kernel_did_not_list_is_not_judged(proc: Path) -> None:
    ring_task(proc, 70, "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1073\n")  # trylock lost
    got = devnodes.judge_fds(70, DEVICES)
    assert got is not None and labels(got.held) == []
    assert got.unjudged == ["io_uring fd 4: the kernel did not list its registered files "
                            "(the ring's lock was taken)"]


@pytest.mark.parametrize("path, why", [
    ("/gone/nvidia0", "cannot be looked up"),
    ("/dev/nvidia0 (deleted)", "was deleted"),
    ("/", "cannot be told from a directory"),  # what a detached bind mount shows
])
def test_a_registered_file_that_cannot_be_told_is_not_judged(proc: Path, path: str,
                                                             why: str) -> None:
    ring_task(proc, 70, RING.replace("    3: /dev/null", f"    3: {path}".replace(" (", "\\040(")))
    got = devnodes.judge_fds(70, DEVICES)
    assert got is not None and labels(got.held) == [f"/dev/null (io_uring fixed file, {HIT[1:]}"]
    assert len(got.unjudged) == 1 and why in got.unjudged[0], got.unjudged


MAPS = """\
7f0000000000-7f0000001000 rw-s 00000000 00:05 6                          /dev/nvidia0
7f0000001000-7f0000002000 rw-s 00000000 00:05 6                          /dev/nvidia0
7f0000002000-7f0000003000 rw-p 00000000 00:00 0
7f0000003000-7f0000004000 rw-p 00000000 00:00 0                          [heap]
7f0000004000-7f0000005000 r--p 00000000 fd:01 1234                       /usr/lib/libc.so.6
7f0000005000-7f0000006000 rw-s 00000000 00:2a 5                          /mnt/far/gpu
00400000-00401000 rw-s 00000000 00:05 7                                  /dev/nvidia\x0c1
"""


def maps_task(proc: Path, pid: int, tmp_path: Path) -> Path:
    base = task(proc / str(pid), {})
    (base / "maps").write_text(MAPS)
    (base / "map_files").mkdir()
    (tmp_path / "libc.so.6").write_bytes(b"\x7fELF")
    for first, target in (("7f0000000000", "/dev/null"), ("7f0000001000", "/dev/null"),
                          ("7f0000004000", str(tmp_path / "libc.so.6")),
                          ("7f0000005000", "/dev/null"), ("400000", "/dev/null")):
        last = f"{int(first, 16) + 0x1000:x}"
        os.symlink(target, base / "map_files" / f"{first}-{last}")
    return base


def test_a_mapped_gpu_node_is_found_once_and_a_risky_mount_never_stated(
        proc: Path, tmp_path: Path, stats: list[str]) -> None:
    maps_task(proc, 90, tmp_path)
    cache = devnodes.ScanCache()
    want = [f"/dev/nvidia0 (mmap {HIT[1:]}", f"/dev/nvidia\x0c1 (mmap {HIT[1:]}"]
    assert labels(devnodes.device_maps(90, DEVICES, cache)) == want
    assert sorted(os.path.basename(p) for p in stats) == [
        "400000-401000", "7f0000000000-7f0000001000",
        "7f0000004000-7f0000005000"]  # not the 9p one; map_files names have no leading 0s
    assert cache.rdevs[((253, 1), 1234)] == -1  # the library: no device, remembered
    stats.clear()
    assert labels(devnodes.device_maps(90, DEVICES, cache)) == want and stats == []  # all cached


def test_maps_past_the_cap_are_judged_by_what_was_read(proc: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    maps_task(proc, 90, tmp_path)
    monkeypatch.setattr(devnodes, "MAX_MAPS", 100)  # the first line and a half
    got = devnodes.judge_maps(90, DEVICES)
    assert labels(got.held) == [f"/dev/nvidia0 (mmap {HIT[1:]}"]
    assert got.unjudged == ["maps longer than 0 MiB: the mappings past it not judged"]


def test_maps_of_a_gone_or_empty_process_hold_nothing(proc: Path) -> None:
    assert labels(devnodes.device_maps(91, DEVICES)) == []
    (proc / "92").mkdir(parents=True)
    (proc / "92" / "maps").write_text("")
    assert labels(devnodes.device_maps(92, DEVICES)) == []


def test_maps_of_a_zombie_leader_are_read_from_a_thread(proc: Path, tmp_path: Path) -> None:
    (proc / "93").mkdir(parents=True)
    (proc / "93" / "maps").write_text("")
    maps_task(proc / "93" / "task", 94, tmp_path)
    assert str(devnodes.device_maps(93, DEVICES)[0]) == f"/dev/nvidia0 (mmap {HIT[1:]}"


def test_nvidia_majors_from_proc_devices(tmp_path: Path) -> None:
    f = tmp_path / "devices"
    f.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n"
                 "508 nvidia-uvm\n509 nvidia-caps\n10 misc\n\nBlock devices:\n 259 nvidia-x\n")
    assert devnodes.nvidia_majors(str(f)) == frozenset({195, 508, 509})


def test_still_holds_stops_at_the_first_node_and_keeps_what_it_cannot_rule_out(
        proc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stats: list[str]) -> None:
    (tmp_path / "data.bin").write_bytes(b"x")
    task(proc / "70", {"0": ("/dev/null", 25), "1": ("/dev/null", 25)}, mountinfo=SAFE_MOUNTINFO)
    assert devnodes.still_holds(70, DEVICES) and len(stats) == 1  # the first node is enough
    task(proc / "71", {"0": (str(tmp_path / "data.bin"), 26)}, mountinfo=SAFE_MOUNTINFO)
    assert not devnodes.still_holds(71, DEVICES)
    assert not devnodes.still_holds(72, DEVICES)  # gone
    monkeypatch.setattr(devnodes, "MAX_FDS", 1)
    task(proc / "73", {str(n): (str(tmp_path / "data.bin"), 26) for n in range(3)},
         mountinfo=SAFE_MOUNTINFO)
    # as much as discovery could read (issue 39): a table it read whole, holding nothing,
    # is read whole again, so the probe's word alone does not make it "may hold"
    assert not devnodes.still_holds(73, DEVICES)
    monkeypatch.setattr(devnodes, "EXTRA_FDS", 0)  # past every cap: not ruled out
    assert devnodes.still_holds(73, DEVICES)


# ---- issue 39: rings outside fd tables, requests in flight, chroot-shadowed paths ----------
RING_POLLS = RING.replace("PollList:\n", "PollList:\n  op=6, task_works=0\n  op=6, task_works=0\n"
                          "CqOverflowList:\n")
RING_MAP = ("7f0000000000-7f0000001000 rw-s 10000000 00:10 8576                       "
            "anon_inode:[io_uring]\n")


def test_a_ring_with_requests_in_flight_is_not_judged(proc: Path) -> None:
    """A pending poll holds its file, which the ring's fdinfo does not name (op=6)."""
    ring_task(proc, 70, RING_POLLS)
    got = devnodes.judge_fds(70, DEVICES)
    assert got is not None and labels(got.held) == [f"/dev/null (io_uring fixed file, {HIT[1:]}"]
    assert got.unjudged == ["io_uring fd 4: 2 request(s) in flight (pending polls) on files "
                            "the kernel does not name: not judged"]


def ring_head(ino: int) -> str:
    return RING.replace("ino:\t1073", f"ino:\t{ino}")


def test_a_ring_kept_only_by_its_mapping_is_not_judged(proc: Path, tmp_path: Path) -> None:
    """Its fd closed (or registered with IORING_REGISTER_RING_FDS), the ring lives on in its
    SQ/CQ mapping: never "no device"."""
    base = task(proc / "71", {})
    (base / "maps").write_text(RING_MAP)
    (base / "map_files").mkdir()
    got = devnodes.judge(71, DEVICES, devnodes.ScanCache())
    assert got is not None and got.held == []
    assert got.unjudged == ["io_uring ring (inode 8576) kept by its mapping "
                            "7f0000000000-7f0000001000 in no fd table read: its registered "
                            "files and requests cannot be read; not judged"]


def test_a_mapped_ring_read_through_its_fd_is_judged_there(proc: Path) -> None:
    """The ring's own fd (here, or in a process read earlier in the scan) tells its files:
    the process that has it only mapped holds them too."""
    cache = devnodes.ScanCache()
    base = ring_task(proc, 70, ring_head(8576))
    (base / "maps").write_text(RING_MAP)
    got = devnodes.judge(70, DEVICES, cache)
    assert got is not None and got.unjudged == [] and len(got.held) == 1
    other = task(proc / "72", {})
    (other / "maps").write_text(RING_MAP)
    lent = devnodes.judge(72, DEVICES, cache)
    assert lent is not None and lent.unjudged == [] and lent.held == got.held
    assert lent.rdevs == {NULL}


def test_a_registered_path_is_looked_up_above_the_holders_chroot(proc: Path,
                                                                 tmp_path: Path) -> None:
    """The kernel names a registered file from the top of the mount namespace, not from the
    holder's chroot: a plain file at the same path inside the chroot hides nothing."""
    jail = tmp_path / "jail"
    (jail / "dev").mkdir(parents=True)
    (jail / "dev" / "null").write_text("a plain file where the node was")
    base = ring_task(proc, 70, RING)
    os.unlink(base / "root")
    os.symlink(jail, base / "root")
    got = devnodes.judge_fds(70, DEVICES)
    assert got is not None and labels(got.held) == [f"/dev/null (io_uring fixed file, {HIT[1:]}"]


def test_the_hosts_own_rings_in_flight_and_mapped_are_not_findings(proc: Path) -> None:
    """The host's processes are the admin's, not the tenant's: QEMU's iothreads keep polls in
    flight on every PVE host (fdmon-io_uring). Their registered files are still judged."""
    base = ring_task(proc, 70, RING_POLLS)
    (base / "maps").write_text(RING_MAP)
    got = devnodes.judge(70, DEVICES, devnodes.ScanCache(tenant=False))
    assert got is not None and got.unjudged == []
    assert labels(got.held) == [f"/dev/null (io_uring fixed file, {HIT[1:]}"]
    tenant = devnodes.judge(70, DEVICES, devnodes.ScanCache())
    assert tenant is not None and len(tenant.unjudged) == 2  # in flight; mapped, no fd read


def test_an_fd_and_maps_root_is_refused_are_not_judged_for_the_tenant(
        proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host root reads every container process's fds and maps; one it is refused (EACCES:
    statx and readlink of the fd, the open of maps) is unknown, not innocent, for the
    tenant's processes. The host's own (the admin's) stay as they were: pveclean refused
    there runs without the host's full privilege (the lab sandbox's PID 1)."""
    task(proc / "70", {"0": ("/gone/model.bin", 26), "1": ("pipe:[9]", None)})
    (proc / "70" / "maps").write_text("")
    real_readlink, real_open = os.readlink, os.open

    def refused_readlink(path: str, *, dir_fd: int | None = None) -> str:
        if path == "0":
            raise PermissionError(13, "Permission denied")
        return real_readlink(path, dir_fd=dir_fd)

    def refused_open(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None
                     ) -> int:
        if str(path).endswith("/70/maps"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "readlink", refused_readlink)
    monkeypatch.setattr(os, "open", refused_open)
    tenant = devnodes.judge(70, DEVICES, devnodes.ScanCache())
    assert tenant is not None and labels(tenant.held) == []
    assert tenant.unjudged == [
        "fd 0: statx (No such file or directory) and readlink (Permission denied) refused; "
        "not judged",
        "maps could not be read (Permission denied): its mappings not judged"]
    host = devnodes.judge(70, DEVICES, devnodes.ScanCache(tenant=False))
    assert host is not None and host.unjudged == [] and labels(host.held) == []
