"""Adapter for /proc: one settable root, one reader of its files, and a process's status,
command line, exe, wchan and threads. Every reader tolerates a process exiting mid-read
(returns None), because the host is live while we look at it."""

from __future__ import annotations

import os
import pwd

from pveclean.core.records import ProcStatus

PROC = "/proc"  # where procfs is mounted: read at every call, set_root() moves it (tests)


def set_root(root: str) -> None:
    """Read every /proc path of host/ below `root` from now on (as psutil's PROCFS_PATH):
    tests point it at a fake tree; a worker forked after this call inherits it."""
    global PROC
    PROC = root.rstrip("/") or "/"


def path(*parts: object) -> str:
    """A path below the current /proc root: path(42, "fd") is "/proc/42/fd"."""
    return "/".join((PROC, *map(str, parts)))


def read_bytes(file: str, limit: int | None = None, one_read: bool = False) -> bytes | None:
    """A /proc, /sys or cgroup file's bytes (at most `limit`; with `one_read`, what one read
    returns); None if it cannot be read (gone, or refused): the one place an OSError of a
    read becomes None. Plain os.read: a scan reads several files of every process, and a
    buffered open() costs three times as much."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if one_read:
            return os.read(fd, limit or 1 << 16)
        chunks: list[bytes] = []
        got = 0
        while limit is None or got < limit:
            chunk = os.read(fd, 1 << 16 if limit is None else min(limit - got, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(file: str, limit: int | None = None) -> str | None:
    """read_bytes() as text (UTF-8, an undecodable byte replaced)."""
    raw = read_bytes(file, limit)
    return None if raw is None else raw.decode("utf-8", "replace")


def readlink(link: str) -> str | None:
    """Where a /proc link (exe, fd/N, ns/mnt) points; None if it cannot be read."""
    try:
        return os.readlink(link)
    except OSError:
        return None


def listdir(directory: str) -> list[str] | None:
    """The names in a /proc directory (fd, task); None if it cannot be read."""
    try:
        return os.listdir(directory)
    except OSError:
        return None


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
    stat_text = read_text(path(pid, "stat"))
    status_text = read_text(path(pid, "status"))
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
    raw = read_bytes(path(pid, "cmdline"), 8192)
    if raw is None:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")


def exe(pid: int) -> str | None:
    return readlink(path(pid, "exe"))


def wchan(pid: int) -> str | None:
    text = read_text(path(pid, "wchan"))
    return text.strip() if text and text.strip() not in ("", "0") else None


def live_threads(pid: int) -> int:
    """Threads of `pid` that have not exited, the leader excluded (a zombie leader's
    process lives on while one of them runs)."""
    n = 0
    for base in thread_bases(pid, "task"):
        text = read_text(f"{base}/stat")
        parsed = parse_stat(text) if text else None
        if parsed and parsed[0] not in ("Z", "X"):
            n += 1
    return n


def thread_bases(pid: int, kind: str) -> list[str]:
    """Where to read a process's `kind` (fd, maps): /proc/PID, and when the leader has
    exited (a zombie whose fd/ and maps are empty) each live thread's /proc/PID/task/TID."""
    names = listdir(path(pid, "task"))
    tids = [t for t in names or () if t.isdigit() and t != str(pid)]
    return [path(pid, "task", t) for t in sorted(tids, key=int)]


def user_name(uid: int) -> str:
    try:

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)
