r"""host/procfs and host/cgroupfs read kernel text as the kernel writes it: each parser is fed
what a small renderer here writes the way fs/proc/array.c (status, stat), fs/proc/base.c
(cmdline), kernel/cgroup/cgroup.c (cgroup) and fs/proc_namespace.c (mounts) do, for names,
command lines, cgroup names and mount points holding every byte the kernel lets through,
and must give back exactly the values put in. No forged line ("\fNSpid:\t1" in a name,
"\f0::/lxc/130/ns" in a v1 cgroup name) changes the NSpid, Uid, PPid or cgroup the kernel
states. The renderers are checked against the real kernel too (a process renaming itself)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pveclean.core.records import in_tree
from pveclean.host import cgroupfs, procfs

# Bytes a reader splitting on more than "\n" breaks at, the two the kernel escapes in a name,
# and text that looks like the kernel's own lines.
TRICKY = [b"\n", b"\\", b"\\n", b"\f", b"\v", b"\r", b"\r\n", b"\x1c", b"\x1d", b"\x1e",
          b"\x85", "\x85".encode(), "\u2028".encode(), "\u2029".encode(), b"\t", b":", b" ",
          b")", b"(", b"NSpid:\t1", b"Uid:\t0", b"0::/lxc/130/ns", b"\xff", b"\xc3",
          b"\xed\xa0\x80"]


def _bytes_without(forbidden: bytes, max_size: int) -> st.SearchStrategy[bytes]:
    piece = st.sampled_from(TRICKY) | st.binary(min_size=1, max_size=4)
    return st.lists(piece, max_size=8).map(
        lambda parts: bytes(b for b in b"".join(parts) if b not in forbidden)[:max_size])


COMM = _bytes_without(b"\0", 15)  # TASK_COMM_LEN - 1: prctl and /proc/PID/comm cut there
ARG = _bytes_without(b"\0", 40)
CGROUP_NAME = _bytes_without(b"\0/\n", 40).filter(lambda n: n not in (b"", b".", b".."))
MOUNT_POINT = st.lists(_bytes_without(b"\0/", 20).filter(lambda n: n not in (b"", b".", b"..")),
                       min_size=1, max_size=3).map(lambda names: b"/" + b"/".join(names))
PIDS = st.integers(min_value=1, max_value=4_194_304)


def render_status(comm: bytes, pid: int, ppid: int, uid: int, nspid: tuple[int, ...]) -> bytes:
    r"""/proc/PID/status as proc_pid_status writes it: the name first, escaped as
    proc_task_name does (seq_escape_str(..., ESCAPE_SPACE | ESCAPE_SPECIAL, "\n\\"): only
    \n and \\), then task_state's lines in their order, then the rest."""
    name = comm.replace(b"\\", b"\\\\").replace(b"\n", b"\\n")
    ns = "\t".join(map(str, nspid))
    tail = (f"Umask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\n"
            f"PPid:\t{ppid}\nTracerPid:\t0\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
            f"Gid:\t{uid}\t{uid}\t{uid}\t{uid}\nFDSize:\t64\nGroups:\t44 \nNStgid:\t{ns}\n"
            f"NSpid:\t{ns}\nNSpgid:\t{ns}\nNSsid:\t{ns}\nKthread:\t0\n"
            "VmPeak:\t    9876 kB\nVmRSS:\t    1234 kB\nThreads:\t1\nSigQ:\t0/63704\n"
            "SigBlk:\t0000000000000000\nCapEff:\t000001ffffffffff\nNoNewPrivs:\t0\n"
            "Seccomp:\t0\nSpeculation_Store_Bypass:\tthread vulnerable\n"
            "Cpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n"
            "voluntary_ctxt_switches:\t5\nnonvoluntary_ctxt_switches:\t0\n")
    return b"Name:\t" + name + b"\n" + tail.encode()


