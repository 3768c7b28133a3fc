"""proxmox/pct: every call bounded in time and output, with a real `/bin/sh -c` child standing in
for pct (small limits through the parameters, so most cases run in milliseconds; floods and
long lines are cut)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.proxmox.pct import (
    MAX_STDOUT,
    PCT_ENV,
    PctMissing,
    PctReader,
    run_pct,
    start_pct,
    wait_pct,
)

SH = "/bin/sh -c"


def _sh(script: str) -> subprocess.Popen[bytes]:
    return start_pct(SH, [script])


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its new parent has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def test_output_and_exit_code_of_a_finished_child() -> None:
    r = run_pct(SH, ["echo out; echo err >&2; exit 3"], 10)
    assert (r.returncode, r.stdout, r.stderr, r.over_limit) == (3, "out\n", "err\n", None)
    assert not r.ok
    assert run_pct(SH, ["true"], 10).ok


def test_arguments_after_the_command_are_its_argv() -> None:
    r = run_pct(SH, ['printf "%s|" "$0" "$1" "$2"', "zero", "a b", "$HOME"], 10)
    assert r.stdout == "zero|a b|$HOME|"


def test_pct_runs_with_only_the_fixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PVECLEAN_SECRET_TOKEN", "t0ken")
    r = run_pct(SH, ["env"], 10)
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert "t0ken" not in r.stdout
    assert env["PATH"] == PCT_ENV["PATH"] and env["LC_ALL"] == "C"


def test_stdin_is_empty() -> None:
    assert run_pct(SH, ["cat; echo done"], 10).stdout == "done\n"


def test_output_over_its_cap_is_cut_and_the_child_killed() -> None:
    p = _sh("yes abc")
    r = wait_pct(p, 10, max_stdout=1000)
    assert r.over_limit == "stdout over 1000 bytes"
    assert r.returncode is None and len(r.stdout) == 1000
    assert r.stdout.startswith("abc\nabc\n")


def test_output_at_exactly_the_cap_is_kept_whole() -> None:
    r = wait_pct(_sh("head -c 1000 /dev/zero | tr '\\0' 'x'"), 10, max_stdout=1000,
                 max_line=2000)
    assert r.over_limit is None and r.returncode == 0 and r.stdout == "x" * 1000


def test_stderr_has_its_own_cap() -> None:
    r = wait_pct(_sh("head -c 5000 /dev/zero >&2; echo fine"), 10, max_stderr=100,
                 max_line=100000)
    assert r.over_limit == "stderr over 100 bytes" and r.returncode is None
    assert len(r.stderr) <= 100


def test_a_line_over_max_line_is_over_limit() -> None:
    r = wait_pct(_sh("printf 'short\\n%0300d\\n' 0"), 10, max_line=200)
    assert r.over_limit == "stdout has a line over 200 bytes" and r.returncode is None


def test_a_long_line_written_in_pieces_is_counted_across_reads() -> None:
    r = wait_pct(_sh("for i in 1 2 3 4 5 6; do printf '%050d' 0; sleep 0.02; done; echo"),
                 10, max_line=200)
    assert r.over_limit == "stdout has a line over 200 bytes"


def test_many_lines_each_under_max_line_are_fine() -> None:
    r = wait_pct(_sh("i=0; while [ $i -lt 50 ]; do printf '%0100d\\n' $i; i=$((i+1)); done"),
                 10, max_line=101)
    assert r.over_limit is None and r.returncode == 0 and len(r.stdout.splitlines()) == 50


def test_a_hung_child_is_killed_at_the_timeout_with_its_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    p = _sh(f"sleep 60 & echo $! > {pidfile}; echo started; wait")
    t = time.monotonic()
    r = wait_pct(p, 0.5)
    took = time.monotonic() - t
    assert r.returncode is None and r.over_limit is None and r.stdout == "started\n"
    assert 0.4 < took < 5
    grandchild = int(pidfile.read_text())
    for _ in range(100):
        if _gone(grandchild):
            break
        time.sleep(0.02)
    assert _gone(grandchild), "the process group was not killed"


def test_a_child_that_closes_its_pipes_but_lives_on_is_killed() -> None:
    """Output complete, process not exited within the wait: no return code, and no hang."""
    t = time.monotonic()
    r = wait_pct(_sh("exec >/dev/null 2>&1; sleep 30"), 0.3)
    assert r.returncode is None and time.monotonic() - t < 5


def test_reader_pump_is_incremental() -> None:
    reader = PctReader(_sh("echo one; sleep 0.3; echo two"))
    assert reader.pump(0) is False  # nothing waited for
    assert reader.pump(5) is True
    r = reader.result()
    assert r.stdout == "one\ntwo\n" and r.returncode == 0


def test_reader_result_before_completion_kills_and_reports_no_exit_code() -> None:
    reader = PctReader(_sh("echo partial; sleep 30"))
    reader.pump(0.2)
    assert not reader.done
    r = reader.result()
    assert r.returncode is None and r.stdout == "partial\n"
    assert reader.proc.poll() is not None


def test_reader_is_done_at_once_when_over_a_cap() -> None:
    reader = PctReader(_sh("yes"), max_stdout=10)
    assert reader.pump(5) is True and reader.over == "stdout over 10 bytes"
    assert reader.result().returncode is None


def test_undecodable_output_is_replaced() -> None:
    r = run_pct(SH, ["printf 'a\\377b'"], 10)
    assert r.stdout == "a\ufffdb"


def test_a_missing_command_is_pct_missing() -> None:
    with pytest.raises(PctMissing, match="pct command not found: '/nonexistent/pct'"):
        run_pct("/nonexistent/pct", ["list"], 5)


def test_a_command_that_is_not_executable_is_pct_missing(tmp_path: Path) -> None:
    pct = tmp_path / "pct"
    pct.write_text("#!/bin/sh\necho hi\n")
    pct.chmod(0o644)
    with pytest.raises(PctMissing, match="not executable"):
        start_pct(str(pct), [])


def test_pct_command_is_split_like_a_shell(tmp_path: Path) -> None:
    pct = tmp_path / "my pct"
    pct.write_text('#!/bin/sh\necho "$@"\n')
    pct.chmod(0o755)
    r = run_pct(f"'{pct}' --flag", ["exec", "129"], 10)
    assert r.stdout == "--flag exec 129\n"


@settings(max_examples=8, deadline=None)
@given(st.integers(min_value=0, max_value=8 * MAX_STDOUT), st.sampled_from([1, 17, 4000]))
def test_wait_pct_keeps_at_most_the_cap(size: int, line: int) -> None:
    r = run_pct("/bin/sh -c", [f"yes {'x' * line} | head -c {size}"], 20)
    assert len(r.stdout.encode()) <= MAX_STDOUT
    if size > MAX_STDOUT:
        assert r.over_limit and r.returncode is None
    else:
        assert r.over_limit is None and r.returncode == 0 and len(r.stdout) == size


def test_long_line_and_stderr_flood_are_over_limit() -> None:
    r = run_pct("/bin/sh -c", ["head -c 100000 /dev/zero | tr '\\0' -"], 20)
    assert r.over_limit and "line" in r.over_limit
    r = run_pct("/bin/sh -c", ["yes err >&2"], 20)
    assert r.over_limit and r.over_limit.startswith("stderr")


def test_endless_flood_is_cut_without_waiting_for_the_timeout() -> None:
    t = time.monotonic()
    r = run_pct("/bin/sh -c", ["yes 'fd 1 /dev/nvidia0'"], 60)
    assert r.over_limit and time.monotonic() - t < 30
