"""A stopped container's root directory from its rootfs volume and storage.cfg, as
PVE::Storage's ZFS pool and directory plugins name a subvolume's path."""

from __future__ import annotations

from pathlib import Path

from pveclean.proxmox import ctrootfs

STORAGE = """dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup,rootdir

zfspool: local-zfs
\tpool rpool/data
\tsparse
\tcontent images,rootdir

zfspool: tank
\tpool tank/ct
\tmountpoint /mnt/tank-ct
\tcontent rootdir

lvmthin: local-lvm
\tthinpool data
\tvgname pve
\tcontent rootdir,images
"""


def test_zfs_subvolumes_and_their_mountpoint() -> None:
    assert ctrootfs.rootfs_dir(STORAGE, "local-zfs:subvol-129-disk-0,size=8G") == \
        "/rpool/data/subvol-129-disk-0"
    assert ctrootfs.rootfs_dir(STORAGE, "tank:subvol-7001-disk-1,size=8G") == \
        "/mnt/tank-ct/subvol-7001-disk-1"
    assert ctrootfs.rootfs_dir(STORAGE, "size=8G,volume=local-zfs:subvol-129-disk-0") == \
        "/rpool/data/subvol-129-disk-0"


def test_a_directory_storages_subvolume() -> None:
    assert ctrootfs.rootfs_dir(STORAGE, "local:129/subvol-129-disk-0.subvol,size=0T") == \
        "/var/lib/vz/images/129/subvol-129-disk-0.subvol"


def test_images_and_unknown_storages_have_no_directory() -> None:
    for rootfs in ("local-lvm:vm-129-disk-0,size=8G", "local:129/vm-129-disk-0.raw,size=8G",
                   "gone:subvol-129-disk-0", "local-zfs:../../etc", "local-zfs:vm-129-disk-0"):
        assert ctrootfs.rootfs_dir(STORAGE, rootfs) is None, rootfs


def test_read_from_the_pve_dir(tmp_path: Path) -> None:
    (tmp_path / "storage.cfg").write_text(STORAGE)
    assert ctrootfs.read_rootfs_dir(str(tmp_path), "local-zfs:subvol-1-disk-0") == \
        "/rpool/data/subvol-1-disk-0"
    assert ctrootfs.read_rootfs_dir(str(tmp_path / "none"), "local-zfs:subvol-1-disk-0") is None
    assert ctrootfs.read_rootfs_dir(str(tmp_path), None) is None
