"""Living within the unit: the drop-in's runs say everything in the journal (never on the
unit's stdout, which is null, nor its stderr, lxc-start's error log), end within the unit's
start limit, and do not repeat a check the hookscript's pre-start just made."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pveclean.host.cgroupfs import PARKING
from tests.harness import pct as pct_harness
from tests.harness.hangfs import HangFs
from tests.harness.lxclab import Lab, cgroup2_root
from tests.helpers import pveclean, reports, wait_for


@contextmanager
def journal(lab: Lab) -> Iterator[list[bytes]]:
    """A journald stand-in: the datagrams sent to the config's journal_socket."""
    path = lab.root / "journal.socket"
    got: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.setblocking(False)
        yield got
        while True:
            try:
                got.append(sock.recv(1 << 17))
            except BlockingIOError:
                break


def with_dropin_only(lab: Lab, vmid: int, **config: object) -> Path:
    """install --systemd, then the hookscript taken off again: only the drop-in acts."""
    units = lab.root / "etc/systemd/system"
    lab.write_config(state_dir=str(lab.root / "state"), systemd_dir=str(units),
                     journal_socket=str(lab.root / "journal.socket"), **config)
    res = pveclean(lab, "install", str(vmid), "--enable-snippets", "--systemd")
    assert res.returncode == 0, res.stderr
    lab.pct("set", str(vmid), "--delete", "hookscript")
    return units


def leftover(lab: Lab, vmid: int, **holder: object) -> list[int]:
    """A GPU holder of the container's earlier run, left in its cgroup after the stop."""
    lab.pct("stop", str(vmid))
    wait_for(lambda: bool(reports(lab, vmid, "post-stop")), 5)
    monitor = lab.cgroup(vmid).parent.parent / "lxc.monitor" / str(vmid) / "cgroup.procs"
    wait_for(lambda: not monitor.exists() or not monitor.read_text().strip(), 5)
    pct_harness.wait_unit_inactive(pct_harness.Lab(lab.root), str(vmid))  # its stop-post ran
    w = lab.run_on_host("python3", hold=[str(lab.nodes["nvidia0"])], pidns=True,
                        cgroup=lab.cgroup(vmid) / "ns", **holder)  # type: ignore[arg-type]
    return [p for p in w.host_pids(lab) if w.popen is None or p != w.popen.pid]


def test_a_refusal_through_the_dropin_is_said_in_the_journal(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, gpus=(0,))
    with_dropin_only(host, vmid, pre_start_policy="refuse", grace_seconds=0.5,
                     deadline_seconds=3)
    stuck = host.make_unkillable(leftover(host, vmid))
    try:
        with journal(host) as said:
            res = host.pct("start", str(vmid), check=False)
    finally:
        host.thaw(stuck)
    assert res.returncode != 0
    text = b"\n".join(said).decode()
    assert f"CT {vmid} pre-start: refusing to start" in text
    assert "SYSLOG_IDENTIFIER=pveclean" in text and "PVECLEAN_PHASE=unit start-pre" in text
    err = pct_harness.stderr_file(host, vmid)
    assert "pveclean" not in (err.read_text(errors="replace") if err.exists() else "")


def test_start_pre_ends_within_the_units_start_limit(host: Lab, vmid: int) -> None:
    """systemd kills ExecStartPre= at TimeoutStartSec= (90 s by default, 9 s here, scaled)
    and fails the start; the drop-in's run is bound below it, whatever the config's
    deadline, so a holder that ignores SIGTERM still ends in time and the start goes on."""
    (host.root / "etc/systemd").mkdir(parents=True, exist_ok=True)
    (host.root / "etc/systemd/system.conf").write_text("[Manager]\nDefaultTimeoutStartSec=9s\n")
    host.create_ct(vmid, gpus=(0,))
    with_dropin_only(host, vmid, unit_start_timeout_seconds=9, deadline_seconds=30,
                     grace_seconds=3)
    pids = leftover(host, vmid, ignore_term=True)
    with journal(host) as said:
        res = host.pct("start", str(vmid), check=False)
    assert res.returncode == 0, res.stderr
    assert not any(host.alive(p) for p in pids)
    assert any(b"stopped 1 leftover GPU holder" in m for m in said), said


