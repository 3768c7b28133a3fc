"""Bounded by construction (issue 13): reads that hang in the kernel run in a forked worker
that the run kills; read-only runs never hold up a cleanup; thousands of holders fit."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pveclean.host import worker
from pveclean.host.worker import RemoteError, Worker, WorkerError
from tests.harness.hangfs import HangFs
from tests.harness.lxclab import Lab
from tests.lab.test_hook import hook, reports

MARGIN = 1.0  # s: what a run may take past deadline_seconds (report writing, teardown)
START_UP = 1.0  # s: interpreter start-up of a `pveclean` process on a loaded test machine


# ---- the worker on its own --------------------------------------------------------------
def _add(a: int, b: int) -> int:
    return a + b


def _sleep_forever() -> None:
    while True:
        time.sleep(1)


def _stall_on_second() -> None:
    worker.note(("pid", 1), 5.0)
    worker.note(("pid", 2), 0.2)
    _sleep_forever()


def _big(n: int) -> bytes:
    return b"x" * n


def _raises() -> None:
    raise ValueError("bad value")


def _fds() -> list[int]:
    return sorted(int(x) for x in os.listdir("/proc/self/fd"))


def test_worker_answers_and_reports_errors() -> None:
    with Worker() as w:
        assert w.call(_add, 2, 3, timeout=5, what="add") == 5
        with pytest.raises(RemoteError, match="ValueError: bad value"):
            w.call(_raises, timeout=5, what="raise")
        assert w.call(_add, 1, 1, timeout=5, what="again") == 2
        assert w.started == 1


def test_worker_is_killed_at_the_deadline_and_replaced() -> None:
    with Worker() as w:
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match="did not finish in time"):
            w.call(_sleep_forever, timeout=0.3, what="sleep")
        assert time.monotonic() - t0 < 0.3 + 0.3
        assert w.killed and w.pid is None
        assert w.call(_add, 1, 2, timeout=5, what="after") == 3  # a fresh worker
        assert w.started == 2


def test_a_stall_names_what_the_worker_was_doing() -> None:
    with Worker() as w:
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as err:
            w.call(_stall_on_second, timeout=10, what="scan")
        assert err.value.stalled and err.value.note == ("pid", 2)
        assert time.monotonic() - t0 < 0.2 + 0.3


def _marks_then_hangs() -> None:
    for pid in (1, 2, 3):
        worker.mark(pid)
        time.sleep(0.05 if pid < 3 else 60)


def _marks_quickly(n: int) -> int:
    for pid in range(n):
        worker.mark(pid)
        time.sleep(0.01)
    return n


def test_marks_pin_a_stall_to_what_the_worker_was_on_without_a_message_each() -> None:
    with Worker(marks=True) as w:
        assert w.call(_marks_quickly, 60, timeout=10, what="scan") == 60  # 0.6 s, 60 marks
        w.send(_marks_quickly, 60, timeout=10, what="scan")
        assert w.receive(10, "scan", stall=0.2) == 60  # each mark well inside the stall
        t0 = time.monotonic()
        w.send(_marks_then_hangs, timeout=10, what="scan")
        with pytest.raises(WorkerError) as err:
            w.receive(10, "scan", stall=0.3)
        assert err.value.stalled and err.value.note == ("pid", 3)
        assert time.monotonic() - t0 < 1.5
        assert w.call(_marks_quickly, 2, timeout=10, what="scan") == 2  # a fresh worker


def test_an_answer_over_the_size_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "MAX_ANSWER", 1000)
    with Worker() as w, pytest.raises(WorkerError, match="over the 1000 bound"):
        w.call(_big, 5000, timeout=5, what="big")


def test_worker_keeps_no_inherited_fd(tmp_path: Path) -> None:
    """Above all not the container lock's: a worker stuck in the kernel must not keep it."""
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    with Worker() as w:
        fds = w.call(_fds, timeout=5, what="fds")
        os.close(lock)  # our copy gone: the lock must be free although the worker lives
        other = os.open(tmp_path / "lock", os.O_RDWR)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the worker kept it
        os.close(other)
    assert len(fds) == 6, fds  # stdio (on /dev/null), two pipe ends, listdir's own fd


