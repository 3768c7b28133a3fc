"""host/devnodes through a fake /proc under tmp_path: NVIDIA's majors from /proc/devices, which
fds and mappings lead to a GPU node (the real /dev/null stands in for one), and that nothing on
FUSE is ever stat()ed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pveclean.core.records import GpuDevices
from pveclean.host import devnodes
from tests.helpers import DEVICES, NULL

HIT = f"({os.major(NULL)}:{os.minor(NULL)})"
MOUNTINFO = ("25 1 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw\n"
             "26 1 253:1 / / rw,relatime shared:1 - ext4 /dev/mapper/root rw\n"
             "27 26 0:42 / /mnt/fuse rw - fuse.sshfs me@far:/ rw\n")


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path stat_nosync is asked about (it still answers)."""
    seen: list[str] = []
    real = devnodes.stat_nosync

    def spy(path: str) -> tuple[int, int] | None:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(devnodes, "stat_nosync", spy)
    return seen


def task(base: Path, fds: dict[str, tuple[str, int | None]], mountinfo: str = MOUNTINFO
         ) -> Path:
    """A task directory: fd N -> (link target, its mount ID in fdinfo or None)."""
    (base / "fd").mkdir(parents=True)
    (base / "fdinfo").mkdir()
    (base / "ns").mkdir(exist_ok=True)
    (base / "mountinfo").write_text(mountinfo)
    os.symlink("mnt:[4026531840]", base / "ns" / "mnt")
    for fd, (target, mnt_id) in fds.items():
        os.symlink(target, base / "fd" / fd)
        info = "pos:\t0\nflags:\t02\n" + (f"mnt_id:\t{mnt_id}\n" if mnt_id else "")
        (base / "fdinfo" / fd).write_text(info)
    return base


def test_parse_mountinfo_keys_fs_types_by_mount_id_and_device() -> None:
    m = devnodes.parse_mountinfo(MOUNTINFO + "garbage\nx 1 0:1 / / rw - ext4 a rw\n"
                                 "28 1 0:5 / /dev2 rw - tmpfs t rw\n")
    assert m.by_id == {25: "devtmpfs", 26: "ext4", 27: "fuse.sshfs", 28: "tmpfs"}
    assert m.by_dev == {"0:5": "devtmpfs", "253:1": "ext4", "0:42": "fuse.sshfs"}  # first wins


def test_read_mounts_of_a_gone_task_is_empty(tmp_path: Path) -> None:
    assert devnodes.read_mounts(str(tmp_path / "gone")) == devnodes.Mounts({}, {})


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


