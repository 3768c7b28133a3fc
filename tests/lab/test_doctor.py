"""`pveclean doctor` on real lab containers: a userspace of another version than the fake
driver's, a device major that moved, a missing uvm node, a node put in twice, a GPU also
passed to a VM, persistence off, and a hostile rootfs; and pre-start's warnings."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from tests.harness import qm
from tests.harness.lxclab import Lab
from tests.helpers import pveclean

MODULE = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:01:57 "
          "UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
LIBS = "usr/lib/x86_64-linux-gnu"


def set_up(lab: Lab, module: str = MODULE, persistent: tuple[int, ...] = (0, 1, 2, 3)) -> None:
    """The lab's host as doctor reads it: the module's version file, the containers' roots
    under the lab's lxc path, the `persistent` GPUs in persistence mode (the others off)."""
    (lab.root / "nvidia-version").write_text(module)
    cfg = yaml.safe_load(lab.config_path.read_text())
    cfg.update(nvidia_version_file=str(lab.root / "nvidia-version"),
               lxc_path=str(lab.root / "lxc"))
    lab.write_config(**cfg)
    assert lab.nvml is not None
    for gpu in persistent:
        lab.nvml.set_persistence(gpu, True)


def userspace(lab: Lab, vmid: int, version: str) -> None:
    lib = lab.rootfs(vmid) / LIBS
    lib.mkdir(parents=True, exist_ok=True)
    for name in ("libnvidia-ml.so", "libcuda.so"):
        (lib / f"{name}.{version}").write_bytes(b"\x7fELF")
        (lib / f"{name}.1").symlink_to(f"{name}.{version}")


def doctor(lab: Lab, *args: object) -> tuple[int, dict[str, Any]]:
    r = pveclean(lab, "doctor", *map(str, args), "--json")
    assert r.stdout.strip(), r.stderr
    return r.returncode, json.loads(r.stdout)


def checks(got: dict[str, Any]) -> list[str]:
    return [f["check"] for f in got["findings"]]


def test_a_userspace_of_another_version_than_the_driver(lab: Lab, vmid: int) -> None:
    set_up(lab)
    lab.create_ct(vmid, gpus=(0,))
    userspace(lab, vmid, "535.183.01")
    code, got = doctor(lab, vmid)
    assert code == 1 and checks(got) == ["library_version", "library_version"], got
    f = got["findings"][0]
    assert f["id"] == str(vmid) and "535.183.01" in f["evidence"] and "550.127.05" in f["evidence"]
    assert "NVIDIA-Linux-x86_64-550.127.05.run --no-kernel-module" in f["fix"]
    for lib in (lab.rootfs(vmid) / LIBS).glob("lib*.so.*"):
        lib.unlink()
    userspace(lab, vmid, "550.127.05")
    code, got = doctor(lab, vmid)
    assert code == 0 and got["findings"] == [], got
    r = pveclean(lab, "doctor", str(vmid))
    assert r.returncode == 0 and r.stdout.startswith("nothing found; looked at"), r


def test_the_hosts_module_and_nvml_disagree(lab: Lab, vmid: int) -> None:
    set_up(lab, MODULE.replace("550.127.05", "560.35.03"))
    assert lab.nvml is not None
    lab.create_ct(vmid, gpus=(0,))
    userspace(lab, vmid, "550.127.05")
    code, got = doctor(lab, vmid)
    assert code == 1
    host = [f for f in got["findings"] if f["id"] == "host"]
    assert [f["check"] for f in host] == ["driver_version"], got
    assert "560.35.03" in host[0]["evidence"] and "550.127.05" in host[0]["evidence"]
    # the container is judged against the loaded module's version
    assert "library_version" in checks(got)
    lab.nvml.set_driver_version("560.35.03")
    assert "driver_version" not in checks(doctor(lab, vmid)[1])