def _mark(path: str) -> None:
    with open(path, "a", encoding="ascii") as fh:
        fh.write(f"{os.getpid()}\n")


def _stall_in_init() -> None:
    worker.note(("nvml", "init"), 0.2)
    _sleep_forever()


def test_a_prelude_runs_in_the_first_worker_only(tmp_path: Path) -> None:
    """prelude.py's start-up work: once, in the first child, never again after a kill."""
    marks = tmp_path / "marks"
    w = Worker(lambda: _mark(str(marks))).start()
    try:
        first = w.pid
        assert w.call(_add, 1, 2, timeout=5, what="add") == 3  # after the prelude ran
        assert marks.read_text().split() == [str(first)]
        with pytest.raises(WorkerError):
            w.call(_sleep_forever, timeout=0.2, what="sleep")
        assert w.call(_add, 2, 2, timeout=5, what="again") == 4 and w.started == 2
        assert marks.read_text().split() == [str(first)]
    finally:
        w.close()


def test_a_submitted_answer_is_read_past_and_its_stall_bounds_the_next_call() -> None:
    with Worker() as w:
        w.submit(_add, 1, 1, timeout=5, what="warm")
        w.submit(_raises, timeout=5, what="warm")  # nobody waits for it: not raised
        assert w.call(_add, 2, 3, timeout=5, what="add") == 5
        w.submit(_stall_in_init, timeout=5, what="warm")
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as err:
            w.call(_add, 1, 2, timeout=10, what="memory")
        assert err.value.stalled and err.value.note == ("nvml", "init")
        assert time.monotonic() - t0 < 0.2 + 0.3  # its note's allowance, not the call's 10 s
        assert w.call(_add, 1, 2, timeout=5, what="after") == 3  # a fresh worker, no debt


def _nap_and_add(a: int, b: int) -> int:
    time.sleep(0.3)
    return a + b


def _meet(mine: str, theirs: str) -> bool:
    """Leave a mark, then wait (at most 10 s) for the other worker's: True only when both
    ran at once."""
    Path(mine).touch()
    end = time.monotonic() + 10
    while not Path(theirs).exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def test_two_workers_work_at_once_and_answers_come_in_order(tmp_path: Path) -> None:
    """send() and receive(): the run's NVML worker lists GPU processes while the scan's
    worker walks /proc (discover.Reads). Each answer goes to the send it belongs to."""
    a_mark, b_mark = str(tmp_path / "a"), str(tmp_path / "b")
    with Worker() as a, Worker() as b:
        a.send(_meet, a_mark, b_mark, timeout=15, what="a1")
        a.send(_add, 2, 2, timeout=15, what="a2")
        b.send(_meet, b_mark, a_mark, timeout=15, what="b")
        assert b.receive(15, "b") is True  # each saw the other's mark: both at work at once
        assert (a.receive(15, "a1"), a.receive(15, "a2")) == (True, 4)


def test_a_forgotten_answer_is_read_past() -> None:
    with Worker() as w:
        w.send(_nap_and_add, 1, 1, timeout=5, what="not needed")
        w.forget()
        assert w.call(_add, 5, 5, timeout=5, what="add") == 10
        with pytest.raises(RuntimeError, match="without a send"):
            w.receive(1, "nothing")  # a bug of the caller: not a hang, nothing killed
        assert w.started == 1 and not w.killed


# ---- lab --------------------------------------------------------------------------------
def test_ct_on_a_stopped_container_never_touches_nvml(lab: Lab, vmid: int) -> None:
    """The worker inits NVML ahead of the run (prelude.py), but not for a stopped container
    with an empty cgroup tree: the run asks NVML nothing then, and its init may take seconds."""
    assert lab.nvml is not None
    lab.create_ct(vmid, gpus=(0,), start=False)
    lab.nvml.hang(20)
    for args in ((), ("--dry-run",)):
        code, rep, took = ct_json(lab, str(vmid), *args)
        assert code == 0 and took < 2 + START_UP, (took, rep)
        assert rep["sources"]["nvml"].startswith("not needed"), rep["sources"]


