"""Where admins look: one line per run in the journal with fields to filter on (its native
protocol; syslog's /dev/log where there is no journal), and node_exporter textfile metrics
(core/metrics.py). Both best effort: a missing journal never fails a cleanup, but what was not
logged or written is returned, for the report."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from pveclean.core.text import safe
from pveclean.core.verdicts import Verdict
from pveclean.host import journal
from pveclean.host.wholefile import replace_whole

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.report import Report

LOG_USER = 1
PRI = {"info": 6, "warning": 4, "err": 3}
LOCK_WAIT = 2.0  # seconds to wait for the metrics lock: a hook never hangs on it
MAX_METRICS = 4 << 20  # bytes of an existing textfile read back


def survived(rep: Report) -> int:
    return rep.survived()


def log_line(rep: Report, path: str | None) -> str:
    s = rep.summary
    residual = survived(rep)
    return (
        f"vmid={safe(rep.vmid, 12)} phase={safe(rep.phase, 20)} "
        f"verdict={safe(rep.verdict, 20)} "
        f"holders={safe(s.holders, 12)} stopped={safe(s.stopped, 12)} "
        f"residual={residual} freed_mib={safe(s.freed_mib, 20)} "
        f"duration_s={safe(rep.duration_s, 20)} report={safe(path or '-', 300)}"
    )


def level(rep: Report) -> str:
    verdict = rep.verdict
    if verdict == Verdict.ERROR:
        return "err"
    return "info" if verdict in (Verdict.CLEAN, Verdict.NOTHING_TO_DO, Verdict.DRY_RUN) \
        else "warning"


def fields(rep: Report, path: str | None) -> dict[str, str]:
    """The journal fields a run is filtered on (journalctl PVECLEAN_VMID=129
    PVECLEAN_VERDICT=residual)."""
    out = {"PVECLEAN_VMID": safe(rep.vmid, 12), "PVECLEAN_PHASE": safe(rep.phase, 20),
           "PVECLEAN_VERDICT": safe(str(rep.verdict), 20)}
    if path:
        out["PVECLEAN_REPORT"] = path
    return out


def syslog(rep: Report, path: str | None, socket_path: str = "/dev/log") -> bool:
    """Send one RFC 3164 line with identifier `pveclean` (journalctl -t pveclean) to a
    datagram socket, else to a stream socket (rsyslog's or syslog-ng's /dev/log may be
    either); False when neither took it."""
    msg = (f"<{LOG_USER * 8 + PRI[level(rep)]}>pveclean[{os.getpid()}]: "
           f"{log_line(rep, path)}").encode("utf-8", "replace")
    import socket  # only when syslog is on: not on every run's import path

    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        try:
            with socket.socket(socket.AF_UNIX, kind) as sock:
                sock.settimeout(0.5)
                sock.connect(socket_path)
                if kind == socket.SOCK_STREAM:
                    sock.sendall(msg + b"\0")  # octet-stuffed: one message per NUL
                else:
                    sock.send(msg)
            return True
        except OSError as exc:
            if kind == socket.SOCK_DGRAM and exc.errno != errno.EPROTOTYPE:
                return False
    return False


def log(rep: Report, path: str | None, syslog_socket: str,
        journal_socket: str | None) -> str | None:
    """The run's line with its fields in the journal (native protocol), else in syslog;
    the reason when neither took it."""
    if journal_socket and journal.send(log_line(rep, path), level(rep), fields(rep, path),
                                       journal_socket):
        return None
    if syslog(rep, path, syslog_socket):
        return None
    where = f"the journal ({journal_socket}) nor " if journal_socket else ""
    return f"the run was not logged: neither {where}syslog ({syslog_socket}) took it"


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


def update_textfile(metrics_path: str, make: Callable[[str], str],
                    lock_wait: float = LOCK_WAIT) -> None:
    """Replace the textfile with make(its current text), atomically, under a lock: written
    to a temporary name that does not end in `.prom` (node_exporter's textfile collector
    reads every name that does, dotfiles too, and would read it half written), then renamed
    over it."""
    path = Path(metrics_path)
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o755, parents=True)
    fd = _lock(f"{path}.lock", lock_wait)
    try:
        text = make(_read_old(path))
        replace_whole(path, text, ".pveclean-", 0o644)
    finally:
        os.close(fd)


def write_metrics(rep: Report, metrics_path: str, lock_wait: float = LOCK_WAIT,
                  now: float | None = None) -> None:
    """This run's counters added, its container's last-run gauges for its phase replaced."""
    from pveclean.core import metrics  # in the report's worker, not on every run's start-up

    when = time.time() if now is None else now
    update_textfile(metrics_path, lambda old: metrics.render(
        metrics.run_families(rep, when, metrics.parse(old))), lock_wait)


def publish(rep: Report, path: str | None, cfg_syslog: bool, syslog_socket: str,
            metrics_path: str | None, journal_socket: str | None = None) -> list[str]:
    """Best effort; returns what failed, for the caller to record in the report."""
    warnings = []
    if cfg_syslog:
        why = log(rep, path, syslog_socket, journal_socket)
        if why:
            warnings.append(why)
    if metrics_path:
        try:
            write_metrics(rep, metrics_path)
        except OSError as exc:
            warnings.append(f"metrics not written to {metrics_path}: {exc.strerror or exc}")
    return warnings
