"""Host-side tests of the static ``holder`` program (tests/harness/holder/holder.c)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import stat
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "lab_holder", Path(__file__).resolve().parent.parent / "harness" / "holder.py"
)
assert _spec is not None and _spec.loader is not None
lab_holder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_holder)
build_holder: Callable[[Path], Path] = lab_holder.build_holder

DEV_NULL_RDEV = os.stat("/dev/null").st_rdev
DEV_ZERO_RDEV = os.stat("/dev/zero").st_rdev

Spawn = Callable[..., subprocess.Popen[bytes]]


# ---------------------------------------------------------------- helpers


def wait_for(pred: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie (orphans may be left unreaped by PID 1)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return text.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(x) for x in text.split()]


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().rstrip("\n")


def fd_rdevs(pid: int) -> list[int]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            out.append(os.stat(f"/proc/{pid}/fd/{fd}").st_rdev)
    return out


def fd_flags(pid: int, target: str) -> list[int]:
    """open(2) flags of pid's fds that point at target, from /proc/PID/fdinfo."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        if os.readlink(f"/proc/{pid}/fd/{fd}") != target:
            continue
        for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
            if line.startswith("flags:"):
                out.append(int(line.split()[1], 8))
    return out


def maps_paths(pid: int) -> list[str]:
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return [line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6]


def read_ready(path: Path, lines: int = 1, timeout: float = 5.0) -> list[tuple[int, str]]:
    def complete() -> bool:
        return path.exists() and path.read_text().count("\n") >= lines

    wait_for(complete, timeout, f"{lines} line(s) in {path}")
    out = []
    for line in path.read_text().splitlines():
        pid, name = line.split(" ", 1)
        out.append((int(pid), name))
    return out


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def holder_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_holder(tmp_path_factory.mktemp("holder"))


@pytest.fixture
def spawn(holder_bin: Path, tmp_path: Path) -> Iterator[Spawn]:
    """Start holder through a symlink; everything started is SIGKILLed by process group."""
    procs: list[subprocess.Popen[bytes]] = []
    log = (tmp_path / "holder.log").open("wb")

    def start(
        *args: str, name: str = "vllm-worker", stderr: int | None = None
    ) -> subprocess.Popen[bytes]:
        link = tmp_path / "bin" / name
        if not link.exists():
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(holder_bin)
        # stdin is a pipe and stdout/stderr a log file, so no fd points at /dev/null by accident
        proc = subprocess.Popen(
            [str(link), "--exit-after", "120", *args],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log if stderr is None else stderr,
            start_new_session=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stdin:
            proc.stdin.close()
        if proc.stderr:
            proc.stderr.close()
    log.close()


# ---------------------------------------------------------------- build


def test_binary_is_static(holder_bin: Path) -> None:
    data = holder_bin.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # ELF64
    phoff = struct.unpack_from("<Q", data, 32)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    assert 3 not in types, "PT_INTERP present: binary is dynamically linked"


def test_build_is_skipped_when_up_to_date(holder_bin: Path) -> None:
    before = holder_bin.stat().st_mtime_ns
    time.sleep(0.01)
    assert build_holder(holder_bin.parent) == holder_bin
    assert holder_bin.stat().st_mtime_ns == before


def test_build_without_gcc_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match="gcc not found"):
        build_holder(tmp_path / "out")


def test_build_without_static_libc_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fakebin" / "gcc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '/usr/bin/ld: cannot find -lc: No such file' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(RuntimeError, match="libc6-dev"):
        build_holder(tmp_path / "out")
    assert not (tmp_path / "out" / "holder").exists()


# ---------------------------------------------------------------- behaviour


@pytest.mark.parametrize("name", ["vllm-worker", "python3", "nccl-helper"])
def test_comm_is_symlink_name(spawn: Spawn, tmp_path: Path, name: str) -> None:
    ready = tmp_path / "ready"
    proc = spawn("--ready", str(ready), name=name)
    assert read_ready(ready) == [(proc.pid, name)]
    assert comm(proc.pid) == name