def ct_json(lab: Lab, *args: str) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    r = lab.pveclean("ct", *args, "--json")
    took = time.monotonic() - t0
    return r.returncode, json.loads(r.stdout), took


def test_dry_run_stuck_mid_run_never_blocks_a_cleanup(lab: Lab, vmid: int) -> None:
    """A dry run caught in the middle of its run (it has started its probe, so it is past
    where a lock would be taken) and held there: a cleanup meanwhile neither waits for it nor
    reports busy."""
    lab.write_config(grace_seconds=0.5, deadline_seconds=20)
    lab.create_ct(vmid, gpus=(0, 1))
    a = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 500})
    b = lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidia1"], ignore_term=True)
    pids = a.host_pids(lab) + b.host_pids(lab)
    lab.freeze(lab.cgroup(vmid) / "ns")  # the container's shell hangs: pct exec never returns
    dry = subprocess.Popen([str(Path(sys.executable).parent / "pveclean"), "ct", str(vmid),
                            "--dry-run", "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=lab.env(), text=True)
    children = Path(f"/proc/{dry.pid}/task/{dry.pid}/children")
    try:
        end = time.monotonic() + 20
        while not children.read_text().split() and time.monotonic() < end:
            time.sleep(0.005)  # until it has forked its probe (or its reader)
        os.kill(dry.pid, signal.SIGSTOP)  # held mid-run
        lab.freeze(lab.cgroup(vmid) / "ns", False)
        code, rep, took = ct_json(lab, str(vmid))
        assert dry.poll() is None, "the dry run was expected to be held mid-run"
    finally:
        lab.freeze(lab.cgroup(vmid) / "ns", False)
        os.kill(dry.pid, signal.SIGCONT)
        out, _err = dry.communicate(timeout=30)
    assert rep["verdict"] == "clean", rep["errors"]
    assert code == 0 and not any(lab.alive(p) for p in pids)
    assert took < 0.5 + 5  # it never waited for the dry run's lock: there is none
    assert json.loads(out)["verdict"] == "dry-run"


def test_status_and_dry_runs_take_no_lock(lab: Lab, vmid: int) -> None:
    from pveclean.host.lock import container_lock

    lab.write_config(lock_wait_seconds=0.2)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    with container_lock(str(lab.root / "state"), vmid, 1, "a cleanup"):
        code, rep, _took = ct_json(lab, str(vmid), "--dry-run")  # reads while a cleanup runs
    assert code == 0 and rep["verdict"] == "dry-run"
    assert [h["host_pid"] for h in rep["holders"]] == w.host_pids(lab)


def holds(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path)
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


@pytest.fixture
def hangfs(lab: Lab) -> Any:
    fs = HangFs(lab.root / "fuse")
    try:
        yield fs
    finally:
        fs.close()  # aborts the connection: every reader stuck on it goes on


def test_a_hung_fuse_fd_cannot_hang_pre_stop(lab: Lab, vmid: int, hangfs: HangFs) -> None:
    """A holder with an fd on a file system whose server stopped answering (a hard NFS
    mount whose server went away): stat() through its fd blocks, even past SIGKILL."""
    deadline = 4
    lab.write_config(grace_seconds=0.5, deadline_seconds=deadline)
    lab.create_ct(vmid, gpus=(0, 1))
    ok = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 300})
    wedged = lab.run_on_host("python3", hold=[str(lab.nodes["nvidia1"]), str(hangfs.file)],
                             pidns=True, cgroup=lab.cgroup(vmid) / "ns")
    (wpid,) = [p for p in wedged.host_pids(lab) if holds(p, hangfs.file)]
    lab.install_hook(vmid)
    hangfs.hang()
    t0 = time.monotonic()
    res = hook(lab, vmid, "pre-stop")  # returns only when every writer of its output is gone
    took = time.monotonic() - t0
    assert res.returncode == 0
    assert took < deadline + MARGIN + START_UP, took
    (pre,) = reports(lab, vmid, "pre-stop")
    assert pre["duration_s"] <= deadline + MARGIN
    assert pre["verdict"] == "residual"
    # The scan never stat()s the FUSE fd (its mount's type is read from fdinfo and mountinfo,
    # issue 12), so the wedged process is found by its GPU fd and signalled like any holder;
    # it then hangs in exit, closing the file the server no longer answers for. Whatever
    # hangs after that (its /proc, NVML, the verification) is cut at the deadline and said.
    wedged_h = [h for h in pre["holders"] if h["host_pid"] == wpid]
    assert (wedged_h and wedged_h[0]["outcome"] == "survived") or pre["errors"], pre
    assert not any(lab.alive(p) for p in ok.host_pids(lab))  # the others were cleaned
    assert f"pveclean: WARNING: CT {vmid} pre-stop" in res.stdout
    # the killed reader kept no lock: the next run is not `busy`
    _code, rep, _took = ct_json(lab, str(vmid), "--grace", "0")
    assert rep["verdict"] != "busy"


