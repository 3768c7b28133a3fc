"""The host side of `pveclean doctor`: the module's version file, /proc/devices, and a
container's libraries read through openat2 RESOLVE_IN_ROOT from a hostile rootfs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pveclean.host import ctfiles, hostfacts

OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.05  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Tue Oct  8 03:01:57 UTC 2024\nGCC version:  gcc 12\n")
CLOSED = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC "
          "2024\n")


def test_module_version_of_the_open_and_the_proprietary_module(tmp_path: Path) -> None:
    f = tmp_path / "version"
    f.write_text(OPEN)
    assert hostfacts.module_version(str(f)) == "550.127.05"
    f.write_text(CLOSED)
    assert hostfacts.module_version(str(f)) == "535.183.01"
    assert hostfacts.module_version(str(tmp_path / "none")) is None


def test_char_majors(tmp_path: Path) -> None:
    f = tmp_path / "devices"
    f.write_text("Character devices:\n  1 mem\n195 nvidia\n511 nvidia-uvm\n\nBlock devices:\n"
                 "  8 sd\n")
    assert hostfacts.char_majors(str(f)) == frozenset({1, 195, 511})


def rootfs(tmp_path: Path, vmid: int = 129) -> Path:
    lib = tmp_path / str(vmid) / "rootfs" / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    return lib


def look(tmp_path: Path, vmid: int = 129, seconds: float = 2.0) -> ctfiles.Userspace:
    return ctfiles.userspace(str(tmp_path / "cg"), [str(tmp_path / str(vmid) / "rootfs")], vmid,
                             False, seconds)


def test_versioned_libraries_are_read_from_their_names(tmp_path: Path) -> None:
    lib = rootfs(tmp_path)
    (lib / "libnvidia-ml.so.535.183.01").write_bytes(b"\x7fELF")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.535.183.01")
    (lib / "libcuda.so.535.183.01").write_bytes(b"\x7fELF")
    got = look(tmp_path)
    assert sorted((x.library, x.version) for x in got.libs) == [
        ("libcuda.so", "535.183.01"), ("libnvidia-ml.so", "535.183.01")]
    assert got.unjudged == () and got.why_not is None


def test_hostile_entries_are_not_judged_nor_followed(tmp_path: Path) -> None:
    lib = rootfs(tmp_path)
    (lib / "libcuda.so.550.1.1").symlink_to("/etc/shadow")
    os.mkfifo(lib / "libnvidia-ml.so.550.2.2")
    with open(lib / "libcuda.so.550.3.3", "wb") as fh:
        fh.truncate(ctfiles.MAX_FILE + 1)  # sparse: nothing is read of it
    (lib / "libcuda.so.\x1b[31m550").write_bytes(b"")
    got = look(tmp_path)
    assert got.libs == ()
    text = "\n".join(got.unjudged)
    assert "libcuda.so.550.1.1: a symlink" in text
    assert "libnvidia-ml.so.550.2.2: not a plain file" in text
    assert "too large" in text
    assert "\x1b" not in text and "a name that is no version" in text


def test_a_symlinked_directory_resolves_inside_the_container(tmp_path: Path) -> None:
    root = tmp_path / "129" / "rootfs"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu").symlink_to("/host-libs")  # absolute: inside root
    host = tmp_path / "host-libs"  # what it names on the host must not be read
    host.mkdir()
    (host / "libcuda.so.1.2.3").write_bytes(b"")
    (root / "host-libs").mkdir()
    (root / "host-libs" / "libcuda.so.9.9.9").write_bytes(b"")
    got = look(tmp_path)
    assert [x.version for x in got.libs] == ["9.9.9"]


def test_a_stopped_container_without_its_rootfs_is_said(tmp_path: Path) -> None:
    (tmp_path / "129" / "rootfs").mkdir(parents=True)
    assert "not mounted" in (look(tmp_path).why_not or "")
    assert "No such file" in (look(tmp_path, 130).why_not or "")


def test_a_huge_directory_is_bounded(tmp_path: Path) -> None:
    lib = rootfs(tmp_path)
    for i in range(3000):
        (lib / f"f{i}").write_bytes(b"")
    t0 = time.monotonic()
    got = look(tmp_path, seconds=0.0)
    assert time.monotonic() - t0 < 2
    assert any("not all were looked at" in u for u in got.unjudged)


def test_a_stopped_containers_subvolume_is_read_when_nothing_is_mounted(tmp_path: Path) -> None:
    (tmp_path / "129" / "rootfs").mkdir(parents=True)  # pct mount's place, empty
    subvol = tmp_path / "rpool/data/subvol-129-disk-0"
    (subvol / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (subvol / "usr/lib/x86_64-linux-gnu/libcuda.so.535.183.01").write_bytes(b"")
    got = ctfiles.userspace(str(tmp_path / "cg"), [str(tmp_path / "129" / "rootfs"),
                                                   str(subvol)], 129, False)
    assert [x.version for x in got.libs] == ["535.183.01"]
