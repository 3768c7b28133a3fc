"""Logs and metrics where admins look: one syslog/journald line per run, textfile metrics."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.lab.lxclab import Lab


def test_syslog_line_and_metrics_per_run(lab: Lab, vmid: int, vmid2: int,
                                         tmp_path: Path) -> None:
    sock_path = tmp_path / "log.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(5)
    prom = tmp_path / "textfile" / "pveclean.prom"
    lab.write_config(syslog=True, syslog_socket=str(sock_path), metrics_path=str(prom))
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
    assert f'pveclean_last_verdict{{vmid="{vmid}",verdict="clean"}} 1' in text
    assert f'pveclean_last_verdict{{vmid="{vmid}",verdict="residual"}} 0' in text
    assert f'pveclean_last_freed_bytes{{vmid="{vmid}"}} {1234 * 2**20}' in text
    assert f'pveclean_last_verdict{{vmid="{vmid2}",verdict="nothing-to-do"}} 1' in text
    assert text.count("# TYPE pveclean_last_verdict gauge") == 1


def test_missing_syslog_socket_does_not_fail_a_run(lab: Lab, vmid: int, tmp_path: Path) -> None:
    lab.write_config(syslog=True, syslog_socket=str(tmp_path / "nothing-here"))
    lab.create_ct(vmid, gpus=(0,), start=False)
    r = lab.pveclean("ct", str(vmid))
    assert r.returncode == 0, r.stderr