def render_stat(comm: bytes, pid: int, ppid: int, starttime: int, state: str = "S") -> bytes:
    """/proc/PID/stat as do_task_stat writes it: comm raw in parentheses, 52 fields."""
    rest = [state, str(ppid), str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12
    rest += [str(starttime)] + ["0"] * 30
    return f"{pid} (".encode() + comm + b") " + " ".join(rest).encode() + b"\n"


def render_cgroup(v1: dict[str, bytes], v2: bytes) -> bytes:
    """/proc/PID/cgroup of a hybrid host as proc_cgroup_show writes it: the v1 hierarchies'
    lines, then the v2 one ("0::"); paths raw."""
    lines = [f"{i}:{ctl}:".encode() + path + b"\n" for i, (ctl, path) in
             enumerate(v1.items(), start=1)]
    return b"".join(reversed(lines)) + b"0::" + v2 + b"\n"


def mangle(field: bytes) -> bytes:
    r"""fs/proc_namespace.c mangle(): a space, tab, \n and backslash as \ooo."""
    return b"".join(b"\\%03o" % c if c in b" \t\n\\" else bytes([c]) for c in field)


def exact(raw: bytes) -> str:
    return procfs.decode(raw)


# ---- status and stat ----------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(comm=COMM, pid=PIDS, ppid=PIDS, uid=st.integers(0, 2**32 - 2),
       nspid=st.lists(PIDS, min_size=1, max_size=4).map(tuple))
@example(comm=b"x\fNSpid:\t1", pid=4242, ppid=4000, uid=100000, nspid=(4242, 17))
@example(comm=b"\fNSpid:\t1\t7", pid=4000, ppid=3990, uid=100000, nspid=(4000, 1))
@example(comm=b"\x85Uid:\t0\x1cNSpid:\t1", pid=5, ppid=4, uid=100000, nspid=(5, 2))
@example(comm=b"a\\n\nb\\", pid=5, ppid=4, uid=0, nspid=(5,))
def test_status_gives_back_the_name_and_the_kernels_identity(
        comm: bytes, pid: int, ppid: int, uid: int, nspid: tuple[int, ...]) -> None:
    text = exact(render_status(comm, pid, ppid, uid, nspid))
    name, got_uid, got_nspid = procfs.status_identity(text)
    assert name == exact(comm) and name.encode("utf-8", "surrogateescape") == comm
    assert (got_uid, got_nspid) == (uid, nspid)
    fields = procfs.parse_status(text)
    assert fields["PPid"] == f"\t{ppid}" and fields["Tgid"] == f"\t{pid}"


@settings(max_examples=300, deadline=None)
@given(comm=COMM, pid=PIDS, ppid=PIDS, starttime=st.integers(0, 2**63 - 1),
       state=st.sampled_from("RSDZTtXI"))
@example(comm=b") R 1 1 1 0", pid=9, ppid=3, starttime=77, state="S")
@example(comm=b"a)\n(b", pid=9, ppid=3, starttime=77, state="D")
def test_stat_gives_back_state_ppid_and_starttime(comm: bytes, pid: int, ppid: int,
                                                  starttime: int, state: str) -> None:
    assert procfs.parse_stat(exact(render_stat(comm, pid, ppid, starttime, state))) == (
        state, ppid, starttime)


def test_read_status_of_a_forged_name_keeps_the_kernels_nspid(proc: Path) -> None:
    d = proc / "4000"
    d.mkdir(parents=True)
    comm = b"\fNSpid:\t1\t7"
    (d / "stat").write_bytes(render_stat(comm, 4000, 3990, 55))
    (d / "status").write_bytes(render_status(comm, 4000, 3990, 100000, (4000, 1)))
    st_ = procfs.read_status(4000)
    assert st_ is not None and st_.refused is None
    assert (st_.name, st_.nspid, st_.uid, st_.ppid) == ("\fNSpid:\t1\t7", (4000, 1), 100000, 3990)


