"""The kernel log's reader for Xids: /dev/kmsg (a settable path: `kmsg_path`), from where the
last run left off (<state_dir>/xid.json), bounded per run in records and in time, and the
owner of each Xid's PID while it lives (core/xidlog.py says the rest).

/dev/kmsg (Documentation/ABI/testing/dev-kmsg): each read() returns one record, opened
non-blocking a read at the end fails EAGAIN, and EPIPE says the records after the last one
read were overwritten before they could be read. It cannot seek to a sequence number: the
records up to the saved one are read and skipped. A regular file holding records in the
same format (the lab's stand-in) is read the same way: one record a line, continuation
lines starting with a space."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from pveclean.core.owners import Owner, owner_of
from pveclean.core.text import safe
from pveclean.core.xid import KmsgRecord, parse_record
from pveclean.core.xidlog import Seen, XidLog, fold, from_dict, same_name, xids_in
from pveclean.host import cgroupfs, procfs
from pveclean.host.wholefile import replace_whole

STATE_FILE = "xid.json"
LOCK_FILE = "xid.lock"
LOCK_WAIT = 2.0  # s another run may hold the log
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MAX_RECORDS = 20000  # new records read per run; the rest waits for the next run
MAX_BYTES = 8 << 20  # bytes read per run, skipped records included
READ_SIZE = 16384  # larger than any record (PRINTK_MESSAGE_MAX and its dictionary)
SECONDS = 1.0  # time a run may spend reading

TYPE_CHECKING = False
if TYPE_CHECKING:  # the report's records: not imported by the metrics timer (issue 42)
    from pveclean.core.report import Report


def load(state_dir: str) -> XidLog:
    """The saved log; a missing or unreadable one starts afresh."""
    try:
        raw = json.loads((Path(state_dir) / STATE_FILE).read_text(encoding="utf-8"))
        return from_dict(raw)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return XidLog()


def save(state_dir: str, log: XidLog) -> None:
    """Atomically, 0600; a log not saved is read again next run (counted twice at worst)."""
    with contextlib.suppress(OSError):
        replace_whole(Path(state_dir) / STATE_FILE, json.dumps(log.as_dict()), ".xid-")


def boot_id(path: str = BOOT_ID) -> str:
    raw = procfs.read_bytes(path, 128)
    return "" if raw is None else raw.decode("ascii", "replace").strip()


def _split(buf: bytes) -> tuple[list[str], bytes]:
    """Whole records in `buf` (a header line and its continuation lines) and what is left:
    a record is whole once the next header line (or the end of a device read) begins."""
    lines = buf.split(b"\n")
    rest = lines.pop()  # after the last newline: an unfinished line
    out: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8", "replace")
        if line.startswith(" ") and out:
            out[-1] += "\n" + line
        elif not line.startswith(" "):
            out.append(line)
    return out, rest


def _seq_of(record: str) -> int:
    """The sequence number of a record's header (`prefix,seq,...`); -1 when it has none (the
    full parse then decides)."""
    first = record.find(",")
    second = record.find(",", first + 1)
    digits = record[first + 1:second] if 0 <= first < second else ""
    return int(digits) if digits.isdigit() and len(digits) <= 20 else -1


def read_records(path: str, after: int, max_records: int = MAX_RECORDS,
                 seconds: float = SECONDS) -> tuple[list[KmsgRecord], int]:
    """The records after sequence number `after` (at most `max_records` of them, within
    `seconds`), and how many times the kernel said records were lost (EPIPE). A record that
    is not in the format is skipped; OSError when the log cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    end = time.monotonic() + seconds
    got: list[KmsgRecord] = []
    lost, total, buf = 0, 0, b""
    try:
        while len(got) < max_records and total < MAX_BYTES and time.monotonic() < end:
            try:
                chunk = os.read(fd, READ_SIZE)
            except BlockingIOError:
                break  # the end of the device's records
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    lost += 1
                    continue
                raise
            if not chunk:
                break
            total += len(chunk)
            texts, buf = _split(buf + chunk)
            for t in texts:
                if _seq_of(t) <= after:
                    continue  # read before: only its number looked at
                r = parse_record(t)
                if r is not None:
                    got.append(r)
    finally:
        os.close(fd)
    return got[:max_records], lost