def test_stat_nosync_answers_mode_and_device(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    for fn in (None, False):  # statx, then the os.stat fallback of a libc without it
        monkeypatch.setattr(devnodes, "_statx_fn", fn)
        got = devnodes.stat_nosync("/dev/null")
        assert got is not None and stat.S_ISCHR(got[0]) and got[1] == NULL
        assert devnodes.stat_nosync(str(tmp_path / "gone")) is None


def test_dev_key_turns_maps_hex_into_mountinfo_decimal() -> None:
    assert devnodes._dev_key("fd:01") == "253:1"
    assert devnodes._dev_key("00:2a") == "0:42"
    assert devnodes._dev_key("zz") == "zz"


def test_an_fd_on_a_gpu_node_is_found_and_nothing_else(proc: Path, tmp_path: Path,
                                                       stats: list[str]) -> None:
    (tmp_path / "data.bin").write_bytes(b"x")
    task(proc / "70", {"0": ("/dev/null", 25), "1": (str(tmp_path / "data.bin"), 26),
                       "2": ("socket:[123]", None), "3": ("/dev/null", 25)})
    assert devnodes.device_fds(70, DEVICES) == [f"/dev/null {HIT}"]  # once, not twice
    assert f"{proc}/70/fd/1" in stats  # a regular file: looked at, no match


def test_a_node_not_counted_as_gpu_is_no_hit(proc: Path) -> None:
    task(proc / "70", {"0": ("/dev/null", 25)})
    assert devnodes.device_fds(70, GpuDevices({}, frozenset({195}))) == []


def test_an_fd_on_fuse_is_never_stated_even_if_it_leads_to_a_node(proc: Path,
                                                                  stats: list[str]) -> None:
    task(proc / "70", {"0": ("/dev/null", 27), "1": ("/dev/null", None)})
    assert devnodes.device_fds(70, DEVICES) == []
    assert stats == []  # the mount type said no: no stat at all


def test_an_fd_on_a_mount_made_during_the_scan_is_found(proc: Path) -> None:
    base = task(proc / "70", {"0": ("/dev/null", 29)})
    cache = devnodes.ScanCache()
    cache.mounts(str(base))  # the namespace's table as it was before the mount
    (base / "mountinfo").write_text(MOUNTINFO + "29 25 0:5 / /dev/gpu rw - devtmpfs u rw\n")
    assert devnodes.device_fds(70, DEVICES, cache) == [f"/dev/null {HIT}"]


def test_an_unknown_mount_is_refreshed_once_then_left(proc: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    task(proc / "70", {"0": ("/dev/null", 99), "1": ("/dev/null", 98)})
    reads: list[str] = []
    real = devnodes.read_mounts
    monkeypatch.setattr(devnodes, "read_mounts", lambda b: reads.append(b) or real(b))
    assert devnodes.device_fds(70, DEVICES) == []
    assert len(reads) == 2  # the table, and one fresh look for both unknown IDs


def test_a_gone_process_has_no_fds_but_none(proc: Path) -> None:
    assert devnodes.device_fds(71, DEVICES) is None


def test_a_zombie_leader_holds_through_its_live_threads(proc: Path) -> None:
    (proc / "80" / "fd").mkdir(parents=True)  # the leader exited: its fd table is empty
    task(proc / "80" / "task" / "81", {"5": ("/dev/null", 25)})
    assert devnodes.device_fds(80, DEVICES) == [f"/dev/null {HIT}"]


MAPS = """\
7f0000000000-7f0000001000 rw-s 00000000 00:05 6 /dev/nvidia0
7f0000001000-7f0000002000 rw-s 00000000 00:05 6 /dev/nvidia0
7f0000002000-7f0000003000 rw-p 00000000 00:00 0
7f0000003000-7f0000004000 rw-p 00000000 00:00 0 [heap]
7f0000004000-7f0000005000 r--p 00000000 fd:01 1234 /usr/lib/libc.so.6
7f0000005000-7f0000006000 rw-s 00000000 00:2a 5 /mnt/fuse/gpu
"""


def maps_task(proc: Path, pid: int, tmp_path: Path) -> Path:
    base = task(proc / str(pid), {})
    (base / "maps").write_text(MAPS)
    (base / "map_files").mkdir()
    (tmp_path / "libc.so.6").write_bytes(b"\x7fELF")
    for first, target in (("7f0000000000", "/dev/null"), ("7f0000001000", "/dev/null"),
                          ("7f0000004000", str(tmp_path / "libc.so.6")),
                          ("7f0000005000", "/dev/null")):
        last = f"{int(first, 16) + 0x1000:x}"
        os.symlink(target, base / "map_files" / f"{first}-{last}")
    return base


def test_a_mapped_gpu_node_is_found_once_and_fuse_never_stated(proc: Path, tmp_path: Path,
                                                                stats: list[str]) -> None:
    maps_task(proc, 90, tmp_path)
    cache = devnodes.ScanCache()
    assert devnodes.device_maps(90, DEVICES, cache) == [f"/dev/nvidia0 (mmap {HIT[1:]}"]
    assert sorted(os.path.basename(p) for p in stats) == [
        "7f0000000000-7f0000001000", "7f0000004000-7f0000005000"]  # not the FUSE one
    assert cache.rdevs[("fd:01", "1234")] == -1  # the library: no device, remembered
    stats.clear()
    assert devnodes.device_maps(90, DEVICES, cache) and stats == []  # all from the cache


def test_maps_of_a_gone_or_empty_process_hold_nothing(proc: Path) -> None:
    assert devnodes.device_maps(91, DEVICES) == []
    (proc / "92").mkdir(parents=True)
    (proc / "92" / "maps").write_text("")
    assert devnodes.device_maps(92, DEVICES) == []


def test_maps_of_a_zombie_leader_are_read_from_a_thread(proc: Path, tmp_path: Path) -> None:
    (proc / "93").mkdir(parents=True)
    (proc / "93" / "maps").write_text("")
    maps_task(proc / "93" / "task", 94, tmp_path)
    assert devnodes.device_maps(93, DEVICES) == [f"/dev/nvidia0 (mmap {HIT[1:]}"]


def test_nvidia_majors_from_proc_devices(tmp_path: Path) -> None:
    f = tmp_path / "devices"
    f.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n"
                 "508 nvidia-uvm\n509 nvidia-caps\n10 misc\n\nBlock devices:\n 259 nvidia-x\n")
    assert devnodes.nvidia_majors(str(f)) == frozenset({195, 508, 509})