def test_start_pre_does_not_repeat_the_hooks_pre_start(host: Lab, vmid: int) -> None:
    """vm_start runs the hookscript's pre-start, then starts the unit: one check, one report
    per start, also when pre-start only warned about a leftover it could not stop."""
    host.create_ct(vmid, gpus=(0,))
    units = host.root / "etc/systemd/system"
    host.write_config(state_dir=str(host.root / "state"), systemd_dir=str(units),
                      journal_socket=str(host.root / "journal.socket"), grace_seconds=0.5,
                      deadline_seconds=3)
    assert pveclean(host, "install", str(vmid), "--enable-snippets",
                    "--systemd").returncode == 0
    stuck = host.make_unkillable(leftover(host, vmid))
    try:
        with journal(host) as said:
            res = host.pct("start", str(vmid), check=False)
    finally:
        host.thaw(stuck)
    assert "pre-start: 1 leftover process(es) still hold GPUs" in res.stdout, res.stdout
    assert len(reports(host, vmid, "pre-start")) == 1
    assert not any(b"pre-start" in m for m in said), said


def test_pct_start_debug_runs_the_debug_units_dropin(host: Lab, vmid: int) -> None:
    """`pct start --debug` starts pve-container-debug@<vmid>.service: its drop-in runs too."""
    host.create_ct(vmid, gpus=(0,))
    with_dropin_only(host, vmid, grace_seconds=0.5)
    pids = leftover(host, vmid)
    assert (host.root / "etc/systemd/system" / f"pve-container-debug@{vmid}.service.d"
            / "pveclean.conf").is_file()
    with journal(host):
        host.pct("start", str(vmid), "--debug")
    assert not any(host.alive(p) for p in pids)
    (pre,) = reports(host, vmid, "pre-start")
    assert "pve-container-debug@" in pre["via"]


def test_a_worker_stuck_in_the_driver_does_not_hold_the_unit_stopping(
        host: Lab, vmid: int, hangfs: HangFs) -> None:
    """After ExecStopPost= systemd SIGKILLs what is left in the unit's cgroup and waits for
    it to empty, up to TimeoutStopSec= (120 s; 20 s here), then fails the unit. An NVML
    worker stuck in the driver outlives SIGKILL: pveclean parks each worker it gave up on
    outside its cgroup, so the unit stops at once, and the worker dies when the driver lets
    it go."""
    assert host.nvml is not None
    host.create_ct(vmid, gpus=(0,), start=False)
    units = with_dropin_only(host, vmid, deadline_seconds=3)
    limit = units / f"pve-container@{vmid}.service.d" / "zz-lab.conf"
    limit.parent.mkdir(parents=True, exist_ok=True)
    limit.write_text("[Service]\nTimeoutStopSec=20s\n")
    host.pct("start", str(vmid))
    host.nvml.stuck(hangfs.file)
    hangfs.hang()
    parking = cgroup2_root() / PARKING / "cgroup.procs"
    before = set(parking.read_text().split()) if parking.exists() else set()
    with journal(host):
        t0 = time.monotonic()
        host.pct("stop", str(vmid))
        stand_in = pct_harness.Lab(host.root)
        pct_harness.wait_unit_inactive(stand_in, str(vmid), timeout=40)
        took = time.monotonic() - t0
    log = (host.root / "lxc" / str(vmid) / "unit.log").read_text(errors="replace")
    assert pct_harness.unit_state(stand_in, str(vmid)) == "inactive", log
    assert "cgroup empty after final SIGKILL" in log, log
    assert took < 3 + 8, (took, log)  # the run's deadline, start-up and the stop; not 20 s
    stuck = [int(p) for p in set(parking.read_text().split()) - before]
    # its main thread a zombie by now (no command line): the name it was forked with
    assert stuck and all(Path(f"/proc/{p}/comm").read_text().strip() == "pveclean"
                         for p in stuck), stuck
    (post,) = reports(host, vmid, "post-stop")
    assert "nvml" in str(post["sources"]).lower(), post["sources"]
    hangfs.close()  # the "driver" lets go: the parked worker ends where it is
    assert wait_for(lambda: not any(host.alive(p) for p in stuck), 10), stuck
    host.nvml.stuck(None)