def live_owners(pids: dict[int, str | None]) -> dict[int, Owner]:
    """PID -> owner by its cgroup, for each PID that lives under the name the driver wrote."""
    out: dict[int, Owner] = {}
    for pid, name in pids.items():
        comm = procfs.read_text(procfs.path(pid, "comm"), 64)
        if comm is None or not same_name(name, comm.rstrip("\n")):
            continue
        cg = cgroupfs.pid_cgroup(pid)
        if cg is not None:
            out[pid] = owner_of(cg)
    return out


class Busy(Exception):
    """Another pveclean holds the Xid log (a pass, a report, a reset) past LOCK_WAIT."""


@contextlib.contextmanager
def locked(state_dir: str) -> Iterator[None]:
    """The Xid log to one reader-writer at a time (the timer, the hooks and `reset` may run
    at once: a log read by two and saved by both would count an Xid twice). Busy past
    LOCK_WAIT; a state dir that cannot be made runs unlocked (nothing is saved there)."""
    try:
        Path(state_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(Path(state_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        yield
        return
    try:
        from pveclean.host.lock import flock_within  # only where the log is read

        if not flock_within(fd, LOCK_WAIT):
            raise Busy(f"the Xid log in {state_dir} is busy")
        yield
    finally:
        os.close(fd)


def read_xids(kmsg_path: str, state_dir: str, boot_id_path: str = BOOT_ID,
              max_records: int = MAX_RECORDS, pids: dict[int, tuple[Owner, str]] | None = None,
              keep: bool = True) -> tuple[XidLog, list[Seen], str | None]:
    """One pass under the log's lock (see _read_xids); a busy log is read, not saved, and
    the third value says so."""
    if not keep:  # only a look: no lock, nothing made in the state dir
        return _read_xids(kmsg_path, state_dir, boot_id_path, max_records, pids, keep)
    try:
        with locked(state_dir):
            return _read_xids(kmsg_path, state_dir, boot_id_path, max_records, pids, keep)
    except Busy as exc:
        return load(state_dir), [], str(exc)


def _read_xids(kmsg_path: str, state_dir: str, boot_id_path: str, max_records: int,
               pids: dict[int, tuple[Owner, str]] | None, keep: bool
               ) -> tuple[XidLog, list[Seen], str | None]:
    """One pass: the saved log, the records since, each Xid's owner, the log saved again.
    `pids`: PID -> (owner, name) of the GPU map just taken (kept for the next pass; the
    saved map's and this one's name the owners of PIDs gone now). Returns the log, the Xids
    new in this pass (core/xidlog.Seen) and why the kernel log could not be read (None
    when it could). `keep` False: nothing saved (`pveclean gpus` only looks)."""
    log = load(state_dir)
    if pids is not None:
        log = log.with_map({**log.pids, **pids})
    boot = boot_id(boot_id_path)
    after = log.seq if boot == log.boot_id else -1
    try:
        records, lost = read_records(kmsg_path, after, max_records)
    except OSError as exc:
        if pids is not None and keep:
            save(state_dir, log.with_map(pids))
        return log, [], f"{kmsg_path}: {exc.strerror or exc}"
    wanted = {x.pid: x.name for _r, x in xids_in(records) if x.pid is not None}
    new_log, new = fold(log, boot, records, live_owners(wanted), lost)
    if pids is not None:
        new_log = new_log.with_map(pids)
    if keep:
        save(state_dir, new_log)
    return new_log, new, None


def with_xids(rep: Report, state_dir: str) -> Report:
    """The report, about to be written, with its container's Xids since its last report."""
    for line in for_report(state_dir, rep.vmid):
        rep = rep.with_warning(line)
    return rep


def for_report(state_dir: str, vmid: int) -> list[str]:
    """Container `vmid`'s Xids since its last report, one line each, taken from the log
    (the next report does not list them again); none when the log is busy."""
    try:
        with locked(state_dir):
            rest, seen = load(state_dir).take(vmid)
            if seen:
                save(state_dir, rest)
    except Busy:
        return []
    return [f"GPU fault: Xid {s.xid.xid} ({s.action}) on {s.xid.pci}, pid "
            f"{s.xid.pid} {safe(s.xid.name or '?', 40)}: {safe(s.xid.text, 160)}" for s in seen]


def reset_done(state_dir: str, pci: str) -> None:
    """After a verified reset of the GPU at the driver's `pci`: its pending Xid resolved."""
    with contextlib.suppress(Busy), locked(state_dir):
        save(state_dir, load(state_dir).reset_done(pci))
