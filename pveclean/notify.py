"""Where admins look: one structured syslog/journald line per run, and node_exporter
textfile metrics. Both best effort: a missing /dev/log never fails a cleanup."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

VERDICTS = ("clean", "nothing-to-do", "dry-run", "residual", "leaked", "error", "busy")
LOG_USER = 1
PRI = {"info": 6, "warning": 4, "err": 3}


def log_line(rep: dict[str, Any], path: str | None) -> str:
    s = rep.get("summary", {})
    residual = sum(1 for h in rep.get("holders", []) if h.get("outcome") == "survived")
    return (
        f"vmid={rep['vmid']} phase={rep['phase']} verdict={rep['verdict']} "
        f"holders={s.get('holders', 0)} stopped={s.get('stopped', 0)} residual={residual} "
        f"freed_mib={s.get('freed_mib', 0)} duration_s={rep.get('duration_s', 0)} "
        f"report={path or '-'}"
    )


def syslog(rep: dict[str, Any], path: str | None, socket_path: str = "/dev/log") -> bool:
    """Send one RFC 3164 line with identifier `pveclean` (journalctl -t pveclean)."""
    verdict = rep.get("verdict")
    level = "info" if verdict in ("clean", "nothing-to-do", "dry-run") else "warning"
    if verdict == "error":
        level = "err"
    msg = f"<{LOG_USER * 8 + PRI[level]}>pveclean[{os.getpid()}]: {log_line(rep, path)}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.5)
            sock.connect(socket_path)
            sock.send(msg.encode("utf-8", "replace"))
        return True
    except OSError:
        return False


def _metric_lines(rep: dict[str, Any], now: float) -> list[str]:
    vmid = rep["vmid"]
    s = rep.get("summary", {})
    residual = sum(1 for h in rep.get("holders", []) if h.get("outcome") == "survived")
    lab = f'vmid="{vmid}"'
    lines = [f'pveclean_last_run_timestamp_seconds{{{lab},phase="{rep["phase"]}"}} {now:.0f}']
    lines += [
        f'pveclean_last_verdict{{{lab},verdict="{v}"}} {1 if rep["verdict"] == v else 0}'
        for v in VERDICTS
    ]
    lines += [
        f"pveclean_last_holders_stopped{{{lab}}} {s.get('stopped', 0)}",
        f"pveclean_last_freed_bytes{{{lab}}} {int(s.get('freed_mib', 0)) * 1024 * 1024}",
        f"pveclean_last_residual_holders{{{lab}}} {residual}",
        f"pveclean_last_leaked_bytes{{{lab}}} "
        f"{sum(x.get('unaccounted_mib', 0) for x in rep.get('leaks', [])) * 1024 * 1024}",
        f"pveclean_last_run_duration_seconds{{{lab}}} {rep.get('duration_s', 0)}",
    ]
    return lines


HELP = """# HELP pveclean_last_verdict 1 for the verdict of the last pveclean run on a container.
# TYPE pveclean_last_verdict gauge
# HELP pveclean_last_run_timestamp_seconds When the last run on a container ended.
# TYPE pveclean_last_run_timestamp_seconds gauge
# HELP pveclean_last_holders_stopped GPU holders stopped by the last run.
# TYPE pveclean_last_holders_stopped gauge
# HELP pveclean_last_freed_bytes GPU memory freed by the last run.
# TYPE pveclean_last_freed_bytes gauge
# HELP pveclean_last_residual_holders GPU holders that survived the last run.
# TYPE pveclean_last_residual_holders gauge
# HELP pveclean_last_leaked_bytes GPU memory left with no process after the last stop.
# TYPE pveclean_last_leaked_bytes gauge
# HELP pveclean_last_run_duration_seconds Wall time of the last run.
# TYPE pveclean_last_run_duration_seconds gauge
"""


def write_metrics(rep: dict[str, Any], metrics_path: str) -> None:
    """Replace this container's series in the textfile, atomically, under a lock."""
    path = Path(metrics_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vmid_label = f'vmid="{rep["vmid"]}"'
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old: list[str] = []
        with contextlib.suppress(FileNotFoundError):
            old = [ln for ln in path.read_text().splitlines()
                   if ln and not ln.startswith("#") and vmid_label not in ln]
        lines = sorted(old + _metric_lines(rep, time.time()))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pveclean-", suffix=".prom")
        with os.fdopen(fd, "w") as fh:
            fh.write(HELP + "\n".join(lines) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)


def publish(rep: dict[str, Any], path: str | None, cfg_syslog: bool, syslog_socket: str,
            metrics_path: str | None) -> list[str]:
    """Best effort; returns warnings for the caller to record."""
    warnings = []
    if cfg_syslog:
        syslog(rep, path, syslog_socket)
    if metrics_path:
        try:
            write_metrics(rep, metrics_path)
        except OSError as exc:
            warnings.append(f"metrics not written to {metrics_path}: {exc.strerror}")
    return warnings
