"""Logs and metrics where admins look: one syslog/journald line per run, textfile metrics."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from tests.harness.lxclab import Lab


def test_syslog_line_and_metrics_per_run(lab: Lab, vmid: int, vmid2: int,
                                         tmp_path: Path) -> None:
    sock_path = tmp_path / "log.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(5)
    prom = tmp_path / "textfile" / "pveclean.prom"
    lab.write_config(syslog=True, syslog_socket=str(sock_path), metrics_path=str(prom),
                     journal_socket=str(tmp_path / "no-journal"))
    lab.create_ct(vmid, gpus=(0,))
    lab.create_ct(vmid2, gpus=(0,), start=False)
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 1234})
    try:
        assert lab.pveclean("ct", str(vmid)).returncode == 0
        msg = sock.recv(4096).decode()
        assert lab.pveclean("ct", str(vmid2)).returncode == 0
        msg2 = sock.recv(4096).decode()
    finally:
        sock.close()
    assert msg.startswith("<14>pveclean[")  # facility user, severity info; tag for journalctl -t
    assert f"vmid={vmid} phase=manual verdict=clean holders=1 stopped=1 residual=0 " \
           "freed_mib=1234" in msg
    assert f"report={lab.report_dir}/{vmid}-manual-" in msg
    assert f"vmid={vmid2} phase=manual verdict=nothing-to-do" in msg2
    text = prom.read_text()
    lab_ = f'id="lxc/{vmid}",phase="manual"'
    assert f'pveclean_last_verdict{{{lab_},verdict="clean"}} 1' in text
    assert f'pveclean_last_verdict{{{lab_},verdict="residual"}} 0' in text
    assert f'pveclean_last_freed_bytes{{{lab_}}} {1234 * 2**20}' in text
    assert f'pveclean_runs_total{{{lab_},verdict="clean"}} 1' in text
    assert (f'pveclean_last_verdict{{id="lxc/{vmid2}",phase="manual",verdict="nothing-to-do"}} 1'
            in text)
    assert text.count("# TYPE pveclean_last_verdict gauge") == 1


def test_missing_syslog_socket_does_not_fail_a_run(lab: Lab, vmid: int, tmp_path: Path) -> None:
    lab.write_config(syslog=True, syslog_socket=str(tmp_path / "nothing-here"))
    lab.create_ct(vmid, gpus=(0,), start=False)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 0, r.stderr


def test_reports_table_filter_json_and_show(lab: Lab, vmid: int, vmid2: int) -> None:

    lab.create_ct(vmid, gpus=(0,))
    lab.create_ct(vmid2, gpus=(0,), start=False)
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 4321})
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert lab.pveclean("ct", str(vmid2)).returncode == 0
    assert lab.pveclean("ct", str(vmid), "--dry-run").returncode == 0  # writes no report
    assert lab.pveclean("ct", str(vmid)).returncode == 0  # nothing left: nothing-to-do
    r = lab.pveclean("reports")
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["TIME", "(UTC)", "VMID", "PHASE"]
    assert len(lines) == 4
    row = next(ln for ln in lines if f" {vmid} " in ln and "clean" in ln)
    assert " manual " in row and " 1/1 " in row and " 4321 " in row
    r = lab.pveclean("reports", str(vmid2))
    assert len(r.stdout.splitlines()) == 2 and "nothing-to-do" in r.stdout
    r = lab.pveclean("reports", "--verdict", "clean", "--json")
    (only,) = json.loads(r.stdout)
    assert only["vmid"] == vmid and only["verdict"] == "clean"
    assert json.loads(lab.pveclean("reports", "--verdict", "dry-run", "--json").stdout) == []
    r = lab.pveclean("reports", "--last", "1")
    assert len(r.stdout.splitlines()) == 2 and f" {vmid} " in r.stdout
    r = lab.pveclean("reports", "show", "latest", str(vmid2))
    assert r.returncode == 0 and f"CT {vmid2} manual: no GPU holders" in r.stdout
    r = lab.pveclean("reports", "show", "latest", str(vmid), "--json")
    assert json.loads(r.stdout)["verdict"] == "nothing-to-do"
    name = sorted(lab.report_dir.glob(f"{vmid}-*.yaml"))[0].name  # the run that stopped it
    r = lab.pveclean("reports", "show", name)
    assert r.returncode == 0 and "python3" in r.stdout and "cmdline" not in r.stdout
    bad = lab.report_dir / f"{vmid}-manual-20000101T000000.000000Z.yaml"
    bad.write_text(": not [ yaml")
    r = lab.pveclean("reports", "show", bad.name)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert lab.pveclean("reports", "12x").returncode == 2


def test_progress_on_a_terminal_and_plain_otherwise(lab: Lab, vmid: int) -> None:
    import sys

    lab.write_config(grace_seconds=0.5)
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "nccl-helper", hold=["/dev/nvidia0"], ignore_term=True)
    master, slave = os.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "pveclean", "ct", str(vmid)], env=lab.env(),
                           stdout=subprocess.PIPE, stderr=slave, timeout=60, check=False)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    assert r.returncode == 0
    text = out.decode()
    assert "... found 1 GPU holder(s)" in text
    assert "waiting up to 0.5 s" in text and "deadline in" in text
    assert "SIGKILL sent to 1 still running after the grace (nccl-helper)" in text
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"])
    plain = lab.pveclean("ct", str(vmid))  # stderr is a pipe: no progress lines
    assert plain.returncode == 0 and "..." not in plain.stderr


def test_metrics_never_follow_a_symlink_and_the_lock_is_roots(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    secret = lab.root / "secret"
    secret.write_text("pveclean_root_only_line 1\nshadow:$6$hash\n")
    secret.chmod(0o600)
    textdir = lab.root / "textfile"
    textdir.mkdir()
    prom = textdir / "pveclean.prom"
    prom.symlink_to(secret)
    lab.write_config(metrics_path=str(prom))
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 0, r.stderr
    assert secret.read_text().startswith("pveclean_root_only_line")  # untouched
    for f in textdir.iterdir():  # nothing of the root-only file reached a readable file
        if not f.is_symlink():
            assert "shadow" not in f.read_text() and "root_only" not in f.read_text()
    assert oct((textdir / "pveclean.prom.lock").stat().st_mode & 0o777) == oct(0o600)
    prom.unlink()  # without the symlink, metrics are written
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert f'id="lxc/{vmid}"' in prom.read_text() and not prom.is_symlink()


def test_metrics_lock_held_by_someone_else_does_not_hang_the_run(
        lab: Lab, vmid: int) -> None:
    import fcntl

    lab.create_ct(vmid, gpus=(0,), start=False)
    prom = lab.root / "textfile" / "pveclean.prom"
    lab.write_config(metrics_path=str(prom), deadline_seconds=10)
    prom.parent.mkdir()
    lock = open(f"{prom}.lock", "a")  # noqa: SIM115 -- held for the whole run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        t = time.monotonic()
        r = lab.pveclean("ct", str(vmid))
        assert time.monotonic() - t < 10
        assert r.returncode == 0, r.stderr
        assert "metrics not written" in r.stdout + r.stderr or not prom.exists()
    finally:
        lock.close()
