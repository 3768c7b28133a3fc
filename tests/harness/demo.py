"""`make demo`: the seeds' situation in a real container "129", then `pveclean ct 129`."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from . import pvesh
from .lxclab import Lab, LabUnavailable, cgroup2_root
from .scenarios import seeds


def show(lab: Lab, *args: str) -> int:
    """Run pveclean as an admin would (the lab's pct and pvesh first on PATH) and print it."""
    env = lab.env()
    env["PATH"] = f"{lab.root / 'bin'}:{env['PATH']}"
    print(f"\n== pveclean {' '.join(args)}")
    r = lab.pveclean(*args, env=env)
    print(r.stdout + r.stderr, end="")
    return r.returncode


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="pveclean-demo-", dir="/tmp"))
    try:
        lab = Lab.create(root)
    except LabUnavailable as exc:
        print(f"demo: the lab cannot run here: {exc}", file=sys.stderr)
        return 2
    vmid = 129
    if (cgroup2_root() / "lxc" / str(vmid)).exists():
        print("demo: cgroup lxc/129 exists on this host; refusing to touch it", file=sys.stderr)
        return 2
    try:
        print(f"== lab in {root}: container {vmid} (busybox, Proxmox cgroup layout), "
              "another container 130 and a host GPU user")
        s = seeds(lab, vmid, other_vmid=130)
        print("== the seeds' situation, as the host sees it:")
        for w in s.targets() + s.bystanders():
            for pid in w.host_pids(lab):
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                where = "host" if w.vmid is None else f"CT {w.vmid}"
                print(f"   {where:7} host PID {pid:<7} {name}")
        pvesh.install(lab.root)
        show(lab, "install", str(vmid), "--enable-snippets")
        show(lab, "status")
        show(lab, "ct", str(vmid), "--dry-run")
        code = show(lab, "ct", str(vmid))
        print(f"(exit {code})")
        show(lab, "reports")
        left = [pid for w in s.targets() for pid in w.host_pids(lab) if lab.alive(pid)]
        alive = [pid for w in s.bystanders() for pid in w.host_pids(lab) if lab.alive(pid)]
        print(f"\n== afterwards: {len(left)} holder(s) of CT {vmid} left; "
              f"{len(alive)} bystander(s) (unrelated python3, CT 130's worker, host daemon) alive")
        reports = sorted(lab.report_dir.glob(f"{vmid}-manual-*.yaml"))
        if reports:
            print(f"\n== report {reports[-1].name}:")
            print(reports[-1].read_text())
        return 0 if code == 0 and not left and len(alive) == 3 else 1
    finally:
        lab.destroy()


if __name__ == "__main__":
    sys.exit(main())