def test_report_dir_on_a_hung_mount_cannot_hang_a_run(lab: Lab, vmid: int,
                                                      hangfs: HangFs) -> None:
    deadline = 3
    lab.write_config(grace_seconds=0.5, deadline_seconds=deadline,
                     report_dir=str(hangfs.mountpoint / "reports"))
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    hangfs.hang()
    t0 = time.monotonic()
    r = lab.pveclean("ct", str(vmid))
    took = time.monotonic() - t0
    assert took < deadline + MARGIN + START_UP, took
    assert r.returncode == 4  # EXIT_REPORT: cleaned, but the report could not be written
    assert "writing the report to" in r.stderr and "did not finish" in r.stderr
    assert "--- report (not saved) ---" in r.stderr and "verdict: clean" in r.stderr
    assert not any(lab.alive(p) for p in w.host_pids(lab))


def test_a_hung_pmxcfs_ends_a_run_within_the_deadline(lab: Lab, vmid: int,
                                                      hangfs: HangFs) -> None:
    """/etc/pve is pmxcfs, a FUSE file system: the container's config is read in the run's
    worker, so a pmxcfs that stopped answering ends `ct` with one line and the pre-stop hook
    with exit 0, within the deadline, nothing signalled."""
    deadline = 2
    lab.write_config(grace_seconds=0.5, deadline_seconds=deadline,
                     pve_config_dir=str(hangfs.mountpoint / "lxc"))
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    lab.install_hook(vmid)
    hangfs.hang()
    for run in (lambda: lab.pveclean("ct", str(vmid)), lambda: hook(lab, vmid, "pre-stop")):
        t0 = time.monotonic()
        r = run()
        took = time.monotonic() - t0
        assert took < deadline + MARGIN + START_UP, took
        assert "pmxcfs not answering" in r.stderr + r.stdout, r
        assert len((r.stderr + r.stdout).splitlines()) == 1, r
    assert r.returncode == 0  # the hook: never in the way of a stop
    assert lab.pveclean("ct", str(vmid)).returncode == 3  # EXIT_ACCESS
    assert all(lab.alive(p) for p in w.host_pids(lab))


def test_gpus_on_a_hung_pmxcfs_ends_within_the_deadline(lab: Lab, vmid: int,
                                                        hangfs: HangFs) -> None:
    """`pveclean gpus` reads every container's config and the host's processes in a worker:
    what hangs there (here pmxcfs) ends the command at deadline_seconds, one line, exit 3."""
    deadline = 2
    lab.write_config(deadline_seconds=deadline, pve_config_dir=str(hangfs.mountpoint / "lxc"))
    lab.create_ct(vmid, gpus=(0,))
    hangfs.hang()
    t0 = time.monotonic()
    r = lab.pveclean("gpus")
    took = time.monotonic() - t0
    assert took < deadline + MARGIN + START_UP, took
    assert r.returncode == 3 and r.stdout == "", r
    assert r.stderr.startswith("pveclean: gpus: reading the host did not finish within 2 s")
    assert len(r.stderr.splitlines()) == 1, r


