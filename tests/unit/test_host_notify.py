"""host/notify: the syslog line, metrics labels (escaped), and the textfile metrics written under
a lock."""

from __future__ import annotations

import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pveclean.core.report import Report
from pveclean.host import journal, notify
from tests.reportkit import holder, report, summary


def _rep(vmid: int = 129, verdict: str = "clean", **extra: object) -> Report:
    return report(vmid, verdict, duration_s=1.25,
                  summary=summary(holders=3, stopped=2, freed_mib=1234),
                  holders=[holder(outcome=o) for o in ("killed", "survived", "terminated")],
                  **extra)


# ---- the log line ---------------------------------------------------------------------------
def test_log_line() -> None:
    assert notify.log_line(_rep(), "/var/log/pveclean/129-manual-x.yaml") == (
        "vmid=129 phase=manual verdict=clean holders=3 stopped=2 residual=1 freed_mib=1234 "
        "duration_s=1.25 report=/var/log/pveclean/129-manual-x.yaml")


def test_log_line_of_a_minimal_report() -> None:
    rep = report(5, "nothing-to-do", phase="pre-start", duration_s=0)
    assert notify.log_line(rep, None) == (
        "vmid=5 phase=pre-start verdict=nothing-to-do holders=0 stopped=0 residual=0 "
        "freed_mib=0 duration_s=0 report=-")


def test_log_line_escapes_and_cuts_what_it_is_given() -> None:
    line = notify.log_line(_rep(phase="x\ny"), "/tmp/a\x1b[2J" + "b" * 400)
    assert "\n" not in line and "\x1b" not in line
    assert "phase=x\\x0ay" in line
    assert line.endswith("…") and len(line.split("report=")[1]) == 300


# ---- the textfile ---------------------------------------------------------------------------
def _series(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]


def test_write_metrics_replaces_only_this_containers_series(tmp_path: Path) -> None:
    prom = tmp_path / "textfile/pveclean.prom"
    notify.write_metrics(_rep(12, "residual"), str(prom))
    notify.write_metrics(_rep(129, "clean"), str(prom))
    notify.write_metrics(_rep(129, "error"), str(prom))
    text = prom.read_text()
    assert 'pveclean_last_verdict{id="lxc/129",phase="manual",verdict="error"} 1' in text
    assert 'pveclean_last_verdict{id="lxc/129",phase="manual",verdict="clean"} 0' in text
    assert 'pveclean_last_verdict{id="lxc/12",phase="manual",verdict="residual"} 1' in text
    assert text.count("# TYPE pveclean_last_verdict gauge") == 1
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    lock = tmp_path / "textfile/pveclean.prom.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert sorted(p.name for p in prom.parent.iterdir()) == ["pveclean.prom",
                                                            "pveclean.prom.lock"]


