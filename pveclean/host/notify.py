"""Where admins look: one structured syslog/journald line per run, and node_exporter
textfile metrics. Both best effort: a missing /dev/log never fails a cleanup."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from pveclean.core.text import safe
from pveclean.core.verdicts import VERDICTS, Outcome, Verdict
from pveclean.host.reportfiles import exclusive_temp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOG_USER = 1
PRI = {"info": 6, "warning": 4, "err": 3}
LOCK_WAIT = 2.0  # seconds to wait for the metrics lock: a hook never hangs on it
MAX_METRICS = 4 << 20  # bytes of an existing textfile read back


def survived(rep: dict[str, Any]) -> int:
    """Holders that survived: counted in the summary (a report lists only some, see
    core/bounds.py), else in the holders listed."""
    counted = (rep.get("summary") or {}).get("outcomes", {}).get(str(Outcome.SURVIVED))
    if isinstance(counted, int):
        return counted
    return sum(1 for h in rep.get("holders", []) if h.get("outcome") == Outcome.SURVIVED)


def log_line(rep: dict[str, Any], path: str | None) -> str:
    s = rep.get("summary", {})
    residual = survived(rep)
    return (
        f"vmid={safe(rep['vmid'], 12)} phase={safe(rep['phase'], 20)} "
        f"verdict={safe(rep['verdict'], 20)} "
        f"holders={safe(s.get('holders', 0), 12)} stopped={safe(s.get('stopped', 0), 12)} "
        f"residual={residual} freed_mib={safe(s.get('freed_mib', 0), 20)} "
        f"duration_s={safe(rep.get('duration_s', 0), 20)} report={safe(path or '-', 300)}"
    )


def syslog(rep: dict[str, Any], path: str | None, socket_path: str = "/dev/log") -> bool:
    """Send one RFC 3164 line with identifier `pveclean` (journalctl -t pveclean)."""
    verdict = rep.get("verdict")
    level = "info" if verdict in (Verdict.CLEAN, Verdict.NOTHING_TO_DO, Verdict.DRY_RUN) \
        else "warning"
    if verdict == Verdict.ERROR:
        level = "err"
    msg = f"<{LOG_USER * 8 + PRI[level]}>pveclean[{os.getpid()}]: {log_line(rep, path)}"
    try:
        import socket  # only when syslog is on: not on every run's import path

        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.5)
            sock.connect(socket_path)
            sock.send(msg.encode("utf-8", "replace"))
        return True
    except OSError:
        return False


def label(value: object) -> str:
    """A Prometheus label value: printable, cut, backslash and quote escaped."""
    return safe(value, 64).replace('"', '\\"')


def _metric_lines(rep: dict[str, Any], now: float) -> list[str]:
    vmid = label(rep["vmid"])
    s = rep.get("summary", {})
    residual = survived(rep)
    lab = f'vmid="{vmid}"'
    lines = [f'pveclean_last_run_timestamp_seconds{{{lab},phase="{label(rep["phase"])}"}} '
             f'{now:.0f}']
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


def _lock(lock_path: str, wait: float) -> int:
    """The metrics lock: 0600, ours, never through a symlink; waited for at most `wait` s
    (anyone who could open it could otherwise hold it and hang every hook)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{lock_path} is not a file of ours")
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        end = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= end:
                    raise OSError(errno.EWOULDBLOCK,
                                  f"{lock_path} held by another process for {wait:.0f} s"
                                  ) from None
                time.sleep(0.02)
    except BaseException:
        os.close(fd)
        raise


def _read_old(path: Path) -> str:
    """The current textfile, read without following a symlink; only a plain file of ours
    with one link (a hard link to a root-only file is not copied into a world-readable
    .prom)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise OSError(errno.EPERM, f"{path} is not a plain file of ours; not replacing it")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(MAX_METRICS).decode("utf-8", "replace")
    finally:
        os.close(fd)


def write_metrics(rep: dict[str, Any], metrics_path: str, lock_wait: float = LOCK_WAIT) -> None:
    """Replace this container's series in the textfile, atomically, under a lock."""
    path = Path(metrics_path)
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o755, parents=True)
    vmid_label = f'vmid="{label(rep["vmid"])}"'
    fd = _lock(f"{path}.lock", lock_wait)
    try:
        old = [ln for ln in _read_old(path).splitlines()
               if ln.startswith("pveclean_") and vmid_label not in ln]
        lines = sorted(old + _metric_lines(rep, time.time()))
        tmpfd, tmp = exclusive_temp(path.parent, ".pveclean-", ".prom")
        try:
            with os.fdopen(tmpfd, "w") as fh:
                fh.write(HELP + "\n".join(lines) + "\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)  # rename replaces a symlink itself, never its target
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    finally:
        os.close(fd)


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