def test_ready_appends_pid_and_name(spawn: Spawn, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.write_text("1 earlier-worker\n")
    proc = spawn("--name", "gpu-job", "--ready", str(ready))
    read_ready(ready, lines=2)
    assert ready.read_text() == f"1 earlier-worker\n{proc.pid} gpu-job\n"
    assert comm(proc.pid) == "gpu-job"
    assert oct(ready.stat().st_mode & 0o777) == oct(0o644)


def test_hold_keeps_fd_open(spawn: Spawn, tmp_path: Path) -> None:
    plain = spawn("--ready", str(tmp_path / "r0"))
    read_ready(tmp_path / "r0")
    assert DEV_NULL_RDEV not in fd_rdevs(plain.pid)  # control: nothing held without --hold

    proc = spawn("--hold", "/dev/null", "--hold", "/dev/zero", "--ready", str(tmp_path / "r1"))
    read_ready(tmp_path / "r1")
    rdevs = fd_rdevs(proc.pid)
    assert DEV_NULL_RDEV in rdevs
    assert DEV_ZERO_RDEV in rdevs
    # O_RDWR succeeded on /dev/null, and the fd is not close-on-exec (children inherit it)
    (flags,) = fd_flags(proc.pid, "/dev/null")
    assert flags & os.O_ACCMODE == os.O_RDWR
    assert not flags & os.O_CLOEXEC


def test_map_keeps_mapping_without_fd(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn("--map", "/dev/zero", "--ready", str(tmp_path / "r"))
    read_ready(tmp_path / "r")
    assert "/dev/zero" in maps_paths(proc.pid)
    assert DEV_ZERO_RDEV not in fd_rdevs(proc.pid)


def test_fake_gpu_node(spawn: Spawn, tmp_path: Path) -> None:
    """The lab's fake /dev/nvidiaN: a char node with /dev/zero's device number (1:5)."""
    node = tmp_path / "nvidia0"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, DEV_ZERO_RDEV)
    except PermissionError:
        pytest.skip("mknod of a char device needs root (CAP_MKNOD)")
    holder = spawn("--hold", str(node), "--ready", str(tmp_path / "r1"))
    mapper = spawn("--map", str(node), "--ready", str(tmp_path / "r2"))
    read_ready(tmp_path / "r1")
    read_ready(tmp_path / "r2")
    assert fd_flags(holder.pid, str(node)) != []
    assert str(node) in maps_paths(mapper.pid)
    assert fd_flags(mapper.pid, str(node)) == []


def test_children_inherit_holds(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn(
        "--hold",
        "/dev/null",
        "--map",
        "/dev/zero",
        "--children",
        "2",
        "--child-name",
        "nccl-helper",
        "--ready",
        str(tmp_path / "r"),
    )
    assert read_ready(tmp_path / "r") == [(proc.pid, "vllm-worker")]
    kids = children(proc.pid)
    assert len(kids) == 2
    for kid in kids:
        assert comm(kid) == "nccl-helper"  # already set when ready is written
        assert DEV_NULL_RDEV in fd_rdevs(kid)
        assert "/dev/zero" in maps_paths(kid)
        os.kill(kid, signal.SIGTERM)
    wait_for(lambda: not any(alive(k) for k in kids), what="children to exit on SIGTERM")
    wait_for(lambda: children(proc.pid) == [], what="parent to reap its children")
    assert proc.poll() is None


def test_children_ignore_term_too(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn("--children", "1", "--ignore-term", "--ready", str(tmp_path / "r"))
    read_ready(tmp_path / "r")
    (kid,) = children(proc.pid)
    assert comm(kid) == "vllm-worker"
    os.kill(kid, signal.SIGTERM)
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.4)
    assert alive(kid) and proc.poll() is None


def test_sigterm_exits_zero(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn("--hold", "/dev/null", "--ready", str(tmp_path / "r"))
    read_ready(tmp_path / "r")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=5) == 0


def test_ignore_term_survives_sigterm(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn("--ignore-term", "--ready", str(tmp_path / "r"))
    read_ready(tmp_path / "r")
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=5) == -signal.SIGKILL


def test_term_delay(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn("--term-delay", "300", "--ready", str(tmp_path / "r"))
    read_ready(tmp_path / "r")
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.1)
    assert proc.poll() is None  # still shutting down
    assert proc.wait(timeout=5) == 0
    assert 0.25 <= time.monotonic() - start < 3


def test_exit_after_also_stops_children(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn(
        "--children", "1", "--ignore-term", "--exit-after", "1", "--ready", str(tmp_path / "r")
    )
    read_ready(tmp_path / "r")
    (kid,) = children(proc.pid)
    assert proc.wait(timeout=5) == 0
    wait_for(lambda: not alive(kid), timeout=5, what="child to exit by itself")


def test_respawn(spawn: Spawn, tmp_path: Path) -> None:
    ready = tmp_path / "r"
    sup = spawn(
        "--respawn",
        "2",
        "--hold",
        "/dev/null",
        "--map",
        "/dev/zero",
        "--child-name",
        "python3",
        "--ready",
        str(ready),
    )
    workers = []
    for n in (1, 2, 3):
        lines = read_ready(ready, lines=n)
        assert len(lines) == n
        pid, name = lines[-1]
        assert name == "python3"
        assert children(sup.pid) == [pid]
        assert DEV_NULL_RDEV in fd_rdevs(pid)
        assert "/dev/zero" in maps_paths(pid)
        workers.append(pid)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not alive(workers[-1]), what="worker to be reaped")
    assert len(set(workers)) == 3
    # the supervisor itself holds nothing and, respawns exhausted, starts no 4th worker
    assert comm(sup.pid) == "vllm-worker"
    assert DEV_NULL_RDEV not in fd_rdevs(sup.pid)
    assert "/dev/zero" not in maps_paths(sup.pid)
    time.sleep(0.5)
    assert children(sup.pid) == []
    assert len(ready.read_text().splitlines()) == 3
    os.kill(sup.pid, signal.SIGTERM)
    assert sup.wait(timeout=5) == 0


def test_pidns(spawn: Spawn, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("--pidns needs root (unshare(CLONE_NEWPID) requires CAP_SYS_ADMIN)")
    outer = spawn(
        "--pidns", "--hold", "/dev/null", "--ready", str(tmp_path / "r"), stderr=subprocess.PIPE
    )
    try:
        lines = read_ready(tmp_path / "r", timeout=3)
    except AssertionError:
        if outer.poll() == 2 and outer.stderr and b"unshare" in outer.stderr.read():
            pytest.skip("--pidns: unshare(CLONE_NEWPID) not permitted here")
        raise
    assert lines == [(2, "vllm-worker")]  # getpid() inside the namespace
    (init,) = children(outer.pid)
    (holder,) = children(init)

    def nspid(pid: int) -> list[int]:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
        raise AssertionError("no NSpid line")

    assert nspid(init) == [init, 1]
    assert nspid(holder) == [holder, 2]
    assert DEV_NULL_RDEV in fd_rdevs(holder)
    os.kill(outer.pid, signal.SIGTERM)  # forwarded outer -> init -> holder
    assert outer.wait(timeout=5) == 0
    assert not alive(holder) and not alive(init)


def test_pidns_ignore_term(spawn: Spawn, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("--pidns needs root (unshare(CLONE_NEWPID) requires CAP_SYS_ADMIN)")
    outer = spawn("--pidns", "--ignore-term", "--ready", str(tmp_path / "r"))
    read_ready(tmp_path / "r")
    (init,) = children(outer.pid)
    (holder,) = children(init)
    os.kill(outer.pid, signal.SIGTERM)
    time.sleep(0.4)
    assert outer.poll() is None and alive(init) and alive(holder)
    os.kill(holder, signal.SIGKILL)  # init exits with its child; outer exits with init
    assert outer.wait(timeout=5) == 128 + signal.SIGKILL


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hold", "/nonexistent/gpu0"], "holder: /nonexistent/gpu0: No such file or directory"),
        (["--map", "/nonexistent/gpu0"], "holder: /nonexistent/gpu0: No such file or directory"),
        (["--map", "/dev/null"], "holder: mmap /dev/null: No such device"),
        (["--bogus"], "holder: unknown option --bogus: Invalid argument"),
        (["--children", "two"], "holder: --children two: Invalid argument"),
        (["--hold"], "holder: --hold: missing argument: Invalid argument"),
    ],
)
def test_errors_exit_2(spawn: Spawn, args: list[str], message: str) -> None:
    proc = spawn(*args, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=5)
    assert proc.returncode == 2
    assert err.decode() == message + "\n"