def test_write_metrics_refuses_a_symlinked_textfile(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    prom = tmp_path / "pveclean.prom"
    prom.symlink_to(victim)
    with pytest.raises(OSError):
        notify.write_metrics(_rep(), str(prom))
    assert victim.read_text() == "root:secret\n" and prom.is_symlink()


def test_write_metrics_refuses_a_hard_linked_textfile(tmp_path: Path) -> None:
    victim = tmp_path / "secret"
    victim.write_text("pveclean_x{vmid=\"1\"} secret\n")
    victim.chmod(0o600)
    prom = tmp_path / "pveclean.prom"
    os.link(victim, prom)
    with pytest.raises(OSError, match="not a plain file of ours"):
        notify.write_metrics(_rep(), str(prom))
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert prom.read_text() == victim.read_text()  # not replaced by a world-readable copy
    assert not list(tmp_path.glob(".pveclean-*"))


def test_write_metrics_refuses_a_symlinked_lock(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    (tmp_path / "pveclean.prom.lock").symlink_to(victim)
    with pytest.raises(OSError):
        notify.write_metrics(_rep(), str(tmp_path / "pveclean.prom"))
    assert not (tmp_path / "pveclean.prom").exists()


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[Path]:
    lock = tmp_path / "pveclean.prom.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield lock
    finally:
        os.close(fd)


def test_a_held_lock_is_waited_for_a_bounded_time(tmp_path: Path, held_lock: Path) -> None:
    import time

    t = time.monotonic()
    with pytest.raises(OSError, match="held by another process"):
        notify.write_metrics(_rep(), str(tmp_path / "pveclean.prom"), lock_wait=0.2)
    assert 0.15 < time.monotonic() - t < 3


def test_publish_turns_a_metrics_failure_into_a_warning(tmp_path: Path) -> None:
    (tmp_path / "pveclean.prom").mkdir()  # cannot be read as the old textfile
    warnings = notify.publish(_rep(), None, False, "/nonexistent", str(tmp_path / "pveclean.prom"))
    assert len(warnings) == 1
    assert warnings[0].startswith(f"metrics not written to {tmp_path / 'pveclean.prom'}: ")
    assert notify.publish(_rep(), None, False, "/nonexistent", None) == []


# ---- syslog -------------------------------------------------------------------------------
@pytest.fixture
def log_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "log")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    try:
        yield sock, path
    finally:
        sock.close()


@pytest.mark.parametrize(("verdict", "pri"), [
    ("clean", 14), ("nothing-to-do", 14), ("dry-run", 14), ("residual", 12), ("leaked", 12),
    ("busy", 12), ("error", 11)])
def test_syslog_priority_by_verdict(log_socket: tuple[socket.socket, str], verdict: str,
                                    pri: int) -> None:
    sock, path = log_socket
    assert notify.syslog(_rep(verdict=verdict), "/r.yaml", path) is True
    msg = sock.recv(4096).decode()
    assert msg == f"<{pri}>pveclean[{os.getpid()}]: " + notify.log_line(
        _rep(verdict=verdict), "/r.yaml")


def test_syslog_without_a_socket_is_false(tmp_path: Path) -> None:
    assert notify.syslog(_rep(), None, str(tmp_path / "none")) is False


def test_publish_sends_syslog_when_asked(log_socket: tuple[socket.socket, str]) -> None:
    sock, path = log_socket
    assert notify.publish(_rep(), "/r.yaml", True, path, None) == []
    assert "vmid=129" in sock.recv(4096).decode()


# ---- the journal, syslog as the fallback, a failure said -----------------------------------
def _fields(datagram: bytes) -> dict[str, str]:
    out, rest = {}, datagram
    while rest:
        line, _, tail = rest.partition(b"\n")
        if b"=" in line:
            k, _, v = line.partition(b"=")
            out[k.decode()], rest = v.decode(), tail
        else:  # KEY\n, 64-bit little-endian length, value, \n
            n = int.from_bytes(tail[:8], "little")
            out[line.decode()], rest = tail[8:8 + n].decode(), tail[9 + n:]
    return out


def test_the_runs_line_goes_to_the_journal_with_fields_to_filter_on(
        tmp_path: Path, log_socket: tuple[socket.socket, str]) -> None:
    sock, jpath = log_socket
    syslog_path = tmp_path / "syslog"
    assert notify.publish(_rep(verdict="residual"), "/var/log/pveclean/129-manual-x.yaml", True,
                          str(syslog_path), None, jpath) == []
    got = _fields(sock.recv(65536))
    assert got["PVECLEAN_VMID"] == "129" and got["PVECLEAN_PHASE"] == "manual"
    assert got["PVECLEAN_VERDICT"] == "residual"
    assert got["PVECLEAN_REPORT"] == "/var/log/pveclean/129-manual-x.yaml"
    assert got["SYSLOG_IDENTIFIER"] == "pveclean" and got["PRIORITY"] == "4"
    assert got["MESSAGE"] == notify.log_line(_rep(verdict="residual"),
                                             "/var/log/pveclean/129-manual-x.yaml")
    assert journal.encode({"A": "x\ny"}) == b"A\n" + (3).to_bytes(8, "little") + b"x\ny\n"


def test_without_a_journal_the_line_goes_to_syslog(
        tmp_path: Path, log_socket: tuple[socket.socket, str]) -> None:
    sock, path = log_socket
    assert notify.publish(_rep(), None, True, path, None, str(tmp_path / "no-journal")) == []
    assert sock.recv(4096).decode().endswith(notify.log_line(_rep(), None))


def test_a_stream_dev_log_takes_the_line(tmp_path: Path) -> None:
    path = str(tmp_path / "log")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(5)
    try:
        assert notify.syslog(_rep(), None, path) is True  # main's datagram was lost
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            assert conn.recv(4096).endswith(notify.log_line(_rep(), None).encode() + b"\0")
    finally:
        srv.close()


def test_a_line_nobody_took_is_returned_for_the_report(tmp_path: Path) -> None:
    warnings = notify.publish(_rep(), None, True, str(tmp_path / "log"), None,
                              str(tmp_path / "journal"))
    assert warnings == [f"the run was not logged: neither the journal ({tmp_path}/journal) "
                        f"nor syslog ({tmp_path}/log) took it"]


