"""Trust, round three (issue 39), the bounds of a whole run on lab containers: `--stop-units`
with units the tenant fills with empty cgroups ends within its deadline and reports the time
it really took; a run over 2,000 holders with long strings stays under 100 MB."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from tests.harness import fakesystemd as labsd
from tests.harness.lxclab import Lab
from tests.helpers import run_json

UNITS = 10
EMPTY = 10_000  # empty child cgroups per unit: the size, made in about 3 s
DEADLINE = 8.0  # the stop's half (~3.7 s) holds the padding; the walks are past it

# The tenant's own `systemctl` (the container's systemd is the tenant's): asked to stop the
# units, it stops nothing and says it did (exit 0), after filling each unit with EMPTY empty
# child cgroups (cgpad, mkdir(2) at its own pace): made after discovery (whose walk has a cap
# of 10,000 cgroups for the whole container), met by every later walk of the units' trees:
# judging the stop, watching for restarts after the holders are signalled, the hints.
PADDING_SYSTEMCTL = f"""#!/bin/sh
[ "$1" = stop ] || exec /usr/bin/systemctl.lab "$@"
cut -d" " -f1 /proc/uptime > /run/padded
for u in "$@"; do
    case $u in *.service) /opt/lab/bin/cgpad /sys/fs/cgroup/system.slice/$u {EMPTY};; esac
    cut -d" " -f1 /proc/uptime >> /run/padded
