"""Kernel text read as the kernel writes it, on lab containers: a name or a cgroup name the
tenant picks cannot forge the NSpid or the cgroup the kernel states, and reports keep names
and argv boundaries exactly.

/proc/PID/status escapes only "\\n" and "\\\\" in a name; \\f, \\v, \\r, \\x1c-\\x1e, \\x85 and
U+2028/9 pass raw, and a reader splitting lines on any of them (str.splitlines) reads a
forged "NSpid:" line. A v1 cgroup name may hold the same bytes (never "\\n": the kernel
refuses it), so a forged "0::" line in /proc/PID/cgroup on a hybrid host."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.harness.lxclab import Lab, cgroup_hierarchies
from tests.helpers import run_json, start_in_ct, wait_for


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_bytes().decode("utf-8", "surrogateescape")[:-1]


def test_holder_named_like_an_nspid_line_is_stopped(lab: Lab, vmid: int) -> None:
    """(a) "x\\fNSpid:\\t1" made the holder look like a host process: exempted, kept the GPU."""
    lab.create_ct(vmid, gpus=(0,))
    name = "x\fNSpid:\t1"
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/dev/nvidia0", "--name", name])
    (pid,) = w.host_pids(lab)
    assert comm(pid) == name
    code, rep = run_json(lab, vmid)
    (h,) = rep["holders"]
    assert code == 0, h
    assert h["host_pid"] == pid and h["name"] == name
    assert "protected" not in h and h["outcome"] in ("terminated", "killed")
    assert h["ct_pid"] not in (None, 1)
    assert rep["verdict"] == "clean"
    assert not lab.alive(pid)


def test_pid1_named_like_an_nspid_line_is_never_signalled(lab: Lab, vmid: int) -> None:
    """(b) The container's PID 1 named "\\fNSpid:\\t1\\t7", holding the GPU and listed by
    NVML, was read as container PID 7 and killed: the container stopped, verdict clean."""
    forged = "\fNSpid:\t1\t7"
    lab.create_ct(vmid, gpus=(0,), extra=[
        ("lxc.init.cmd", "/opt/lab/bin/named_init \\fNSpid:\\t1\\t7 /dev/nvidia0")])
    init = lab.init_pid(vmid)
    assert init is not None
    assert wait_for(lambda: comm(init) == forged, 10), comm(init)
    assert lab.nvml is not None
    lab.nvml.set_process(0, init, 2048)
    _code, rep = run_json(lab, vmid)
    h = next(h for h in rep["holders"] if h["host_pid"] == init)
    assert lab.alive(init), h
    assert lab.pct("status", str(vmid)).stdout.split() == ["status:", "running"]
    assert h["ct_pid"] == 1 and h["name"] == forged
    assert h["protected"] == "the container's PID 1" and not h["signals"]
    assert rep["container"]["init_pid"] == init
    assert rep["verdict"] == "residual"


def _v1_hierarchy(option: str) -> Path | None:
    for line in Path("/proc/self/mounts").read_text().split("\n"):
        parts = line.split(" ")
        if len(parts) > 3 and parts[2] == "cgroup" and option in parts[3].split(","):
            return Path(parts[1])
    return None


def test_v1_cgroup_named_like_a_v2_line_does_not_take_a_holder_out(lab: Lab, vmid: int) -> None:
    """(c) On a hybrid host a holder in the v1 cgroup "a\\f0::/lxc/<other>/ns" read as
    having left the container's tree: skipped, never signalled."""
    systemd = _v1_hierarchy("name=systemd") or _v1_hierarchy("freezer")
    if systemd is None:
        pytest.skip("no cgroup v1 hierarchy on this host (not a hybrid host)")
    assert any(h != systemd for h in cgroup_hierarchies())
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    (pid,) = w.host_pids(lab)
    v2_before = Path(f"/proc/{pid}/cgroup").read_text().split("\n")
    top = systemd / "lxc" / str(vmid)  # removed with the container's cgroups by the lab
    leaf = top / "ns" / "a\f0::" / "lxc" / str(vmid + 1) / "ns"
    leaf.mkdir(parents=True)
    try:
        (leaf / "cgroup.procs").write_text(str(pid))
        text = Path(f"/proc/{pid}/cgroup").read_text()
        assert f"/ns/a\f0::/lxc/{vmid + 1}/ns\n" in text  # the forged line, as written
        v2 = next(ln for ln in v2_before if ln.startswith("0::"))[3:]
        code, rep = run_json(lab, vmid)
        (h,) = rep["holders"]
        assert code == 0, (h["outcome"], h.get("protected"), h["signals"])
        assert h["outcome"] in ("terminated", "killed"), h
        assert h["host_pid"] == pid and h["cgroup"] == v2
        assert rep["verdict"] == "clean"
        assert not lab.alive(pid)
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 5
        for d in [leaf, *leaf.parents][: len(leaf.relative_to(top).parts)]:
            while d.exists() and time.monotonic() < end:
                try:
                    d.rmdir()
                except OSError:
                    time.sleep(0.05)


def test_report_keeps_the_exact_name_and_argv(lab: Lab, vmid: int) -> None:
    """(d) Names came out escaped and cut at a forged break; a command line was one string
    with the argv boundaries lost."""
    lab.create_ct(vmid, gpus=(0,))
    name = "a\\n\nb c\x85\u2028"  # 12 bytes: the kernel keeps 15
    spaced = "two words\tand a tab"
    w = start_in_ct(lab, vmid, "python3", ["--hold", "/dev/nvidia0", "--name", name,
                                           "--child-name", spaced, "--child-name", ""])
    (pid,) = w.host_pids(lab)
    assert comm(pid) == name
    code, rep = run_json(lab, vmid)  # a cleanup: a dry run writes no report
    assert code == 0, rep
    (h,) = rep["holders"]
    argv = ["/opt/lab/bin/python3", "--hold", "/dev/nvidia0", "--name", name,
            "--child-name", spaced, "--child-name", "", "--ready", f"/tmp/ready-{w.tag}",
            "--exit-after", "900"]
    assert h["name"] == name and h["cmdline"] == argv
    (path,) = sorted(lab.report_dir.glob(f"{vmid}-*.yaml"))
    (saved,) = yaml.safe_load(path.read_text(encoding="utf-8"))["holders"]
    assert saved["name"] == name and saved["cmdline"] == argv
    shown = lab.pveclean("reports", "show", "latest", str(vmid))
    assert shown.returncode == 0, shown.stderr
    assert "(a\\\\n\\x0ab c\\x85" in shown.stdout  # displayed escaped, on one line
    assert "--child-name two words\\x09and a tab --child-name  --ready" in shown.stdout
