#!/usr/bin/env python3
"""`make gpu-check`: pveclean against a real NVIDIA driver, without Proxmox or LXC.

On a Linux machine with an NVIDIA GPU, as root, it
- builds a stand-in container: a PID namespace (unshare) whose processes sit in a cgroup laid
  out as Proxmox's (lxc/<vmid>/ns, monitor lxc.monitor/<vmid>) and a tiny `pct` for that vmid;
- starts real CUDA holders in it (ctypes on libcuda, no PyTorch needed): three allocating GiBs,
  one ignoring SIGTERM, one with a forked child; and one holder outside that must survive;
- runs `pveclean ct <vmid> --json` and checks every holder was found, attributed, stopped, the
  outside one alive, and GPU memory back to its baseline within the deadline;
- prints a table and exits non-zero on any miss. Without a GPU it fails with one clear line.
Installs nothing; needs no network.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings, run from anywhere
import gpuplumb  # tests/gpu/gpuplumb.py: what the GPU scripts share

HOLDER = r"""
import os, signal, sys, time
gib, gpu = float(sys.argv[1]), int(sys.argv[4])
ignore_term, fork_child = sys.argv[2] == "1", sys.argv[3] == "1"
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
""" + gpuplumb.CUDA_CTYPES + r"""
ptr = alloc(gib)
if fork_child and os.fork() == 0:
    time.sleep(3600); sys.exit(0)   # keeps the inherited /dev/nvidia* fds, no context of its own
print("ready", flush=True)
time.sleep(3600)
"""

# --fake-nvml: the same check on a machine without a GPU, against the lab's fake NVML and fake
# nodes, so the stand-in container and every step of the script are tested before a GPU run.
FAKE_HOLDER = r"""
import os, signal, sys, time
gib, gpu = float(sys.argv[1]), int(sys.argv[4])
ignore_term, fork_child = sys.argv[2] == "1", sys.argv[3] == "1"
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
""" + gpuplumb.FAKE_NODE + r"""  # what a CUDA context holds
if fork_child and os.fork() == 0:
    time.sleep(3600); sys.exit(0)
print("ready", flush=True)
time.sleep(3600)
"""

PCT = """#!/bin/sh
# pct stand-in for the gpu-check's container {vmid}
case "$1" in
  exec) shift; shift; [ "$1" = "--" ] && shift
        exec nsenter --target {init} --pid --mount -- "$@" ;;
  status) echo "status: running" ;;
  *) echo "gpu-check pct: unsupported: $*" >&2; exit 255 ;;