done
"""


def _empty(unit_dir: Path) -> int:
    n = 0
    for d in unit_dir.glob("e*"):
        with contextlib.suppress(OSError):
            d.rmdir()
            n += 1
    return n


def test_stop_units_over_units_full_of_empty_cgroups_keeps_its_deadline(lab: Lab,
                                                                       vmid: int) -> None:
    """10 services, each given 10,000 empty child cgroups by the tenant's systemctl as it
    "stops" them: every walk of a unit's tree (judging the stop, watching for restarts, the
    hints) takes its time from the run's one deadline, and the report's duration is the wall
    time measured here, outside the process. With the walks unbounded: 11.4 s against 8 s;
    with the duration taken before the walks: 5.4 s reported for 8.4 s (the issue: 9.2-9.8 s
    against 6 s, reported as 5.6 s)."""
    lab.write_config(deadline_seconds=DEADLINE)
    lab.create_ct(vmid, gpus=(0,))
    labsd.install_systemd(lab, vmid)
    bin_dir = lab.rootfs(vmid) / "usr/bin"
    (bin_dir / "systemctl").rename(bin_dir / "systemctl.lab")
    (bin_dir / "systemctl").write_text(PADDING_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    units = [f"gpu-worker{i}.service" for i in range(UNITS)]
    for unit in units:
        labsd.add_unit(lab, vmid, unit, "python3", hold=["/dev/nvidia0"], restart="no")
    slice_dir = lab.cgroup(vmid) / "ns" / "system.slice"
    try:
        t0 = time.monotonic()
        _code, rep = run_json(lab, vmid, "--stop-units")
        wall = time.monotonic() - t0
    finally:
        made = sum(_empty(slice_dir / unit) for unit in units)
    padded = (lab.rootfs(vmid) / "run/padded").read_text().split()
    print(f"\npadding took {[round(float(t) - float(padded[0]), 2) for t in padded]} s")
    print(f"{made} empty cgroups; run: wall {wall:.2f} s, duration_s {rep['duration_s']}, "
          f"verdict {rep['verdict']}, units {[u['action'] for u in rep['unit_stops']['units']]}")
    assert made == UNITS * EMPTY  # the tenant's tree was there when the run walked it
    assert [u["unit"] for u in rep["unit_stops"]["units"]] == units, rep["unit_stops"]
    # nothing was stopped: a walk cut short counts nothing, never `stopped`
    assert "stopped" not in {u["action"] for u in rep["unit_stops"]["units"]}, rep
    # + start-up and exit of the process (0.3 s here; unbounded walks: 11.4 s)
    assert wall < DEADLINE + 1.5, (wall, rep)
    assert abs(wall - rep["duration_s"]) < 1.5, (wall, rep["duration_s"])  # before: 3 s off


HOLDERS = 2_000
LONG = 3_700  # characters (at least) of each long path: exe, cgroup, each device path
MAX_RSS_MB = 100.0


def _long_dir(top: Path, levels: int = 15, name_len: int = 250) -> Path:
    d = top
    for level in range(levels):
        d = d / (chr(ord("a") + level % 26) * name_len)
    return d


def long_holders(lab: Lab, vmid: int) -> list[int]:
    """HOLDERS pathfan processes in a new container, with long exe, argv, cgroup and device
    paths; their host PIDs."""
    from tests.harness.lxclab import Workload

    lab.write_config(deadline_seconds=20, grace_seconds=1.0)
    lab.create_ct(vmid, gpus=(0,))
    root = lab.rootfs(vmid)
    exe_dir = _long_dir(Path("/opt"))
    (root / exe_dir.relative_to("/")).mkdir(parents=True)
    exe = exe_dir / "pathfan"
    (root / exe.relative_to("/")).write_bytes((root / "opt/lab/bin/pathfan").read_bytes())
    (root / exe.relative_to("/")).chmod(0o755)
    chain = _long_dir(Path("/"), name_len=250)  # as the container sees it, below ns/
    (lab.cgroup(vmid) / "ns" / chain.relative_to("/")).mkdir(parents=True)
    tag, ready = lab.ct_holder(vmid, "pathfan", kind="x")
    pad = " ".join("'" + c * 4000 + "'" for c in "qrstuvwx")  # 32 KB of argv
    lab.pct("exec", str(vmid), "--", "/bin/sh", "-c",
            "grep -q ' /sys/fs/cgroup cgroup2 ' /proc/self/mounts || "
            "mount -t cgroup2 cgroup2 /sys/fs/cgroup; "
            f"'{exe}' --node /dev/nvidia0 --paths 8 --children {HOLDERS - 1} "
            f"--thread-cgroup '/sys/fs/cgroup{chain}' --ready {ready} --exit-after 900 "
            f"-- {pad} </dev/null >/dev/null 2>&1 &")
    w = Workload(vmid, tag, root / ready.lstrip("/"))
    lab.workloads.append(w)
    lab._wait_ready(w, 1)
    pids = w.host_pids(lab)
    assert len(pids) == HOLDERS
    assert len(os.readlink(f"/proc/{pids[-1]}/exe")) > LONG
    assert len(Path(f"/proc/{pids[-1]}/cmdline").read_bytes()) > 32_000
    assert len(Path(f"/proc/{pids[-1]}/cgroup").read_text()) > LONG
    return pids


def test_a_run_over_2000_holders_of_long_strings_stays_under_100_mb(lab: Lab,
                                                                    vmid: int) -> None:
    """2,000 holders (pathfan and 1,999 forks) run from an exe at a 3,800-character path with
    a 32 KB argv, in a cgroup 3,800 characters deep, each holding 8 GPU device paths of 3,800
    characters: the whole run (discovery, stop, verification, report), metered from a small
    parent as Proxmox spawns it, peaks under 100 MB: 57 MB. Each holder's strings are cut
    where they are read (the scan's worker), and past a few MB a scan's later holders are cut
    short (bounds.ReadBudget). With only each string cut to the report's caps (4,096
    characters, argv 8 KiB at read), as before: 160 MB (the issue: 139-144 MB)."""
    from tests.bench.discovery import pveclean_exe
    from tests.bench.measure import HOOK_ENV, spawn_like_proxmox

    pids = long_holders(lab, vmid)
    env = {**HOOK_ENV, "PVECLEAN_CONFIG": str(lab.config_path)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    report = lab.root / "run.json"
    run = spawn_like_proxmox([*pveclean_exe(), "ct", str(vmid), "--json"], lab.root, env)
    rss_mb = run.max_rss_kib * 1024 / 1e6
    print(f"\n{HOLDERS} holders of long strings: {run.seconds:.2f} s, peak RSS {rss_mb:.1f} MB, "
          f"exit {run.returncode}")
    rep = json.loads(run.output[run.output.index("{"):]) if "{" in run.output else {}
    report.write_text(run.output)
    assert rep["summary"]["holders"] >= HOLDERS, run.output[-2000:]
    assert not [p for p in pids if lab.alive(p)]
    assert rss_mb < MAX_RSS_MB, rss_mb
