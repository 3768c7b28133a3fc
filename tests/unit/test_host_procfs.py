"""host/procfs through a fake /proc under tmp_path (procfs.set_root): parsing stat and status
(fuzzed too), what a process's files say, and that a process gone mid-read is None, never an
error."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.core.records import ProcStatus
from pveclean.host import procfs


def stat_line(pid: int, comm: str, state: str = "S", ppid: int = 1, starttime: int = 500
              ) -> str:
    """/proc/PID/stat: 17 fields between ppid and starttime, as the kernel writes them."""
    return f"{pid} ({comm}) {state} {ppid} " + " ".join(["0"] * 17) + f" {starttime} 0 0\n"


def fake_process(proc: Path, pid: int, comm: str = "python3", state: str = "S",
                 ppid: int = 1, uid: int = 0, nspid: tuple[int, ...] | None = None,
                 starttime: int = 500, where: Path | None = None) -> Path:
    d = where or proc / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(stat_line(pid, comm, state, ppid, starttime))
    ns = "\t".join(map(str, nspid or (pid,)))
    (d / "status").write_text(f"Name:\t{comm}\nUmask:\t0022\nState:\t{state}\n"
                              f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{ns}\n")
    return d


def test_set_root_moves_every_path_and_is_read_at_call_time(proc: Path) -> None:
    assert procfs.path(42, "fd") == f"{proc}/42/fd"
    procfs.set_root("/elsewhere/")
    assert procfs.path("self", "mounts") == "/elsewhere/self/mounts"


def test_read_status_of_a_container_process(proc: Path) -> None:
    fake_process(proc, 4242, "vllm", ppid=4000, uid=1000, nspid=(4242, 17), starttime=987)
    assert procfs.read_status(4242) == ProcStatus(4242, "vllm", "S", 4000, 1000, (4242, 17),
                                                  987)


def test_read_status_takes_a_comm_with_spaces_and_parens_whole(proc: Path) -> None:
    d = fake_process(proc, 7, "a) b (c")
    (d / "stat").write_text(stat_line(7, "a) b (c", state="D", ppid=3, starttime=11))
    st = procfs.read_status(7)
    assert st is not None
    assert (st.name, st.state, st.ppid, st.starttime) == ("a) b (c", "D", 3, 11)


@pytest.mark.parametrize("missing", ["stat", "status"])
def test_a_process_whose_files_are_gone_has_exited(proc: Path, missing: str) -> None:
    d = fake_process(proc, 8)
    (d / missing).unlink()
    assert procfs.read_status(8) is None
    assert procfs.read_status(9) is None  # no directory at all


def test_a_stat_cut_short_or_garbled_is_no_status(proc: Path) -> None:
    d = fake_process(proc, 10)
    (d / "stat").write_text("10 (x) S 1 0 0\n")
    assert procfs.read_status(10) is None
    (d / "stat").write_text(stat_line(10, "x").replace(" 500 ", " later "))
    assert procfs.read_status(10) is None


def test_a_status_without_nspid_is_the_pid_itself(proc: Path) -> None:
    d = fake_process(proc, 12)
    (d / "status").write_text("Name:\tinit\nUid:\t0\t0\t0\t0\n")
    st = procfs.read_status(12)
    assert st is not None and st.nspid == (12,) and st.name == "init"


def test_argv_keeps_each_argument_and_drops_only_the_last_nul(proc: Path) -> None:
    d = fake_process(proc, 20)
    (d / "cmdline").write_bytes(b"python3\0-m\0vllm serve\0\0")
    assert procfs.argv(20) == ("python3", "-m", "vllm serve", "")
    (d / "cmdline").write_bytes(b"rewritten as one string, no NUL")
    assert procfs.argv(20) == ("rewritten as one string, no NUL",)
    (d / "cmdline").write_bytes(b"a" * 10000)
    assert procfs.argv(20) == ("a" * 8192 + procfs.CUT,)  # read no further than that
    (d / "cmdline").write_bytes(b"")
    assert procfs.argv(20) == ()  # a kernel thread, or a zombie
    assert procfs.argv(21) == ()


def test_exe_is_where_the_link_points_even_when_dangling(proc: Path) -> None:
    d = fake_process(proc, 30)
    os.symlink("/usr/bin/python3.11 (deleted)", d / "exe")
    assert procfs.exe(30) == "/usr/bin/python3.11 (deleted)"
    assert procfs.exe(31) is None


@pytest.mark.parametrize(("text", "expect"), [("do_wait", "do_wait"), ("0", None),
                                              ("", None), ("  nv_wait\n", "nv_wait")])
def test_wchan_names_where_a_process_sleeps(proc: Path, text: str, expect: str | None) -> None:
    d = fake_process(proc, 40)
    (d / "wchan").write_text(text)
    assert procfs.wchan(40) == expect


def test_wchan_of_a_gone_process_is_none(proc: Path) -> None:
    assert procfs.wchan(41) is None


def test_live_threads_count_the_threads_not_exited_without_the_leader(proc: Path) -> None:
    leader = fake_process(proc, 50, state="Z")
    for tid, state in ((50, "Z"), (51, "R"), (52, "Z"), (53, "X"), (54, "S")):
        fake_process(proc, tid, state=state, where=leader / "task" / str(tid))
    assert procfs.live_threads(50) == 2  # 51 and 54


def test_bases_are_the_threads_in_numeric_order_without_the_leader(proc: Path) -> None:
    leader = fake_process(proc, 60)
    for tid in ("60", "100", "61", "9x"):
        (leader / "task" / tid).mkdir(parents=True)
    assert procfs.thread_bases(60, "fd") == [f"{proc}/60/task/61", f"{proc}/60/task/100"]
    assert procfs.thread_bases(61, "fd") == []  # gone


def test_read_bytes_honours_its_limit_and_one_read(tmp_path: Path) -> None:
    f = tmp_path / "big"
    f.write_bytes(b"x" * 200_000)
    assert procfs.read_bytes(str(f)) == b"x" * 200_000
    assert procfs.read_bytes(str(f), 70_000) == b"x" * 70_000
    assert procfs.read_bytes(str(f), 512, one_read=True) == b"x" * 512
    assert procfs.read_bytes(str(tmp_path / "none")) is None
    assert procfs.read_bytes(str(tmp_path)) is None  # a directory: EISDIR on read
    assert procfs.read_bytes("bad\0path") is None


def test_readlink_and_listdir_turn_a_vanished_entry_into_none(tmp_path: Path) -> None:
    assert procfs.readlink(str(tmp_path / "gone")) is None
    assert procfs.listdir(str(tmp_path / "gone")) is None
    (tmp_path / "d").mkdir()
    assert procfs.listdir(str(tmp_path / "d")) == []


def test_stat_and_status_parsing() -> None:
    stat = "123 (we ird) name)) S 1 123 123 0 -1 4194560 " + " ".join(["0"] * 12) + " 98765 0"
    assert procfs.parse_stat(stat) == ("S", 1, 98765)
    assert procfs.parse_stat("garbage") is None
    st = procfs.parse_status("Name:\tpython3\nNSpid:\t4242\t17\t2\nUid:\t0\t0\t0\t0\n")
    assert st["NSpid"].split() == ["4242", "17", "2"] and st["Name"] == "python3"


def test_the_real_status_parses_whole() -> None:
    for pid in ("self", "1"):
        st = procfs.parse_status(Path(f"/proc/{pid}/status").read_text())
        assert next(iter(st)) == "Name" and {"Uid", "NSpid", "PPid", "Tgid"} <= set(st)
    assert procfs.read_status(os.getpid()) == procfs.read_status(os.getpid())
    st = procfs.read_status(os.getpid())
    assert st is not None and st.nspid[0] == os.getpid() and st.uid == os.getuid()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_proc_parsers_never_crash(text: str) -> None:
    procfs.parse_stat(text)
    with contextlib.suppress(ValueError):  # refused, with the reason
        procfs.parse_status(text)


def test_exiting_reads_pf_exiting_or_a_pending_sigkill(tmp_path, monkeypatch):
    """issue 38: a process in the kernel's exit is not a survivor."""
    from pveclean.host import procfs as pf

    def proc(pid: int, flags: int, sigpnd: str = "0000000000000000") -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} (py) thr) D 1 {pid} {pid} 0 -1 {flags} 0 0 0 0 0 0 0 0 "
                                "20 0 1 0 100 0 0\n")
        (d / "status").write_text(f"Name:\tpy\nState:\tD\nSigPnd:\t{sigpnd}\n"
                                  "ShdPnd:\t0000000000000000\n")

    proc(10, 0x400100 | pf.PF_EXITING)
    proc(11, 0x400100)
    proc(12, 0x400100, sigpnd="0000000000000100")  # SIGKILL pending
    monkeypatch.setattr(pf, "path", lambda *parts: str(tmp_path.joinpath(*map(str, parts))))
    assert pf.stat_flags((tmp_path / "10" / "stat").read_text()) == 0x400104
    assert [pf.exiting(p) for p in (10, 11, 12, 13)] == [True, False, True, False]
    # no VmRSS (the address space taken), no Threads line, utime + stime 0
    assert pf.exit_look(12) == (True, (0, None, 0)) and pf.exit_look(13) == (False, (None,) * 3)
    assert pf.stat_flags("garbage") is None