def test_a_moved_major_a_missing_uvm_node_and_a_node_put_twice(lab: Lab, vmid: int) -> None:
    set_up(lab)
    uvm = os.stat(lab.nodes["nvidia-uvm"]).st_rdev
    others = {os.major(os.stat(lab.nodes[n]).st_rdev) for n in ("nvidia0", "nvidiactl")}
    lab.create_ct(vmid, gpus=(0,), start=False)
    path = lab.root / "etc/pve/lxc" / f"{vmid}.conf"
    text = path.read_text()
    if os.major(uvm) not in others:  # the uvm node's own rule becomes a stale major
        text = text.replace(f"c {os.major(uvm)}:* rwm", "c 508:* rwm")
    else:
        text += "lxc.cgroup2.devices.allow: c 508:* rwm\n"
        text = text.replace(f"lxc.cgroup2.devices.allow: c {os.major(uvm)}:* rwm\n",
                            f"lxc.cgroup2.devices.allow: c {os.major(uvm)}:{os.minor(uvm) + 1}"
                            " rwm\n")
    path.write_text(text + "dev7: /dev/nvidia0,gid=44\n")
    code, got = doctor(lab, vmid)
    assert code == 1
    assert sorted(checks(got)) == ["duplicate_node", "stale_major"], got
    stale = next(f for f in got["findings"] if f["check"] == "stale_major")
    assert "c 508:* rwm" in stale["evidence"] and f"c {os.major(uvm)}:* rwm" in stale["fix"]
    n = text.splitlines().index(next(ln for ln in text.splitlines() if "508" in ln)) + 1
    assert stale["evidence"].startswith(f"line {n}: ")
    os.unlink(lab.nodes["nvidia-uvm"])
    code, got = doctor(lab, vmid)
    missing = [f for f in got["findings"] if f["check"] == "missing_node"]
    assert len(missing) == 1 and "/dev/nvidia-uvm does not exist" in missing[0]["what"], got
    assert "nvidia-modprobe -u -c=0" in missing[0]["fix"]


def test_pre_start_warns_and_starts(lab: Lab, vmid: int) -> None:
    set_up(lab)
    lab.create_ct(vmid, gpus=(0,), start=False)
    userspace(lab, vmid, "535.183.01")
    lab.install_hook(vmid)
    os.unlink(lab.nodes["nvidia-uvm"])
    t0 = time.monotonic()
    res = lab.pct("start", str(vmid))
    took = time.monotonic() - t0
    said = [ln for ln in res.stdout.splitlines() if "pre-start" in ln and "WARNING" in ln]
    assert any("/dev/nvidia-uvm does not exist" in ln for ln in said), res.stdout
    assert any("libnvidia-ml.so is not the host driver's version" in ln for ln in said), said
    assert all(ln.startswith(f"pveclean: WARNING: CT {vmid} pre-start: ") for ln in said)
    assert lab.pct("status", str(vmid)).stdout == "status: running\n"
    assert took < 10


def test_a_gpu_granted_and_passed_to_a_vm(vm_host: Lab, vmid: int, vmid2: int) -> None:
    lab = vm_host
    set_up(lab)
    lab.create_ct(vmid, gpus=(0,), start=False)
    qm.create_vm(lab.root, vmid2, (0,), None)
    code, got = doctor(lab, vmid)
    assert code == 1 and checks(got) == ["vm_conflict"], got
    f = got["findings"][0]
    assert f["vm"] == vmid2 and qm.gpu_address(0) in f["what"]
    code, by_vm = doctor(lab, vmid2)
    assert code == 1 and by_vm["findings"] == got["findings"]


def test_persistence_off_of_the_containers_gpu(lab: Lab, vmid: int) -> None:
    set_up(lab, persistent=(1,))
    lab.create_ct(vmid, gpus=(1,), start=False)
    assert doctor(lab, vmid)[0] == 0  # GPU 0's mode is off: not the container's GPU
    assert lab.nvml is not None
    with open(lab.nvml.state_path, "a", encoding="ascii") as fh:
        fh.write("persistence 1 off\n")  # as nvmlDeviceSetPersistenceMode writes it
    code, got = doctor(lab, vmid)
    assert code == 1 and checks(got) == ["persistence_off"], got
    assert "nvidia-smi -i 1 -pm 1" in got["findings"][0]["fix"]


def test_a_hostile_rootfs_is_not_followed(lab: Lab, vmid: int) -> None:
    set_up(lab)
    lab.create_ct(vmid, gpus=(0,))
    lib = lab.rootfs(vmid) / LIBS
    lib.mkdir(parents=True, exist_ok=True)
    secret = lab.root / "host-secret"
    secret.write_text("host")
    (lib / "libnvidia-ml.so.550.127.05").symlink_to(secret)
    os.mkfifo(lib / "libcuda.so.550.127.05")
    (lib / "libcuda.so.9\x1b[2J").write_bytes(b"")
    with open(lib / "libcuda.so.1.2.3", "wb") as fh:
        fh.truncate(2 << 30)  # sparse: 2 GiB that nothing reads
    t0 = time.monotonic()
    r = pveclean(lab, "doctor", str(vmid))
    assert time.monotonic() - t0 < 10
    assert r.returncode == 1 and "\x1b" not in r.stdout, r
    unjudged = [ln for ln in r.stdout.splitlines() if ln.startswith("    evidence: ")]
    text = "\n".join(unjudged)
    assert "libnvidia-ml.so.550.127.05: a symlink (not followed)" in text
    assert "libcuda.so.550.127.05: not a plain file" in text
    assert "a name that is no version" in text and "too large" in text
    assert r.stdout.count(f"CT {vmid}  could_not_judge") == 4, r.stdout
    assert Path(secret).read_text() == "host"