def test_gpus_never_stats_a_host_process_fd_on_a_hung_fuse(lab: Lab, hangfs: HangFs) -> None:
    """A host process with an fd on a file system that stopped answering, at a path naming
    nvidia (the host scan looks at those): the fd's mount is FUSE, so it is never stat()ed;
    the view is shown, the process with its GPU fd, in well under the deadline."""
    lab.write_config(deadline_seconds=4)
    daemon = lab.run_on_host("nvidia-persistenced",
                             hold=[str(lab.nodes["nvidia0"]), str(hangfs.file)])
    (pid,) = [p for p in daemon.host_pids(lab) if holds(p, hangfs.file)]
    hangfs.hang()
    t0 = time.monotonic()
    r = lab.pveclean("gpus", "--json")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert took < 2 + START_UP, took
    data = json.loads(r.stdout)
    rows = [p for g in data["gpus"] for p in g["processes"]] + data["other_holders"]
    row = next(p for p in rows if p["host_pid"] == pid)
    assert row["owner"] == "host" and any("nvidia0" in d for d in row["devices"]), row


def test_hung_nvml_ends_a_cleanup_within_the_deadline(lab: Lab, vmid: int) -> None:
    assert lab.nvml is not None
    deadline = 3
    lab.write_config(grace_seconds=0.5, deadline_seconds=deadline)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 100})
    lab.nvml.hang(60)
    code, rep, took = ct_json(lab, str(vmid))
    assert took < deadline + MARGIN + START_UP
    assert rep["duration_s"] <= deadline + MARGIN
    assert rep["verdict"] == "clean" and code == 0  # the host view decides
    assert "did not answer" in rep["sources"]["nvml"]
    assert not any(lab.alive(p) for p in w.host_pids(lab))
    files = list(lab.report_dir.glob(f"{vmid}-manual-*.yaml"))
    assert len(files) == 1 and yaml.safe_load(files[0].read_text())["verdict"] == "clean"


@pytest.mark.parametrize("limit", ["-Sn 1024", "-n 1024"], ids=["soft", "hard"])  # hard: batches
def test_many_holders_none_skipped(lab: Lab, vmid: int, limit: str) -> None:
    """1,500 holders (5,000 run in `make soak`): one pidfd each, none lost to EMFILE."""
    n = 1500
    lab.write_config(grace_seconds=5, deadline_seconds=60)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], children=n - 1)
    pids = w.host_pids(lab)
    assert len(pids) == n
    r = subprocess.run(["sh", "-c", f'ulimit {limit}; exec "$0" ct {vmid} --json',
                        str(Path(sys.executable).parent / "pveclean")],
                       capture_output=True, text=True, env=lab.env(), timeout=120, check=False)
    rep = json.loads(r.stdout)
    assert rep["summary"]["holders"] == n
    assert rep["verdict"] == "clean", rep["errors"]
    assert rep["summary"]["outcomes"] == {"terminated": n}
    assert not any(lab.alive(p) for p in pids)


def test_a_scan_cut_by_the_deadline_is_a_verdict_with_its_reason(lab: Lab, vmid: int) -> None:
    """Too many processes to read in the time given: the worker is killed at the deadline,
    nothing unread is signalled, and the report says why."""
    n, deadline = 1500, 0.1
    lab.write_config(grace_seconds=0.1, deadline_seconds=deadline)
    lab.create_ct(vmid, gpus=(0,))
    w = lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], children=n - 1)
    code, rep, took = ct_json(lab, str(vmid))
    assert took < deadline + MARGIN + START_UP
    assert rep["duration_s"] <= deadline + MARGIN
    assert code == 1 and rep["verdict"] == "residual"
    assert any(e.startswith("host scan did not finish within") for e in rep["errors"]), rep
    assert rep["summary"]["readers_killed"] >= 1
    assert all(lab.alive(p) for p in w.host_pids(lab))  # unread: never signalled
