"""A forked worker for every read that can hang in the kernel.

A `stat()` through a process's fd on a FUSE or hard-NFS mount that never answers, reading
/proc/PID/maps of a process wedged in the GPU driver, an NVML call stuck in the kernel: none of
these can be interrupted from inside the process that makes them. So pveclean makes them in a
child forked from itself (no new interpreter: start-up stays a fork), reads each answer through
a pipe with a deadline and a size bound, and SIGKILLs the child when the deadline passes or
when it stops making progress. The parent keeps the pidfds and sends every signal; the worker
only reads, so a killed worker loses nothing but time.

Protocol: the parent sends one pickled request (a module-level function and its arguments);
the child answers with zero or more notes ("reading PID 4242", with how long that step may
take) and then one result or error. A note that is not followed by another message within its
allowance is a stall: the parent kills the worker and says what it was doing. A worker made
with `marks` can say what it is on without a message (mark(): a page both share), for scans
of thousands of processes; the parent looks at it while it waits, and a mark that does not
change for the receive()'s `stall` is a stall too.

Errors cross whole, as psutil's exceptions cross processes: the worker sends the exception
object itself (pickled: pveclean's exception types pickle with their fields), with its type's
name and its text. The parent raises RemoteError, the one type a caller catches for "the
function raised there" (proxmoxer-style): `.exc` is the original exception (also the
RemoteError's `__cause__`), `.type_name` and `.text` what the worker said of it; str() is
`Type: text`, as ever. An exception that does not pickle (nor unpickle, in the worker or the
parent) crosses as its type name and text alone, `.exc` None. A caller that wants the
admin's message of an error it expects asks `exc.message(ReportError)`: the text for one of
those types, `Type: text` for anything else (a bug is named by its type). The worker's own
failures (it hung, stalled, died) are WorkerError, whose `what` and `why` are its fields.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import pickle
import select
import signal
import struct
import time
from collections.abc import Callable

# the errors a call ends in; callers import them from here
from pveclean.host.crossing import Note, arrived, crossing
from pveclean.host.crossing import RemoteError as RemoteError
from pveclean.host.crossing import WorkerError as WorkerError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypedDict, TypeVar, Unpack

    from pveclean.core.gpufaults import Known
    from pveclean.host.nvml import Nvml

    T = TypeVar("T")

    class State(TypedDict, total=False):
        """Per-worker state that lives across calls, by the module each key belongs to."""

        nvml_library: str | None  # nvml.py: the session's settings (Nvml.settings)
        nvml_timeout: float
        nvml: Nvml  # nvml.py: the session, made on first use (Nvml.in_worker)
        capped: dict[tuple[int, int], list[str]]  # procscan.py: processes past a cap
        gpu_known: Known  # commands/gpulook.py: each GPU's last UUID, name and bus id (issue 38)


MAX_ANSWER = 256 * 1024 * 1024  # bytes: 5,000 holders with 8 KiB command lines fit
_HEADER = struct.Struct("<QB")  # length of the body, kind
NOTE, RESULT, ERROR = 1, 2, 3
REAP_WAIT = 0.2  # s to wait for a killed worker to go; one stuck in D state is left behind
READ_AHEAD = 1 << 16  # bytes of answers read at once
PIPE_SIZE = 1 << 20  # the answers' pipe (F_SETPIPE_SZ; the default is 64 KiB): a worker's
# notes wait there while the parent does something else, instead of blocking the worker


# ---- the child side ---------------------------------------------------------------------
_out_fd = -1
_state: State = {}
_marks: mmap.mmap | None = None  # the worker's page for mark(), if its parent made one
_mark_seq = 0
MARK = struct.Struct("<QQ")  # how many marks so far, the last one


def note(what: Note, allowance: float | None) -> None:
    """From a function running in the worker: say what comes next and how long it may take
    (None: no limit of its own, only the call's deadline)."""
    if _out_fd >= 0:
        _send(_out_fd, NOTE, (what, allowance))


def mark(key: int) -> None:
    """From a function running in the worker: say it works on `key` (a PID) now, without a
    message: a shared page the parent reads only when the worker is slow (see Worker.marks).
    For scans of thousands of processes, where a note for each cost more than the reads."""
    global _mark_seq
    if _marks is not None:
        _mark_seq += 1
        MARK.pack_into(_marks, 0, _mark_seq, key)


def park_self() -> None:
    """From a function running in the worker that gave up on a thread stuck in the kernel (an
    NVML call past its timeout, see nvml.py): move the worker out of the run's cgroup now,
    while its main thread still runs. Once the worker is killed its main thread is a zombie
    that cannot be moved and, while the stuck thread lives, keeps the cgroup from emptying:
    under the drop-in that is the unit's, which systemd then holds "stopping" up to
    TimeoutStopSec= (see cgroupfs.park). Nothing in a process that is not a worker."""
    if _out_fd >= 0:
        from pveclean.host import cgroupfs

        cgroupfs.park(os.getpid())


def state() -> State:
    """Per-worker state that lives across calls (the NVML session)."""
    return _state


def _send(fd: int, kind: int, value: object) -> None:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(_HEADER.pack(len(body), kind) + body)
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _serve(req_fd: int, out_fd: int, init: State,
           prelude: Callable[[], object] | None, marks: mmap.mmap | None = None) -> None:
    global _out_fd, _marks
    _out_fd, _marks = out_fd, marks
    _state.update(init)
    if prelude is not None:
        with contextlib.suppress(Exception):  # what it failed at stays in the state
            prelude()
    while True:
        head = _read_exact(req_fd, _HEADER.size)
        if head is None:
            return  # the parent closed the pipe: done
        size, _kind = _HEADER.unpack(head)
        body = _read_exact(req_fd, size)
        if body is None:
            return
        fn, args = pickle.loads(body)
        try:
            value = fn(*args)
        except BaseException as exc:  # reported to the parent, which decides
            import traceback

            text = str(exc) or "".join(traceback.format_exception_only(type(exc), exc)).strip()
            _send(out_fd, ERROR, (type(exc).__name__, text, crossing(exc)))
            continue
        _send(out_fd, RESULT, value)


# ---- the parent side --------------------------------------------------------------------
class Worker:
    """One forked reader, started on the first call and again after a kill.

    `prelude` runs in the first child right after the fork, before it reads a request:
    start-up work (importing nvidia-ml-py, see prelude.py) that overlaps what the parent does
    until its first call. Its notes reach that call, which they bound as its own do."""

    def __init__(self, prelude: Callable[[], object] | None = None, marks: bool = False,
                 **init: Unpack[State]) -> None:
        self.init: State = init  # copied into the child's state()
        self.prelude = prelude
        # with `marks`: a page shared with the child, see mark()
        self._marks: mmap.mmap | None = None
        if marks:

            self._marks = mmap.mmap(-1, MARK.size)  # anonymous and shared across fork
        self._stall: float | None = None  # of the receive() under way, for marks
        self._mark_seen = (0, 0.0)  # the last count of marks seen to change, and when
        self._pending: list[bool] = []  # per request sent, oldest first: is its answer wanted
        self._rbuf = bytearray()  # answers read ahead, not yet taken
        self.pid: int | None = None
        self._req = self._resp = -1
        self.started = 0  # how many children were forked (1 unless one was killed)
        self.killed: list[str] = []  # why each killed one was killed

    def _start(self) -> None:
        req_r, req_w = os.pipe2(os.O_CLOEXEC)
        try:
            resp_r, resp_w = os.pipe2(os.O_CLOEXEC)
        except OSError:
            os.close(req_r)
            os.close(req_w)
            raise
        if self._marks is not None:
            MARK.pack_into(self._marks, 0, 0, 0)  # a new child counts from 0
        try:
            pid = os.fork()
        except OSError:  # out of processes or memory: no fd is left behind
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            raise
        if pid == 0:  # the child: never returns
            code = 0
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                # stdio to /dev/null: a worker stuck in the kernel must not keep the task
                # log's pipe open (Proxmox reads it to the end). Every other inherited fd is
                # closed, above all the container lock's, so it never keeps the lock either.
                null = os.open(os.devnull, os.O_RDWR)
                for std in (0, 1, 2):
                    os.dup2(null, std)
                keep = sorted({req_r, resp_w})
                os.closerange(3, keep[0])
                os.closerange(keep[0] + 1, keep[1])
                os.closerange(keep[1] + 1, os.sysconf("SC_OPEN_MAX"))
                _serve(req_r, resp_w, self.init, self.prelude, self._marks)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(req_r)
        os.close(resp_w)
        with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: the default
            fcntl.fcntl(resp_r, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.pid, self._req, self._resp = pid, req_w, resp_r
        self._rbuf = bytearray()
        self.started += 1
        self.prelude = None  # a restarted worker starts bare

    def start(self) -> Worker:
        """Fork now rather than on the first call (so that a prelude starts now)."""
        if self.pid is None:
            self._start()
        return self

    def call(
        self,
        fn: Callable[..., T],
        *args: object,
        timeout: float,
        what: str,
        on_note: Callable[[Note], None] | None = None,
    ) -> T:
        """fn(*args) in the worker. Raises WorkerError when it does not answer within
        `timeout` or stalls past a note's allowance (the worker is then killed), RemoteError
        when fn raised there. Answers to earlier submit()s are read past within the same
        bounds: their notes count as this call's."""
        end = time.monotonic() + max(timeout, 0.0)
        self.send(fn, *args, timeout=timeout, what=what)
        value: T = self.receive(end - time.monotonic(), what, on_note)
        return value

    def send(self, fn: Callable[..., object], *args: object, timeout: float, what: str
             ) -> None:
        """The first half of call(): send fn(*args) and go on; receive() waits for its
        answer (so that two workers can work at once)."""
        self._request(fn, args, timeout, what, wanted=True)

    def submit(self, fn: Callable[..., object], *args: object, timeout: float, what: str
               ) -> None:
        """Send fn(*args) and go on: work whose answer nobody waits for (NVML's init), done
        while the parent does something else. The next receive reads past its answer."""
        self._request(fn, args, timeout, what, wanted=False)

    def forget(self) -> None:
        """Nobody will receive the answers sent for so far: the next receive reads past them."""
        self._pending = [False] * len(self._pending)

    def receive(self, timeout: float, what: str,
                on_note: Callable[[Note], None] | None = None, stall: float | None = None
                ) -> Any:
        """The answer to the oldest send() not yet received (see call()). `stall`: with
        marks, how long the child may work on one mark() before it counts as stalled (the
        mark is then the error's note, ("pid", key))."""
        end = time.monotonic() + max(timeout, 0.0)
        if True not in self._pending:
            raise RuntimeError(f"{what}: receive() without a send()")  # a bug of the caller
        self._stall = stall if self._marks is not None else None
        if self._stall is not None and self._marks is not None:
            self._mark_seen = (MARK.unpack_from(self._marks)[0], time.monotonic())
        last_note: Note | None = None
        try:
            step_end = end
            while True:
                kind, value = self._read_message(step_end, end, what, last_note)
                if kind == NOTE:
                    last_note, allowance = value
                    if on_note is not None:
                        on_note(last_note)
                    now = time.monotonic()
                    step_end = end if allowance is None else min(end, now + allowance)
                    continue
                if not self._pending.pop(0):
                    continue  # a submit()'s answer: nobody waits for it
                if kind == ERROR:
                    err = arrived(*value)
                    raise err from err.exc
                return value
        except WorkerError as exc:
            self.kill(str(exc))
            exc.note = exc.note if exc.note is not None else last_note
            raise

    def _request(self, fn: Callable[..., object], args: tuple[object, ...], timeout: float,
                 what: str, wanted: bool) -> None:
        if self.pid is None:
            self._start()
        body = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._write(_HEADER.pack(len(body), 0) + body, time.monotonic() + timeout, what)
        except WorkerError as exc:
            self.kill(str(exc))
            raise
        self._pending.append(wanted)

    def _write(self, data: bytes, end: float, what: str) -> None:
        view = memoryview(data)
        poller = select.poll()
        poller.register(self._req, select.POLLOUT)
        while view:
            left = end - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise WorkerError(what, "the worker did not take the request in time")
            try:
                n = os.write(self._req, view[: 1 << 16])
            except BrokenPipeError:
                raise WorkerError(what, "the worker died") from None
            view = view[n:]

    def _read_exact(self, n: int, step_end: float, end: float, what: str,
                    last_note: Note | None) -> bytes:
        """n bytes of the answers, read ahead in large chunks: a scan of thousands of
        processes sends a note for each, and two system calls per note were most of it."""
        buf = self._rbuf
        poller: select.poll | None = None
        while len(buf) < n:
            if poller is None:
                poller = select.poll()
                poller.register(self._resp, select.POLLIN)
            left = step_end - time.monotonic()
            wait = left if self._stall is None else min(left, self._stall / 2)
            if left <= 0 or not poller.poll(wait * 1000):
                if self._stall is not None:
                    last_note = self._check_marks(left, what) or last_note
                    if left > 0:
                        continue
                if step_end < end:
                    raise WorkerError(what, "stalled", last_note, stalled=True)
                raise WorkerError(what, "did not finish in time", last_note)
            chunk = os.read(self._resp, min(max(n - len(buf), READ_AHEAD), 1 << 20))
            if not chunk:
                raise WorkerError(what, "the worker died", last_note)
            buf += chunk
        out = bytes(buf[:n])
        del buf[:n]  # bytearray drops its head in place
        return out

    def _check_marks(self, left: float, what: str) -> Note | None:
        """While waiting: has the child moved on since the last look? Raises the stall when
        it has stayed on one mark for `_stall`; returns what it is on (None: no mark yet)."""
        assert self._stall is not None and self._marks is not None
        seq, key = MARK.unpack_from(self._marks)
        note = ("pid", key) if seq else None
        now = time.monotonic()
        if seq != self._mark_seen[0]:
            self._mark_seen = (seq, now)
        elif left > 0 and seq and now - self._mark_seen[1] >= self._stall:
            raise WorkerError(what, "stalled", note, stalled=True)
        return note

    def _read_message(self, step_end: float, end: float, what: str,
                      last_note: Note | None) -> tuple[int, Any]:
        head = self._read_exact(_HEADER.size, step_end, end, what, last_note)
        size, kind = _HEADER.unpack(head)
        if size > MAX_ANSWER:
            raise WorkerError(what, f"answer of {size} bytes is over the {MAX_ANSWER} bound",
                              last_note)
        body = self._read_exact(size, step_end, end, what, last_note)
        return kind, pickle.loads(body)

    def kill(self, why: str = "done") -> None:
        """SIGKILL the worker and reap it if it goes within REAP_WAIT. A process stuck in an
        uninterruptible driver call may not (it holds no lock and no pidfd). So a worker
        killed busy (a call timed out, or a request is still unanswered) is first parked
        outside pveclean's cgroup (cgroupfs.park), where it dies when the kernel lets it: once
        SIGKILL has made its main thread a zombie, a thread stuck in the kernel can no longer
        be moved, and it would keep the cgroup from emptying. An idle worker exits at once."""
        pid = self.pid
        if pid is None:
            return
        if why != "done":
            self.killed.append(why)
        if why != "done" or self._pending:  # it may be stuck: a cgroup write, only here
            from pveclean.host import cgroupfs

            cgroupfs.park(pid)
        self.pid = None
        self._pending = []
        for fd in (self._req, self._resp):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._req = self._resp = -1
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        try:
            if pidfd >= 0:  # wake the moment it is gone: no polling sleep on every run
                poller = select.poll()
                poller.register(pidfd, select.POLLIN)
                poller.poll(REAP_WAIT * 1000)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def close(self) -> None:
        self.kill("done")

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