@pytest.mark.parametrize("forge", [
    b"NSpid:\t1\n",  # a key twice: the kernel writes each once
    b"Uid:\t0\t0\t0\t0\n",
    b"no colon here\n",
])
def test_a_status_the_kernel_cannot_have_written_identifies_nothing(proc: Path,
                                                                     forge: bytes) -> None:
    d = proc / "77"
    d.mkdir(parents=True)
    (d / "stat").write_bytes(render_stat(b"x", 77, 1, 5))
    text = render_status(b"x", 77, 1, 1000, (77, 3))
    head, _, rest = text.partition(b"\n")
    (d / "status").write_bytes(head + b"\n" + forge + rest)
    with pytest.raises(ValueError):
        procfs.parse_status(exact(head + b"\n" + forge + rest))
    st_ = procfs.read_status(77)
    assert st_ is not None and st_.refused and st_.nspid == () and st_.name == "?"


@pytest.mark.parametrize("text", ["Umask:\t0022\nName:\tx\nUid:\t0\t0\t0\t0\n",  # not first
                                  "Name:\tx\nUid:\t0\t0\t0\t0",  # last line not ended
                                  "Name:\tx\nUmask:\t0022\n",  # no Uid
                                  "Name:\tx\nUid:\t0\t0\t0\t0\nNSpid:\t\n",  # empty NSpid
                                  "Name:\tx\nUid:\tzero\n"])
def test_status_text_out_of_the_kernels_shape_is_refused(text: str) -> None:
    with pytest.raises((ValueError, IndexError)):
        procfs.status_identity(text)


# ---- cmdline ------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(args=st.lists(ARG, min_size=1, max_size=8), final_nul=st.booleans())
@example(args=[b"python3", b"-c", b"two words", b"", b"tab\there"], final_nul=True)
def test_cmdline_gives_back_each_argument(args: list[bytes], final_nul: bool) -> None:
    if not final_nul and args[-1] == b"":
        final_nul = True  # a rewritten argv area ends in a byte that is not NUL
    raw = b"\0".join(args) + (b"\0" if final_nul else b"")
    assert procfs.parse_cmdline(raw) == tuple(exact(a) for a in args)


def test_a_cmdline_past_its_cap_is_cut_and_says_so() -> None:
    assert procfs.parse_cmdline(b"ab\0cdef\0", cap=5) == ("ab", "cd" + procfs.CUT)
    assert procfs.parse_cmdline(b"ab\0cd\0", cap=6) == ("ab", "cd")
    assert procfs.parse_cmdline(b"") == ()


# ---- cgroup and mounts ----------------------------------------------------------------------

V1 = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids",
      "name=systemd")


@settings(max_examples=300, deadline=None)
@given(v1_names=st.lists(st.lists(CGROUP_NAME, max_size=3), min_size=3, max_size=3),
       v2_names=st.lists(CGROUP_NAME, max_size=4))
@example(v1_names=[[b"a\f0::", b"lxc", b"130", b"ns"]] * 3, v2_names=[b"ns", b"x"])
@example(v1_names=[[b"a\r0::", b"lxc", b"130"]] * 3, v2_names=[b"ns\x85"])
def test_cgroup_gives_back_the_v2_path_whatever_v1_names_hold(
        v1_names: list[list[bytes]], v2_names: list[bytes]) -> None:
    """The tenant names cgroups in three hierarchies (name=systemd, freezer, pids), the
    others' paths are the host's."""
    names = dict(zip(("name=systemd", "freezer", "pids"), v1_names, strict=True))
    v1 = {ctl: b"/lxc/129/" + b"/".join(names.get(ctl, [b"ns"])) for ctl in V1}
    v2 = b"/lxc/129/" + b"/".join(v2_names)
    lines = cgroupfs.parse_cgroups(exact(render_cgroup(v1, v2)))
    assert lines is not None and len(lines) == len(V1) + 1
    assert [path for num, ctl, path in lines if num == "0" and not ctl] == [exact(v2)]
    assert {ctl: path for _num, ctl, path in lines if ctl} == {
        ctl: exact(p) for ctl, p in v1.items()}
    assert in_tree(exact(v2), 129)


