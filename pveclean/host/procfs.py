"""Adapter for /proc: one settable root, one reader of its files, and a process's status,
command line, exe, wchan and threads, parsed as the kernel writes them. Every reader
tolerates a process exiting mid-read (returns None): the host is live while we look at it."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import resource

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


def driver_gpus_info() -> dict[str, dict[str, str]]:
    """The NVIDIA driver's own /proc/driver/nvidia/gpus/<PCI id>/information of each GPU
    (below the settable /proc root), as key -> value ("GPU UUID", "Bus Location", "Device
    Minor", "Model"...), by its directory's name; the first 16 KiB of each, its lines split
    where the kernel ends them (\n: not splitlines' \r, \f)."""
    out: dict[str, dict[str, str]] = {}
    for name in listdir(path("driver", "nvidia", "gpus")) or []:
        text = read_text(path("driver", "nvidia", "gpus", name, "information"), 1 << 14) or ""
        fields: dict[str, str] = {}
        for line in text.split("\n"):
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        out[name] = fields
    return out


def decode(raw: bytes) -> str:
    """Kernel text as str, no byte lost or merged: UTF-8, and each byte that is not UTF-8 a
    lone surrogate U+DC80-U+DCFF (os.fsdecode's way; .encode("utf-8", "surrogateescape")
    gives the bytes back). Names, command lines and cgroup paths are the tenant's bytes."""
    return raw.decode("utf-8", "surrogateescape")


_STAT_HEAD = re.compile(r"\d+ \(")


def parse_stat(text: str) -> tuple[str, int, int] | None:
    r"""(state, ppid, starttime) from /proc/PID/stat: "PID (comm) state ppid ...". comm is
    written raw (no escaping: it may hold ")", spaces, \n), so the fields are what follows
    the last ")"; they are the kernel's own numbers."""
    rest = stat_fields(text)
    if rest is None or len(rest) < 20:
        return None
    try:
        return rest[0], int(rest[1]), int(rest[19])
    except ValueError:
        return None


PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit()
SIGKILL_BIT = 1 << 8  # SIGKILL (9) in /proc/PID/status's SigPnd/ShdPnd masks


def stat_fields(text: str) -> list[str] | None:
    """The fields of /proc/PID/stat after comm (field n of proc(5) at [n - 3]): what
    follows the last ")" (see parse_stat); None when the text is not the kernel's."""
    end = text.rfind(")")
    if end < 0 or not _STAT_HEAD.match(text):
        return None
    return text[end + 1 :].split()


def _field(fields: list[str], n: int) -> int | None:
    """Field n (proc(5)'s numbering) of stat_fields(), when it is a number."""
    return int(fields[n - 3]) if len(fields) > n - 3 and fields[n - 3].isdigit() else None


def stat_flags(text: str) -> int | None:
    """The `flags` field (the 9th) of /proc/PID/stat: the kernel's PF_* bits."""
    return _field(stat_fields(text) or [], 9)


# resident KiB, tasks (status: VmRSS is gone once the kernel has taken the address space)
# and CPU ticks (utime + stime, stat): where an exit's progress shows (core/release.py)
ExitMarks = tuple[int | None, int | None, int | None]


def exit_look(pid: int) -> tuple[bool, ExitMarks]:
    """Whether `pid` is on its way out in the kernel (in do_exit(), PF_EXITING: tearing down
    its address space, e.g. unpinning host memory, before its device files close; or with a
    SIGKILL pending that it has not yet acted on: a zombie leader with a live thread is
    exiting too, PF_EXITING is its), and the marks its exit progresses in; stat and status
    read once each."""
    stat_text = read_text(path(pid, "stat"))
    status_text = read_text(path(pid, "status"))
    fields = stat_fields(stat_text) if stat_text else None
    try:
        status = parse_status(status_text) if status_text else {}
        pending = any(int(status.get(k, "0"), 16) & SIGKILL_BIT for k in ("SigPnd", "ShdPnd"))
    except ValueError:
        status, pending = {}, False
    flags = _field(fields or [], 9)
    utime, stime = _field(fields or [], 14), _field(fields or [], 15)
    rss_kib = (status.get("VmRSS") or "0 kB").split()[0] if status_text else ""
    threads = status.get("Threads", "")
    marks = (int(rss_kib) if rss_kib.isdigit() else None,
             int(threads) if threads.isdigit() else None,
             None if fields is None or len(fields) < 13 else (utime or 0) + (stime or 0))
    return bool(flags is not None and flags & PF_EXITING) or pending, marks


def exiting(pid: int) -> bool:
    """Whether `pid` is on its way out in the kernel (see exit_look)."""
    return exit_look(pid)[0]


_NAME_ESCAPE = re.compile(r"\\([n\\])")


def unescape_name(value: str) -> str:
    r"""A process name as /proc/PID/status writes it, back to the name: the kernel escapes
    only a newline (as \n) and a backslash (as \\): fs/proc/array.c proc_task_name,
    seq_escape_str(..., ESCAPE_SPACE | ESCAPE_SPECIAL, "\n\\"). Every other byte is raw."""
    return _NAME_ESCAPE.sub(lambda m: "\n" if m[1] == "n" else "\\", value)


def parse_status(text: str) -> dict[str, str]:
    r"""/proc/PID/status as key -> value, read as the kernel writes it: lines end at \n
    only (a name may hold \f, \v, \r, \x1c-\x1e, \x85, U+2028/9, tabs and colons, which
    str.splitlines() would take for line breaks), every line is read, the name is all
    that follows "Name:\t" on the first line (unescaped, never stripped), other values are
    all after the key's colon (a tab first: split() them). The kernel writes each key once,
    Name first, every line ended by \n: text that is not so is refused (ValueError, with
    the reason), never half read."""
    lines = text.split("\n")
    if lines[-1]:
        raise ValueError("its last line is not ended")
    if not lines[0].startswith("Name:\t"):
        raise ValueError("its first line is not the name")
    pairs = [line.split(":", 1) for line in lines[1:-1]]
    out = {"Name": unescape_name(lines[0][6:])}
    try:
        out.update(pairs)  # type: ignore[arg-type]  # [key, value] each, else ValueError
    except ValueError:
        raise ValueError("a line without a key") from None
    if len(out) != len(pairs) + 1:
        raise ValueError("a key twice")
    return out


def status_identity(text: str) -> tuple[str, int, tuple[int, ...] | None]:
    """(name, real uid, NSpid or None where the kernel has none) of a status text; the
    ValueError of parse_status, or of a Uid/NSpid that is not numbers, says why not."""
    st = parse_status(text)
    if "Uid" not in st:
        raise ValueError("no Uid line")
    uid = int(st["Uid"].split()[0])
    nspid = tuple(int(x) for x in st["NSpid"].split()) if "NSpid" in st else None
    if nspid == ():
        raise ValueError("an empty NSpid")
    return st["Name"], uid, nspid


def read_status(pid: int) -> ProcStatus | None:
    """What stat and status say of a process; None if it is gone. A status the kernel
    cannot have written (see parse_status) gives a ProcStatus that identifies nothing
    (`refused` says why; no NSpid, so never taken for a container's process)."""
    stat_raw = read_bytes(path(pid, "stat"))
    status_raw = read_bytes(path(pid, "status"))
    if stat_raw is None or status_raw is None:
        return None
    parsed = parse_stat(decode(stat_raw))
    if parsed is None:
        return None
    state, ppid, starttime = parsed
    try:
        name, uid, nspid = status_identity(decode(status_raw))
    except (ValueError, IndexError) as exc:
        return ProcStatus(pid, "?", state, ppid, -1, (), starttime,
                          refused=f"its /proc/PID/status is not as the kernel writes it ({exc})")
    return ProcStatus(pid, name, state, ppid, uid, nspid or (pid,), starttime)


CMDLINE_CAP = 8192  # bytes of a command line read (the kernel gives the whole argv area)
CUT = "\u2026"  # ends the last argument of a command line cut at CMDLINE_CAP


def parse_cmdline(raw: bytes, cap: int = CMDLINE_CAP) -> tuple[str, ...]:
    """/proc/PID/cmdline as its argv: the arguments, each ended by a NUL (the kernel may
    leave out the last one, and a process may rewrite its argv area into anything, NULs
    or none), decoded byte for byte (see decode). More than `cap` bytes: the first `cap`,
    the last argument ending with CUT."""
    cut = len(raw) > cap
    raw = raw[:cap]
    if not raw:
        return ()
    if raw.endswith(b"\0") and not cut:
        raw = raw[:-1]
    args = [decode(a) for a in raw.split(b"\0")]
    if cut:
        args[-1] += CUT
    return tuple(args)


def argv(pid: int) -> tuple[str, ...]:
    """A process's command line as its arguments; () if it has none or is gone."""
    raw = read_bytes(path(pid, "cmdline"), CMDLINE_CAP + 1)
    return parse_cmdline(raw) if raw else ()


def exe(pid: int) -> str | None:
    return readlink(path(pid, "exe"))


def wchan(pid: int) -> str | None:
    text = read_text(path(pid, "wchan"))
    return text.strip() if text and text.strip() not in ("", "0") else None


def one_task(pid: int) -> bool:
    """Whether the thread group of `pid` is its leader alone: the kernel counts the group's
    threads into /proc/PID/task's link count (proc_task_getattr: 2 + get_nr_threads(), a
    zombie leader counted while a thread of it lives), so one stat says what listing task/
    would. False when that cannot be told (gone, or a tree whose directories count links
    otherwise): the caller lists the threads then."""
    try:
        return os.stat(path(pid, "task")).st_nlink == 3
    except OSError:
        return False


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
    except (KeyError, ImportError, OverflowError):
        return str(uid)


def raise_open_files_limit() -> None:
    """One pidfd per holder is open at once: 5,000 holders need more than the usual 1,024.
    Raised at a run's start, before its workers fork; here, as host/pidfds.py is imported by
    the stop loop only."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
