"""The distinct fd tables of one thread group. A thread that called unshare(CLONE_FILES)
(or was cloned without CLONE_FILES) has a table of its own, listed only under
/proc/PID/task/TID/fd: a GPU fd there is in no table /proc/PID/fd shows. Threads that share a
table are told apart by the kernel's own answer, kcmp(KCMP_FILES), so each table is read
once however many threads share it (a zombie leader with 1,500 threads on one table: one
read, not 1,500)."""

from __future__ import annotations

import os

from pveclean.host import procfs, statx

KCMP_FILES = 2
SYS_KCMP = {"x86_64": 312, "aarch64": 272}
MAX_TABLES = 64  # distinct fd tables read per process besides the leader's; the rest: not judged
MAX_THREADS = 65536  # threads compared per process (a kcmp each, about 1 us)


_NR: list[int | None] = []  # kcmp's number on this machine, once looked up


def same_files(pid: int, tid: int) -> bool | None:
    """Whether tasks `pid` and `tid` share one fd table (kcmp KCMP_FILES): None when the
    kernel cannot say (no kcmp, or a task gone)."""
    if not _NR:
        _NR.append(SYS_KCMP.get(os.uname().machine))
    nr = _NR[0]
    lib = statx._load()
    if nr is None or lib is False:
        return None
    import ctypes

    got = lib.syscall(ctypes.c_long(nr), ctypes.c_int(pid), ctypes.c_int(tid),
                      ctypes.c_int(KCMP_FILES), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if got < 0:
        return None
    return int(got) == 0


class NoKcmp(Exception):
    """kcmp is not there (a kernel without CONFIG_KCMP): tables cannot be told apart."""


_WORKS: list[bool] = []


def _kcmp_works() -> bool:
    """Whether kcmp answers here (asked once per process: a kernel has it or not)."""
    if not _WORKS:
        me = os.getpid()
        _WORKS.append(same_files(me, me) is True)
    return _WORKS[0]


def other_tables(pid: int, unjudged: list[str]) -> list[str]:
    """The /proc/PID/task/TID bases of the fd tables of `pid`'s threads that are not the
    leader's table, one base per distinct table. Past MAX_TABLES (or MAX_THREADS) the rest is
    named in `unjudged`. Without kcmp: every thread's table when the leader's is gone (the
    old rule), else none, and said."""
    names = procfs.listdir(procfs.path(pid, "task"))
    tids = sorted(int(t) for t in names or () if t.isdigit() and t != str(pid))
    if not tids:
        return []
    if not _kcmp_works():
        raise NoKcmp
    reps: list[int] = [pid]
    out: list[str] = []
    for i, tid in enumerate(tids):
        if i >= MAX_THREADS:
            unjudged.append(f"more than {MAX_THREADS} threads: the fd tables of those past "
                            "them not judged")
            break
        if any(same_files(rep, tid) for rep in _order(reps)):
            continue
        if not os.path.isdir(procfs.path(pid, "task", tid, "fd")):
            continue  # exited while we looked (kcmp said no: it was gone)
        if len(out) >= MAX_TABLES:
            unjudged.append(f"more than {MAX_TABLES} fd tables of its own among its threads: "
                            "those past them not judged")
            break
        reps.append(tid)
        out.append(procfs.path(pid, "task", tid))
    return out


def _order(reps: list[int]) -> list[int]:
    """The tables found last first, the leader's first of all (most threads share it)."""
    return [reps[0], *reversed(reps[1:])]
