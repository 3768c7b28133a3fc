"""Shared fixtures: the lab (root and LXC; elsewhere a lab test skips with the reason, but
under CI=true a skipped lab test is reported as a failure), fresh VMIDs, the lab as a Proxmox
host, a fake cluster over fakepve, and a chained hookscript record, and a fake /proc."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pveclean.core import config
from pveclean.host import procfs
from pveclean.proxmox import chain, pveapi
from tests.harness import pvesh, qm
from tests.harness.hangfs import HangFs
from tests.harness.lxclab import Lab, LabUnavailable, cgroup2_root, lab_unavailable_reason
from tests.helpers import GPU_LXC, Cluster, write_config

CI = os.environ.get("CI") == "true"
_next_vmid = [990300 + (os.getpid() % 200) * 20]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.lab)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    if CI and rep.skipped and item.get_closest_marker("lab") is not None:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"lab test skipped under CI=true (lab tests must run in CI): {reason}"


@pytest.fixture
def lab() -> Iterator[Lab]:
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(f"lab: {reason}")
    root = Path(tempfile.mkdtemp(prefix="pveclean-lab-", dir="/tmp"))
    try:
        the_lab = Lab.create(root)
    except LabUnavailable as exc:
        pytest.skip(f"lab: {exc}")
    try:
        yield the_lab
    finally:
        the_lab.destroy()


@pytest.fixture
def vmid() -> int:
    """A fresh VMID from a high range whose cgroup does not exist on this host."""
    while True:
        _next_vmid[0] += 1
        candidate = _next_vmid[0]
        try:
            taken = (cgroup2_root() / "lxc" / str(candidate)).exists()
        except LabUnavailable:
            taken = False
        if not taken:
            return candidate


@pytest.fixture
def vmid2(vmid: int) -> int:
    _next_vmid[0] += 1
    return _next_vmid[0]


@pytest.fixture
def hangfs(lab: Lab) -> Iterator[HangFs]:
    """A FUSE mount in the lab that answers until told to hang (the lab's "NFS server went
    away")."""
    fs = HangFs(lab.root / "fuse")
    try:
        yield fs
    finally:
        fs.close()  # aborts the connection: every reader stuck on it goes on


@pytest.fixture
def host(lab: Lab) -> Lab:
    """The lab as a Proxmox host for install: a pvesh stand-in, pveclean's state in the lab."""
    pvesh.install(lab.root)
    lab.write_config(state_dir=str(lab.root / "state"))
    return lab


@pytest.fixture
def cluster(fakepve: Any, fakepve_cafile: str, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """Two nodes: pve1 (the one the API runs on, and this machine) with CT 101 (GPUs,
    running) and CT 102, pve2 with CT 201 (GPUs); storage 'local' per node, 'shared' on all."""
    monkeypatch.setattr(pveapi, "nodename", lambda: "pve1")  # this machine is node pve1
    pve = fakepve
    pve.add_node("pve2")
    local, shared = tmp_path / "vz", tmp_path / "shared"
    pve.storages["local"]["path"] = str(local)
    pve.storages["shared"] = {"type": "dir", "path": str(shared), "shared": 1, "active": 1,
                              "content": "vztmpl,snippets", "files": set()}
    pve.add_ct(101, node="pve1", status="running",
               config={"dev0": "/dev/nvidia0,gid=44", "dev1": "/dev/nvidiactl,gid=44"})
    pve.add_ct(102, node="pve1")
    pve.add_ct(201, node="pve2", config={"lxc": GPU_LXC})
    pw = tmp_path / "password"
    pw.write_text("secret\n")
    pw.chmod(0o600)
    cfg = write_config(tmp_path, backend="https", host=pve.url.removeprefix("https://"),
                       password_file=str(pw), verify_ssl=fakepve_cafile)
    return Cluster(pve, cfg, local, shared, tmp_path)


@pytest.fixture
def proc(tmp_path: Path) -> Iterator[Path]:
    """A fake /proc under tmp_path, set as procfs's root (workers forked from now on read it
    too) and set back afterwards."""
    old = procfs.PROC
    procfs.set_root(str(tmp_path / "proc"))
    yield tmp_path / "proc"
    procfs.set_root(old)


@pytest.fixture
def chained(tmp_path: Path) -> tuple[config.Config, Path]:
    """A storage.cfg next to the configs, a chained script recorded for CT 100."""
    pve = tmp_path / "etc/pve"
    (pve / "lxc").mkdir(parents=True)
    vz = tmp_path / "vz"
    (vz / "snippets").mkdir(parents=True)
    (pve / "storage.cfg").write_text(f"dir: local\n\tpath {vz}\n\tcontent snippets\n")
    cfg = config.Config(pve_config_dir=str(pve / "lxc"), state_dir=str(tmp_path / "state"),
                        deadline_seconds=1)
    script = vz / "snippets/theirs.sh"
    chain.write_record(cfg, 100, "local:snippets/theirs.sh", str(script))
    return cfg, script


@pytest.fixture
def vm_host(host: Lab) -> Iterator[Lab]:
    """The lab with VMs: its GPUs in a sysfs root of the lab's, a `qm` stand-in, and the
    config's VM paths pointing there. Every VM's QEMU stand-in ends with the test."""
    qm.lay_out_pci(host.root, 4)
    host.write_config(state_dir=str(host.root / "state"),
                      pci_sysfs=str(host.root / "sys/bus/pci"),
                      qemu_run_dir=str(host.root / "run/qemu-server"))
    try:
        yield host
    finally:
        qm.stop_all(host.root)


def _tool(name: str) -> str:
    """A program the test needs (installed by `make lab-deps`): its path; else the test
    skips with the reason, and under CI=true fails."""
    import shutil

    path = shutil.which(name)
    if path is None:
        why = f"{name} not installed (make lab-deps installs it as root)"
        if CI:
            pytest.fail(f"{why}; under CI=true a missing tool is a failure")
        pytest.skip(why)
    return path


@pytest.fixture
def promtool() -> str:
    return _tool("promtool")