esac
"""


class CheckFailed(Exception):
    pass


def fail(msg: str) -> int:
    print(f"gpu-check: {msg}", file=sys.stderr)
    return 2


def cgroup2_root() -> Path:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        p = line.split()
        if len(p) > 2 and p[2] == "cgroup2":
            return Path(p[1])
    raise CheckFailed("no cgroup v2 mount")


FAKE_NVML: str | None = None


def fake_memory(pid: int, gib: float, gpu: int) -> None:
    gpuplumb.fake_memory(FAKE_NVML, pid, gib, gpu)


def nvml_state() -> dict[int, int]:
    return gpuplumb.used_mib(FAKE_NVML)


def preflight() -> str | None:
    return gpuplumb.preflight(FAKE_NVML)


def move(pid: int, cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


alive = gpuplumb.alive


def run(args: argparse.Namespace) -> int:
    why = preflight()
    if why:
        return fail(why)
    gpu = args.gpu
    vmid = args.vmid
    cg = cgroup2_root()
    ct_cg, mon_cg = cg / "lxc" / str(vmid), cg / "lxc.monitor" / str(vmid)
    if ct_cg.exists():
        return fail(f"cgroup {ct_cg} exists: pick another --vmid")
    work = Path(tempfile.mkdtemp(prefix="pveclean-gpu-check-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for d in (ct_cg / "ns" / ".lxc", mon_cg):
            d.mkdir(parents=True)
        procs.append(subprocess.Popen(["sleep", "3600"]))
        move(procs[-1].pid, mon_cg)  # "the container runs": its monitor has a process
        init = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sleep", "3600"])
        procs.append(init)
        end = time.monotonic() + 5
        while not (inner := _children(init.pid)):
            if time.monotonic() > end:
                raise CheckFailed("the PID namespace did not start")
            time.sleep(0.05)
        init_pid = inner[0]
        move(init_pid, ct_cg / "ns")
        holder_py = work / "holder.py"
        holder_py.write_text(FAKE_HOLDER if FAKE_NVML else HOLDER)
        outside = subprocess.Popen([sys.executable, str(holder_py), "1", "0", "0", str(gpu)],
                                   stdout=subprocess.PIPE)
        procs.append(outside)
        assert outside.stdout is not None
        if outside.stdout.readline().strip() != b"ready":
            raise CheckFailed("the outside CUDA holder did not start")
        fake_memory(outside.pid, 1, gpu)
        baseline = nvml_state()[gpu]  # includes the outside holder, which must stay
        plan = [("worker-0", 2, False, False), ("worker-1", 2, True, False),
                ("worker-2", 2, False, True)]
        inside: list[int] = []
        for name, gib, ignore, fork in plan:
            p = subprocess.Popen(
                ["nsenter", "--target", str(init_pid), "--pid", "--mount", "--",
                 sys.executable, "-c", f"import sys; sys.argv[0]={name!r}; exec(open("
                 f"{str(holder_py)!r}).read())", str(gib), "1" if ignore else "0",
                 "1" if fork else "0", str(gpu)], stdout=subprocess.PIPE)
            procs.append(p)
            assert p.stdout is not None
            if p.stdout.readline().strip() != b"ready":
                raise CheckFailed(f"CUDA holder {name} did not start")
            kids = _descendants(p.pid)
            if kids:
                fake_memory(kids[0], gib, gpu)
            for k in kids:
                move(k, ct_cg / "ns" / ".lxc")
            inside += kids
        before = nvml_state()[gpu]
        confdir = work / "pve"
        confdir.mkdir()
        nodes = sorted(str(p) for p in Path(args.devices).parent.glob(Path(args.devices).name)
                       if p.is_char_device())
        (confdir / f"{vmid}.conf").write_text("hostname: gpu-check\n" + "".join(
            f"lxc.mount.entry: {n} {n[1:]} none bind,optional,create=file\n" for n in nodes))
        pct = work / "pct"
        pct.write_text(PCT.format(vmid=vmid, init=init_pid))
        pct.chmod(0o755)
        cfg = work / "pveclean.yaml"
        cfg.write_text(json.dumps({
            "report_dir": str(work / "reports"), "state_dir": str(work / "state"),
            "pct_command": str(pct), "pve_config_dir": str(confdir),
            "grace_seconds": args.grace, "deadline_seconds": args.deadline,
            "cgroup_root": str(cg), "devices": [args.devices],
            **({"nvml_library": FAKE_NVML} if FAKE_NVML else {}),
        }))
        cfg.chmod(0o600)
        exe = shutil.which("pveclean") or str(Path(sys.executable).parent / "pveclean")
        t0 = time.monotonic()
        r = subprocess.run([exe, "ct", str(vmid), "--json", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=args.deadline + 30,
                           check=False)
        took = time.monotonic() - t0
        try:
            rep = json.loads(r.stdout)
        except json.JSONDecodeError:
            raise CheckFailed(f"pveclean gave no JSON (exit {r.returncode}): "
                              f"{r.stderr.strip()[-300:]}") from None
        freed_at = None
        end = time.monotonic() + args.deadline
        while time.monotonic() < end:
            used = nvml_state()[gpu]
            if used <= baseline + args.tolerance_mib:
                freed_at = time.monotonic() - t0
                break
            time.sleep(0.05)
        after = nvml_state()[gpu]
        found = {h["host_pid"]: h for h in rep.get("holders", [])}
        missing = [p for p in inside if p not in found]
        survivors = [p for p in inside if alive(p)]
        rows = [
            ("holders found / expected", f"{len([p for p in inside if p in found])} / "
             f"{len(inside)}"),
            ("sources", ", ".join(sorted({s for h in found.values() for s in h["sources"]}))),
            ("holders with NVML memory", str(sum(1 for h in found.values()
                                                 if h.get("gpu_memory_mib")))),
            ("outcomes", json.dumps(rep.get("summary", {}).get("outcomes", {}))),
            ("outside holder alive", str(alive(outside.pid))),
            (f"GPU {gpu} used MiB: baseline / with holders / after", f"{baseline} / {before} / "
             f"{after}"),
            ("pveclean wall s / verdict / exit", f"{took:.2f} / {rep.get('verdict')} / "
             f"{r.returncode}"),
            ("seconds until memory back to baseline", f"{freed_at:.2f}" if freed_at else "never"),
        ]
        width = max(len(a) for a, _ in rows)
        print(f"pveclean gpu-check on {os.uname().nodename}, GPU {gpu}, {time.strftime('%F %T')}")
        for a, b in rows:
            print(f"  {a:<{width}}  {b}")
        problems = []
        if missing:
            problems.append(f"holders not found: {missing}")
        if survivors:
            problems.append(f"holders still alive: {survivors}")
        if not alive(outside.pid):
            problems.append("the outside holder was killed")
        if freed_at is None:
            problems.append("GPU memory did not return to baseline within the deadline")
        if rep.get("verdict") != "clean" or r.returncode != 0:
            problems.append(f"verdict {rep.get('verdict')}, exit {r.returncode}")
        for p in problems:
            print(f"gpu-check: FAIL: {p}", file=sys.stderr)
        print("gpu-check: " + ("FAILED" if problems else "PASSED"))
        return 1 if problems else 0
    except CheckFailed as exc:
        return fail(str(exc))
    finally:
        for p in procs:
            for k in _descendants(p.pid):
                with contextlib.suppress(OSError):
                    os.kill(k, signal.SIGKILL)
            with contextlib.suppress(OSError):
                p.kill()
            with contextlib.suppress(Exception):
                p.wait(5)
        # A killed process leaves its cgroup only once it is reaped: rmdir until it is empty
        # (EBUSY meanwhile) or 5 s pass, so no cgroup outlives the check.
        end = time.monotonic() + 5
        for d in (ct_cg, mon_cg):
            for sub in sorted((x for x, _d, _f in os.walk(d)), key=len, reverse=True):
                while True:
                    try:
                        os.rmdir(sub)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() >= end:
                            break
                        time.sleep(0.02)
        shutil.rmtree(work, ignore_errors=True)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _descendants(pid: int) -> list[int]:
    out, todo = [], _children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def rebind_check(addr: str, timeout: float) -> int:
    """`--rebind ADDR`: the real hand-off of a spare GPU (a VM's vm_gpu_rebind): its IOMMU
    group to vfio-pci and back through pveclean's own code, each function's driver checked
    after each way. Only with this option: it takes the GPU from the nvidia driver."""
    from pveclean.host import pcibind
    from pveclean.host.worker import Worker, WorkerError

    fs = pcibind.Sysfs()
    if not (fs.root / "drivers" / "vfio-pci").is_dir():
        with contextlib.suppress(OSError):
            subprocess.run(["modprobe", "vfio-pci"], check=False)
    if not (fs.root / "drivers" / "vfio-pci").is_dir():
        return fail("no vfio-pci driver here (modprobe vfio-pci did not load one)")
    try:
        before = {fn: fs.driver(fn) for fn in fs.group(addr)}
    except pcibind.BindError as exc:
        return fail(str(exc))
    with Worker() as wk:
        try:
            got = wk.call(pcibind.w_bind, fs, addr, timeout=timeout, what="bind")
        except WorkerError as exc:
            return fail(f"the hand-off did not finish in {timeout:g} s (held?): {exc}")
        if isinstance(got, str):
            print(f"FAILED: hand-off: {got}")
            return 1
        on_vfio = {fn: fs.driver(fn) for fn in before}
        left = wk.call(pcibind.w_give_back, fs, got, timeout=timeout, what="give back")
    after = {fn: fs.driver(fn) for fn in before}
    rows = [(fn, before[fn], on_vfio[fn], after[fn]) for fn in before]
    print(f"{'function':<14} {'before':<14} {'handed over':<14} after")
    for r in rows:
        print(f"{r[0]:<14} {r[1] or '-':<14} {r[2] or '-':<14} {r[3] or '-'}")
    ok_ = (all(v == "vfio-pci" for v in on_vfio.values()) and after == before and not left)
    print("PASSED" if ok_ else f"FAILED: {'; '.join(left) or 'drivers differ'}")
    return 0 if ok_ else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--vmid", type=int, default=999_999_129)
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--deadline", type=float, default=30.0)
    ap.add_argument("--tolerance-mib", type=int, default=256)
    ap.add_argument("--devices", default="/dev/nvidia*", help="glob of the GPU device nodes")
    ap.add_argument("--fake-nvml", metavar="LIB",
                    help="test mode without a GPU: the lab's fake libnvidia-ml.so.1 (its state "
                         "file beside it) and fake nodes from --devices")
    ap.add_argument("--rebind", metavar="PCI_ADDRESS",
                    help="instead: hand this spare GPU's IOMMU group to vfio-pci and back, as "
                         "vm_gpu_rebind does (takes the GPU from the nvidia driver)")
    ap.add_argument("--handoff-view", action="store_true",
                    help="instead: read-only, each NVIDIA GPU's IOMMU group, drivers and "
                         "persistence mode as the VM hook reads them (changes nothing)")
    import release_check  # tests/gpu/release_check.py, beside this script (issue 38)

    release_check.add_options(ap)
    args = ap.parse_args()
    if args.handoff_view:
        import handoff_view

        return int(handoff_view.main(args.fake_nvml))
    if args.rebind:
        return rebind_check(args.rebind.lower(), args.deadline)
    global FAKE_NVML
    if args.fake_nvml:
        FAKE_NVML = str(Path(args.fake_nvml).resolve())
        args.fake_nvml = FAKE_NVML
        gpuplumb.fake_node(args.devices)
    if args.release_only or args.release:
        why = preflight()
        if why:
            return fail(why)
    code = 0 if args.release_only else run(args)
    if args.release or args.release_only:
        code = max(code, release_check.main_release(args))
    return code


if __name__ == "__main__":
    sys.exit(main())