def test_binds_without_allow_allows_without_bind_and_no_device(lab: Lab, vmid: int,
                                                                vmid2: int) -> None:
    set_up(lab)
    lab.create_ct(vmid, gpus=(0,), start=False,
                  extra=[("lxc.mount.entry", f"/usr/lib/{LIBS} dev/nvidia3 none bind,create=dir")])
    path = lab.root / "etc/pve/lxc" / f"{vmid}.conf"
    path.write_text("".join(ln + "\n" for ln in path.read_text().splitlines()
                            if "devices.allow" not in ln))
    code, got = doctor(lab, vmid)
    assert code == 1 and sorted(set(checks(got))) == ["bind_without_allow", "not_a_device"], got
    assert all("lxc.cgroup2.devices.allow: c " in f["fix"] for f in got["findings"]
               if f["check"] == "bind_without_allow")
    lab.create_ct(vmid2, gpus=(), start=False,
                  extra=[("lxc.cgroup2.devices.allow", "c 195:* rwm")])
    code, got = doctor(lab, vmid2)
    assert code == 1 and checks(got) == ["allow_without_bind"], got


def test_status_counts_the_findings_per_container(host: Lab, vmid: int, vmid2: int) -> None:
    lab = host
    set_up(lab)
    lab.create_ct(vmid, gpus=(0,))
    userspace(lab, vmid, "535.183.01")
    lab.create_ct(vmid2, gpus=(1,))
    r = pveclean(lab, "status", "--json")
    assert r.returncode == 0, r.stderr
    got = {c["vmid"]: c for c in json.loads(r.stdout)["containers"]}
    assert got[vmid]["doctor_findings"] == {"library_version": 2}
    assert got[vmid2]["doctor_findings"] == {}
    text = pveclean(lab, "status").stdout
    assert f"doctor: CT {vmid}: library_version 2 (pveclean doctor {vmid})" in text
    assert f"doctor: CT {vmid2}" not in text


def test_metrics_write_the_findings_beside_the_gpu_map(lab: Lab, vmid: int) -> None:
    import shutil
    import subprocess

    set_up(lab)
    lab.create_ct(vmid, gpus=(0,))
    userspace(lab, vmid, "535.183.01")
    textfile = lab.root / "node-exporter"
    textfile.mkdir()
    r = lab.pveclean("metrics", "--textfile-dir", str(textfile))
    assert r.returncode == 0, r.stderr
    prom = (textfile / "pveclean_doctor.prom").read_text()
    node = os.uname().nodename
    assert (f'pveclean_doctor_findings{{node="{node}",id="lxc/{vmid}",'
            f'check="library_version"}} 2') in prom
    assert f'pveclean_doctor_findings{{node="{node}",id="lxc/{vmid}",check="stale_major"}} 0' \
        in prom
    assert f'pveclean_doctor_up{{node="{node}"}} 1' in prom
    promtool = shutil.which("promtool")
    if promtool:
        c = subprocess.run([promtool, "check", "metrics"], input=prom, capture_output=True,
                           text=True, timeout=60, check=False)
        assert c.returncode == 0, c.stdout + c.stderr


def test_a_library_directory_that_stops_answering_bounds_doctor_and_pre_start(
        lab: Lab, vmid: int, hangfs: Any) -> None:
    """The container's library directory on a FUSE mount whose server stopped answering:
    doctor gives up at its deadline with exit 3, pre-start says its checks were skipped and
    the container starts."""
    import subprocess

    set_up(lab)
    cfg = yaml.safe_load(lab.config_path.read_text())
    lab.write_config(**{**cfg, "deadline_seconds": 3})
    lab.create_ct(vmid, gpus=(0,), start=False)
    lib = lab.rootfs(vmid) / LIBS
    lib.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(hangfs.mountpoint), str(lib)], check=True)
    try:
        lab.install_hook(vmid)
        hangfs.hang()
        t0 = time.monotonic()
        r = pveclean(lab, "doctor", str(vmid))
        took = time.monotonic() - t0
        assert r.returncode == 3 and "doctor" in r.stderr, r
        assert took < 3 + 3, took
        t0 = time.monotonic()
        res = lab.pct("start", str(vmid))
        assert "pre-start: doctor's checks skipped" in res.stdout, res.stdout
        assert time.monotonic() - t0 < 3 + 10
        assert lab.pct("status", str(vmid)).stdout == "status: running\n"
    finally:
        hangfs.close()
        subprocess.run(["umount", "-l", str(lib)], check=False)
