"""Soak: many `pct start` / `pct stop` cycles of one lab container with the hook installed,
holders of every kind, and faults injected along the way (issue 13).

Each cycle starts the container (with a killable leftover of the previous run in some
cycles, under `pre_start_policy: refuse`), starts holders of one kind (SIGTERM-ignoring,
respawning, frozen, deep cgroup, mapping-only) beside a plain one, injects one fault (report
dir on a full tmpfs, NVML absent, NVML hanging, `pct exec` hanging, the container's shell
flooding output, a manual and a dry run racing the stop), then stops the container.

It counts what must never happen: a start refused wrongly, a stop that left a killable holder,
a run with neither a report nor the report on stderr plus a syslog line, a lock still held or a
cgroup left after a cycle, a pveclean process left behind; and the longest hook against its
deadline.

    make soak                          # 100 cycles
    python -m tests.soak --cycles 20   # fewer
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pveclean.proxmox.hookscript import stamp
from tests.harness.lxclab import REPO, Lab, cgroup2_root

KINDS = ("sigterm-ignoring", "respawning", "frozen", "deep", "mapping-only")
FAULTS = ("none", "report-dir-full", "nvml-absent", "nvml-hanging", "pct-exec-hanging",
          "shell-flooding", "concurrent-runs", "leftover-refuse")
DEADLINE = 3.0
GRACE = 0.3


@dataclass
class Figures:
    cycles: int = 0
    starts_refused_wrongly: int = 0
    stops_leaving_killable_holder: int = 0
    runs_without_report: int = 0
    locks_leaked: int = 0
    cgroups_leaked: int = 0
    processes_leaked: int = 0
    longest_hook_s: float = 0.0
    longest_hook_phase: str = ""
    deadline_s: float = DEADLINE
    hook_runs: int = 0
    reports_on_stderr: int = 0  # the report dir was full: report on stderr + a syslog line
    faults: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def failures(self) -> int:
        return (self.starts_refused_wrongly + self.stops_leaving_killable_holder
                + self.runs_without_report + self.locks_leaked + self.cgroups_leaked
                + self.processes_leaked)

    def table(self) -> str:
        rows = [
            ("cycles run", str(self.cycles)),
            ("hook runs timed", str(self.hook_runs)),
            ("starts refused wrongly", str(self.starts_refused_wrongly)),
            ("stops that left a killable holder", str(self.stops_leaving_killable_holder)),
            ("runs with neither a report nor the report on stderr + a syslog line",
             str(self.runs_without_report)),
            ("pre-stop reports on stderr + syslog (report dir full)",
             str(self.reports_on_stderr)),
            ("longest hook (wall, shim included) / deadline",
             f"{self.longest_hook_s:.2f} s ({self.longest_hook_phase}) / {self.deadline_s:.0f} s"),
            ("lock files still held after a cycle", str(self.locks_leaked)),
            ("cgroups leaked", str(self.cgroups_leaked)),
            ("pveclean processes left behind", str(self.processes_leaked)),
            ("faults injected", ", ".join(f"{k} x{v}" for k, v in sorted(self.faults.items()))),
        ]
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


class Soak:
    def __init__(self, lab: Lab, vmid: int) -> None:
        self.lab, self.vmid = lab, vmid
        self.fig = Figures()
        self.timing = lab.root / "hook-timing.log"
        self.syslog_path = lab.root / "syslog.sock"
        self.syslog = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.syslog.bind(str(self.syslog_path))
        self.syslog.setblocking(False)
        self.syslog_lines: list[str] = []
        self.tmpfs = lab.root / "fullfs"
        self.bin = lab.root / "soakbin"
        self.bin.mkdir()
        real = lab.pct_path
        self._script("pct-exec-hangs", f'[ "$1" = exec ] && exec sleep 3600\nexec "{real}" "$@"\n')
        self._script("pct-exec-floods",
                     '[ "$1" = exec ] && { yes "map 1 /dev/nvidia0 ....................." '
                     f'| head -c 30000000; exit 0; }}\nexec "{real}" "$@"\n')

    def _script(self, name: str, body: str) -> Path:
        p = self.bin / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(0o755)
        return p

    def install(self) -> None:
        """The stamped shim behind a wrapper that logs each phase's wall time and exit code."""
        lab = self.lab
        exe = Path(sys.executable).parent / "pveclean"
        shim = lab.snippets / "pveclean-hook"
        shim.write_text(stamp((REPO / "hookscripts/pveclean-hook").read_text(), str(exe),
                              str(lab.config_path)))
        shim.chmod(0o755)
        timed = lab.snippets / "soak-hook"
        timed.write_text(
            "#!/bin/sh\n"
            "t0=$(date +%s%N)\n"
            f'"{shim}" "$@"\nrc=$?\n'
            "t1=$(date +%s%N)\n"
            f'echo "$1 $2 $rc $(( (t1 - t0) / 1000000 ))" >> "{self.timing}"\n'
            "exit $rc\n")
        timed.chmod(0o755)
        lab.pct("set", str(self.vmid), "--hookscript", "local:snippets/soak-hook")

    def config(self, fault: str, **extra: object) -> None:
        over: dict[str, object] = {"grace_seconds": GRACE, "deadline_seconds": DEADLINE,
                                   "lock_wait_seconds": 1, "syslog": True,
                                   "syslog_socket": str(self.syslog_path),
                                   # every pre-stop leaves its record, one that found
                                   # nothing (a racing manual run was first) too
                                   "report_nothing_to_do": True}
        if fault == "report-dir-full":
            over["report_dir"] = str(self.tmpfs)
        elif fault == "nvml-absent":
            over["nvml_library"] = str(self.lab.root / "no-such" / "libnvidia-ml.so.1")
        elif fault == "pct-exec-hanging":
            over["pct_command"] = str(self.bin / "pct-exec-hangs")
        elif fault == "shell-flooding":
            over["pct_command"] = str(self.bin / "pct-exec-floods")
        elif fault == "leftover-refuse":
            over["pre_start_policy"] = "refuse"
        over.update(extra)
        self.lab.write_config(**over)

    def fill_tmpfs(self) -> None:
        self.tmpfs.mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "soakfull",
                        str(self.tmpfs)], check=True)
        with open(self.tmpfs / "filler", "wb") as fh, contextlib.suppress(OSError):
            fh.write(b"x" * (1 << 20))

    def unmount_tmpfs(self) -> None:
        subprocess.run(["umount", "-l", str(self.tmpfs)], check=False, capture_output=True)

    def drain_syslog(self) -> None:
        while True:
            try:
                self.syslog_lines.append(self.syslog.recv(65536).decode(errors="replace"))
            except BlockingIOError:
                return

    def holders(self, kind: str) -> list[int]:
        lab, vmid = self.lab, self.vmid
        ws = [lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 1000})]
        if kind == "sigterm-ignoring":
            ws.append(lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidia1"],
                                    ignore_term=True, gpu_mib={1: 500}))
        elif kind == "respawning":
            ws.append(lab.run_in_ct(vmid, "supervisor", hold=["/dev/nvidia1"], respawn=2))
        elif kind == "frozen":
            ws.append(lab.run_in_ct(vmid, "frozen-worker", hold=["/dev/nvidia1"],
                                    cgroup="frozen"))
            lab.freeze(lab.cgroup(vmid) / "ns" / "frozen")
        elif kind == "deep":
            ws.append(lab.run_in_ct(vmid, "deep-worker", hold=["/dev/nvidia1"],
                                    cgroup="a/b/c/d"))
        elif kind == "mapping-only":
            ws.append(lab.run_in_ct(vmid, "uvm-mapper", maps=["/dev/nvidia-uvm"]))
        return [p for w in ws for p in w.host_pids(lab)]

    def leftover(self) -> list[int]:
        """A killable GPU holder of 'the earlier run' left in the stopped container's tree."""
        lab = self.lab
        w = lab.run_on_host("python3", hold=[str(lab.nodes["nvidia0"])], pidns=True,
                            cgroup=lab.cgroup(self.vmid) / "ns")
        return [p for p in w.host_pids(lab) if w.popen is None or p != w.popen.pid]

    def reports(self, phase: str) -> set[str]:
        return {p.name for p in self.lab.report_dir.glob(f"{self.vmid}-{phase}-*.yaml")}

    def pveclean_procs(self) -> list[int]:
        exe = str(Path(sys.executable).parent / "pveclean")
        out = []
        for pid in self.lab.all_pids():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if len(cmd) > 1 and cmd[1].decode(errors="replace") == exe and \
                        str(self.vmid).encode() in b" ".join(cmd):
                    out.append(pid)
        return out

    def cycle(self, i: int) -> None:
        lab, vmid, fig = self.lab, self.vmid, self.fig
        kind, fault = KINDS[i % len(KINDS)], FAULTS[i % len(FAULTS)]
        fig.faults[fault] = fig.faults.get(fault, 0) + 1
        self.config(fault)
        left: list[int] = []
        if fault == "leftover-refuse":
            left = self.leftover()
        if fault == "report-dir-full":
            self.fill_tmpfs()
        try:
            res = lab.pct("start", str(vmid), check=False)
            if res.returncode != 0 or lab.pct("status", str(vmid)).stdout != "status: running\n":
                fig.starts_refused_wrongly += 1
                fig.notes.append(f"cycle {i} ({kind}, {fault}): start failed: "
                                 f"{(res.stdout + res.stderr).strip()[-300:]}")
                return
            if any(lab.alive(p) for p in left):
                fig.stops_leaving_killable_holder += 1
                fig.notes.append(f"cycle {i}: the pre-start left a killable leftover")
            pids = self.holders(kind)
            if fault == "nvml-hanging":
                assert lab.nvml is not None
                lab.nvml.hang(60)
            racers: list[subprocess.Popen[bytes]] = []
            if fault == "concurrent-runs":
                exe = str(Path(sys.executable).parent / "pveclean")
                for args in (["ct", str(vmid), "--dry-run"], ["ct", str(vmid)]):
                    racers.append(subprocess.Popen([exe, *args], env=lab.env(),
                                                   stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL))
            before = self.reports("pre-stop")
            self.drain_syslog()
            n_syslog = len(self.syslog_lines)
            res = lab.pct("stop", str(vmid), check=False, timeout=120)
            for r in racers:
                r.wait(60)
            if lab.nvml is not None:
                lab.nvml.hang(None)
            # every pre-stop run leaves a report, or its report on stderr and a syslog line
            self.drain_syslog()
            new_syslog = [ln for ln in self.syslog_lines[n_syslog:]
                          if f"vmid={vmid} phase=pre-stop" in ln]
            on_stderr = "--- pveclean report (not saved) ---" in res.stderr and new_syslog
            fig.reports_on_stderr += bool(on_stderr)
            if not (self.reports("pre-stop") - before) and not on_stderr:
                fig.runs_without_report += 1
                fig.notes.append(f"cycle {i} ({kind}, {fault}): no pre-stop report: "
                                 f"{res.stdout.strip()[-300:]} {res.stderr.strip()[-300:]}")
            # pct stop kills what is in the container anyway: the pre-stop report says
            # whether pveclean left a killable holder (one not stuck in the kernel)
            alive = [p for p in pids if lab.alive(p)]
            if alive:
                fig.stops_leaving_killable_holder += 1
                fig.notes.append(f"cycle {i} ({kind}, {fault}): alive after stop: {alive}")
            self._check_pre_stop_report(i, kind, fault, before)
        finally:
            if lab.nvml is not None:
                lab.nvml.hang(None)
            with contextlib.suppress(OSError):
                lab.freeze(lab.cgroup(vmid) / "ns" / "frozen", False)
            if lab.pct("status", str(vmid)).stdout == "status: running\n":
                lab.pct("stop", str(vmid), check=False, timeout=120)
            if fault == "report-dir-full":
                self.unmount_tmpfs()
            self._check_leaks(i)
            fig.cycles += 1

    def _check_pre_stop_report(self, i: int, kind: str, fault: str, before: set[str]) -> None:
        import yaml

        for name in sorted(self.reports("pre-stop") - before):
            rep = yaml.safe_load((self.lab.report_dir / name).read_text())
            stuck = [h for h in rep.get("holders", []) if h.get("outcome") == "survived"
                     and "D" not in str(h.get("state"))]
            if stuck and fault != "concurrent-runs":
                self.fig.stops_leaving_killable_holder += 1
                self.fig.notes.append(f"cycle {i} ({kind}, {fault}): {name}: survived: "
                                      f"{[(h['host_pid'], h['state']) for h in stuck]}")

    def _check_leaks(self, i: int) -> None:
        lab, vmid, fig = self.lab, self.vmid, self.fig
        lock = lab.root / "state" / "locks" / f"{vmid}.lock"
        if lock.exists():
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fig.locks_leaked += 1
                fig.notes.append(f"cycle {i}: lock still held: {lock.read_text().strip()}")
            finally:
                os.close(fd)
        cg = cgroup2_root() / "lxc" / str(vmid)
        if cg.exists():
            # the next start's pre-start removes empty leftovers; a non-empty one is a leak
            procs = lab.tree_pids(vmid)
            if procs:
                fig.cgroups_leaked += 1
                fig.notes.append(f"cycle {i}: cgroup lxc/{vmid} still has {procs}")
        end = time.monotonic() + 2
        while self.pveclean_procs() and time.monotonic() < end:
            time.sleep(0.05)
        left = self.pveclean_procs()
        if left:
            fig.processes_leaked += len(left)
            fig.notes.append(f"cycle {i}: pveclean processes left: {left}")

    def timings(self) -> None:
        if not self.timing.exists():
            return
        for line in self.timing.read_text().splitlines():
            parts = line.split()
            if len(parts) != 4:
                continue
            _vmid, phase, _rc, ms = parts
            self.fig.hook_runs += 1
            if int(ms) / 1000 > self.fig.longest_hook_s:
                self.fig.longest_hook_s, self.fig.longest_hook_phase = int(ms) / 1000, phase

    def close(self) -> None:
        self.unmount_tmpfs()
        self.syslog.close()


