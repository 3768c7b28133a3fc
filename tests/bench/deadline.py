"""How far past `deadline_seconds` a run ends, when the deadline is what ends it.

Scenarios (lab containers): a holder no signal can end (v1 freezer: state D, as a process
stuck in the GPU driver), a holder whose fd sits on a FUSE mount that stopped answering (the
scan must skip it), and NVML hanging in every call. For each: `pveclean ct` wall time (process
start-up included) and the report's own `duration_s`, against the deadline.

    python -m tests.bench.deadline [--runs 5] [--deadline 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.harness.hangfs import HangFs
from tests.harness.lxclab import Lab, cgroup2_root


def _vmid() -> int:
    for vmid in range(990700, 991000):
        if not (cgroup2_root() / "lxc" / str(vmid)).exists():
            return vmid
    raise RuntimeError("no free VMID")


def measure(lab: Lab, deadline: float, setup: Callable[[Lab, int], Callable[[], None]]
            ) -> tuple[float, float, str]:
    vmid = _vmid()
    lab.write_config(grace_seconds=0.5, deadline_seconds=deadline)
    lab.create_ct(vmid, gpus=(0, 1))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 100})
    undo = setup(lab, vmid)
    try:
        t0 = time.monotonic()
        r = lab.pveclean("ct", str(vmid), "--json")
        wall = time.monotonic() - t0
        rep = json.loads(r.stdout)
    finally:
        undo()
        lab.pct("stop", str(vmid), check=False)
    return wall, float(rep["duration_s"]), str(rep["verdict"])


def unkillable(lab: Lab, vmid: int) -> Callable[[], None]:
    w = lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidia1"], ignore_term=True)
    cg = lab.make_unkillable(w.host_pids(lab))
    return lambda: lab.thaw(cg)


def fuse(lab: Lab, vmid: int) -> Callable[[], None]:
    fs = HangFs(lab.root / f"fuse-{vmid}")
    lab.run_on_host("python3", hold=[str(lab.nodes["nvidia1"]), str(fs.file)], pidns=True,
                    cgroup=lab.cgroup(vmid) / "ns")
    fs.hang()
    return fs.close


def nvml(lab: Lab, vmid: int) -> Callable[[], None]:
    assert lab.nvml is not None
    lab.nvml.hang(120)
    return lambda: lab.nvml.hang(None) if lab.nvml else None


def many(lab: Lab, n: int, limit: str) -> tuple[float, dict[str, object]]:
    """`pveclean ct` on one container with n holders, under `ulimit` `limit`."""
    import subprocess

    vmid = _vmid()
    lab.write_config(grace_seconds=10, deadline_seconds=120)
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], children=n - 1)
    exe = str(Path(sys.executable).parent / "pveclean")
    t0 = time.monotonic()
    r = subprocess.run(["sh", "-c", f'ulimit {limit}; exec "$0" ct {vmid} --json', exe],
                       capture_output=True, text=True, env=lab.env(), timeout=300, check=False)
    wall = time.monotonic() - t0
    lab.pct("stop", str(vmid), check=False)
    return wall, json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--deadline", type=float, default=3.0)
    ap.add_argument("--holders", type=int, default=5000, help="for the many-holders rows")
    args = ap.parse_args()
    lab = Lab.create(Path(tempfile.mkdtemp(prefix="pveclean-deadline-", dir="/tmp")))
    try:
        for limit in ("-Sn 1024", "-n 1024"):
            wall, rep = many(lab, args.holders, limit)
            s = rep["summary"]
            print(f"{args.holders} holders, ulimit {limit}: verdict {rep['verdict']}, "
                  f"{s['holders']} found, outcomes {s['outcomes']}, {wall:.2f} s wall "
                  f"(duration_s {rep['duration_s']})")
        print(f"deadline_seconds: {args.deadline:g}; {args.runs} runs each; "
              "overshoot = time past the deadline (negative: ended before it)")
        print(f"{'scenario':<28} {'verdict':<9} {'duration_s - deadline':>24} "
              f"{'wall - deadline (start-up incl.)':>34}")
        for name, setup in (("unkillable holder (state D)", unkillable),
                            ("hung FUSE fd", fuse), ("NVML hangs in every call", nvml)):
            rows = [measure(lab, args.deadline, setup) for _ in range(args.runs)]
            over_d = [d - args.deadline for _w, d, _v in rows]
            over_w = [w - args.deadline for w, _d, _v in rows]
            d_txt = f"{statistics.median(over_d):+.3f} (max {max(over_d):+.3f}) s"
            w_txt = f"{statistics.median(over_w):+.3f} (max {max(over_w):+.3f}) s"
            verdicts = ",".join(sorted({v for _w, _d, v in rows}))
            print(f"{name:<28} {verdicts:<9} {d_txt:>24} {w_txt:>34}")
    finally:
        lab.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