def test_pid_cgroup_of_a_forged_v1_name_is_the_kernels_v2_line(proc: Path) -> None:
    (proc / "42").mkdir(parents=True)
    v1 = {"name=systemd": b"/lxc/129/ns/a\f0::/lxc/130/ns", "freezer": b"/b\r0::/"}
    (proc / "42" / "cgroup").write_bytes(render_cgroup(v1, b"/lxc/129/ns/x\x85y"))
    assert cgroupfs.pid_cgroup(42) == "/lxc/129/ns/x\udc85y"  # a byte that is not UTF-8
    (proc / "42" / "cgroup").write_bytes(b"0::/lxc/129/ns\n0::/lxc/130/ns\n")
    assert cgroupfs.pid_cgroup(42) is None  # the kernel writes the v2 line once
    (proc / "42" / "cgroup").write_bytes(b"0::/lxc/129/ns")
    assert cgroupfs.pid_cgroup(42) is None  # every line of the kernel's is ended


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(points=st.lists(MOUNT_POINT, min_size=1, max_size=4), pick=st.integers(0, 3))
@example(points=[b"/my cgroups", b"/a\\040b", b"/t\tn\nl\\"], pick=2)
def test_mounts_give_back_each_mount_point(points: list[bytes], pick: int) -> None:
    pick %= len(points)
    lines = [b"cgroup " + mangle(p) + b" cgroup rw,relatime,freezer 0 0\n" for p in points]
    lines[pick] = b"cgroup2 " + mangle(points[pick]) + b" cgroup2 rw,nsdelegate 0 0\n"
    parsed = cgroupfs.parse_mounts(b"".join(lines))
    assert [p for p, _t, _o in parsed] == [exact(p) for p in points]
    assert [t for _p, t, _o in parsed].count("cgroup2") == 1


# ---- the renderers against the real kernel ---------------------------------------------------

RENAMER = """
import sys
import time
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    with open("/proc/self/comm", "wb", buffering=0) as fh:
        fh.write(bytes.fromhex(line.decode()))
    out.write(b"ok\\n"); out.flush()
"""


@pytest.fixture(scope="module")
def renamer() -> Iterator[subprocess.Popen[bytes]]:
    """A process that names itself (writes its /proc/self/comm) to each name it is sent."""
    p = subprocess.Popen([sys.executable, "-c", RENAMER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    yield p
    p.kill()
    p.wait()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(comm=COMM.filter(bool))
@example(comm=b"x\fNSpid:\t1")
@example(comm=b"\fNSpid:\t1\t7")
@example(comm=b"a\\n\nb c\xc2\x85\xe2\x80\xa8")
def test_the_kernel_writes_a_name_as_the_renderer_does(renamer: subprocess.Popen[bytes],
                                                       comm: bytes) -> None:
    assert renamer.stdin is not None and renamer.stdout is not None
    renamer.stdin.write(comm.hex().encode() + b"\n")
    renamer.stdin.flush()
    assert renamer.stdout.readline() == b"ok\n"
    pid = renamer.pid
    status = Path(f"/proc/{pid}/status").read_bytes()
    head = status.partition(b"\nUmask:")[0] + b"\n"
    assert head == render_status(comm, pid, 0, 0, (pid,)).partition(b"\nUmask:")[0] + b"\n"
    got = procfs.read_status(pid)
    assert got is not None and got.name == exact(comm)
    assert got.nspid[0] == pid and got.uid == os.getuid() and got.ppid == os.getpid()
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    assert stat.startswith(f"{pid} (".encode() + comm + b") ")


def test_the_kernel_writes_a_command_line_as_the_renderer_does() -> None:
    args = ["two words", "", "tab\there", "\fNSpid:\t1", "\udcff\udcfe", "é", ""]
    argv = ["/bin/sh", "-c", "read x", "sh", *args]  # waits on its stdin, args unused
    p = subprocess.Popen(argv, stdin=subprocess.PIPE)
    try:  # the argv area is set a moment after Popen returns (the exec's end)
        end = time.monotonic() + 5
        while not procfs.argv(p.pid) and time.monotonic() < end:
            time.sleep(0.005)
        assert procfs.argv(p.pid) == tuple(argv)
    finally:
        p.kill()
        p.wait()