def free_vmid() -> int:
    base = 990100 + (os.getpid() % 100) * 3
    for vmid in range(base, base + 300):
        if not (cgroup2_root() / "lxc" / str(vmid)).exists():
            return vmid
    raise RuntimeError("no free VMID for the soak")


def run(cycles: int, lab: Lab | None = None, vmid: int | None = None,
        progress: bool = False) -> Figures:
    own = lab is None
    if lab is None:
        lab = Lab.create(Path(tempfile.mkdtemp(prefix="pveclean-soak-", dir="/tmp")))
    vmid = vmid or free_vmid()
    soak = Soak(lab, vmid)
    try:
        soak.config("none")
        lab.create_ct(vmid, gpus=(0, 1), start=False)
        soak.install()
        t0 = time.monotonic()
        for i in range(cycles):
            soak.cycle(i)
            if progress and (i + 1) % 10 == 0:
                print(f"soak: {i + 1}/{cycles} cycles, {time.monotonic() - t0:.0f} s, "
                      f"{soak.fig.failures()} failure(s)", file=sys.stderr)
        soak.timings()
        return soak.fig
    finally:
        soak.close()
        if own:
            lab.destroy()
            shutil.rmtree(lab.root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=100)
    args = ap.parse_args()
    t0 = time.monotonic()
    fig = run(args.cycles, progress=True)
    print(f"pveclean soak: {fig.cycles} cycles in {time.monotonic() - t0:.0f} s")
    print(fig.table())
    for note in fig.notes[:20]:
        print(f"  note: {note}")
    ok = fig.failures() == 0 and fig.longest_hook_s <= DEADLINE + 1.5
    print("soak: PASSED" if ok else "soak: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
