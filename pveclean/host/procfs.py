"""Adapter for /proc, cgroup v2 and device nodes. Every reader tolerates a process exiting
mid-read (returns None), because the host is live while we look at it."""

from __future__ import annotations

import os

from pveclean.core.records import ProcStatus

PROC = "/proc"


def _read(path: str) -> str | None:
    """A whole /proc or /sys file as text; None if it cannot be read. Plain os.read: a scan
    reads several files of every process, and a text-mode open() costs three times as much."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def parse_stat(text: str) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) from /proc/PID/stat; comm may hold spaces and ')'."""
    end = text.rfind(")")
    if end < 0:
        return None
    rest = text[end + 2 :].split()
    if len(rest) < 20:
        return None
    try:
        return rest[0], int(rest[1]), int(rest[19])
    except ValueError:
        return None


STATUS_KEYS = frozenset({"Name", "Uid", "NSpid"})


def parse_status(text: str, keys: frozenset[str] | None = None) -> dict[str, str]:
    """/proc/PID/status as key -> value; only `keys` if given (it stops once it has them:
    the kernel writes each key once, and escapes a newline in a process's name)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and (keys is None or key in keys):
            out[key] = value.strip()
            if keys is not None and len(out) == len(keys):
                break
    return out


def read_status(pid: int) -> ProcStatus | None:
    stat_text = _read(f"{PROC}/{pid}/stat")
    status_text = _read(f"{PROC}/{pid}/status")
    if stat_text is None or status_text is None:
        return None
    parsed = parse_stat(stat_text)
    if parsed is None:
        return None
    state, ppid, starttime = parsed
    st = parse_status(status_text, STATUS_KEYS)
    try:
        uid = int(st.get("Uid", "0").split()[0])
        nspid = tuple(int(x) for x in st.get("NSpid", str(pid)).split())
    except ValueError:
        return None
    return ProcStatus(pid, st.get("Name", "?"), state, ppid, uid, nspid or (pid,), starttime)


def cmdline(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            raw = fh.read(8192)
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")


def exe(pid: int) -> str | None:
    try:
        return os.readlink(f"{PROC}/{pid}/exe")
    except OSError:
        return None


def wchan(pid: int) -> str | None:
    text = _read(f"{PROC}/{pid}/wchan")
    return text.strip() if text and text.strip() not in ("", "0") else None


def live_threads(pid: int) -> int:
    """Threads of `pid` that have not exited, the leader excluded (a zombie leader's
    process lives on while one of them runs)."""
    n = 0
    for base in _bases(pid, "task"):
        text = _read(f"{base}/stat")
        parsed = parse_stat(text) if text else None
        if parsed and parsed[0] not in ("Z", "X"):
            n += 1
    return n


def _bases(pid: int, kind: str) -> list[str]:
    """Where to read a process's `kind` (fd, maps): /proc/PID, and when the leader has
    exited (a zombie whose fd/ and maps are empty) each live thread's /proc/PID/task/TID."""
    try:
        tids = [t for t in os.listdir(f"{PROC}/{pid}/task") if t.isdigit() and t != str(pid)]
    except OSError:
        return []
    return [f"{PROC}/{pid}/task/{t}" for t in sorted(tids, key=int)]


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)
