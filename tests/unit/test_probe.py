"""The probe's output is the container's: bounded bytes, lines and entries, parsed without a
crash. Fuzzed with sizes and bytes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.proxmox import probe
from pveclean.proxmox.pct import MAX_STDOUT, run_pct, start_pct
from pveclean.proxmox.probe import MAX_PATHS, MAX_PIDS, PROBE_SCRIPT, finish_probe, parse_probe

LINE = st.one_of(
    st.builds(lambda k, p, path: f"{k} {p} {path}", st.sampled_from(["fd", "map"]),
              st.integers(min_value=0, max_value=10**12), st.text(max_size=200)),
    st.text(max_size=300),
    st.just("end"),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(LINE, max_size=200))
def test_parse_probe_never_fails_and_stays_within_its_caps(lines: list[str]) -> None:
    res = parse_probe("\n".join(lines))
    assert len(res.holders) <= MAX_PIDS
    assert all(0 < len(p) <= MAX_PATHS for p in res.holders.values())
    assert all(pid < 10**10 for pid in res.holders)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=4096))
def test_parse_probe_on_any_bytes(raw: bytes) -> None:
    res = parse_probe(raw.decode("utf-8", "replace"))
    assert res.bad_lines >= 0 and len(res.holders) <= MAX_PIDS


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=MAX_PIDS + 1, max_value=5000))
def test_many_invented_pids_set_over_limit(n: int) -> None:
    out = "".join(f"fd {i} /dev/nvidia0\n" for i in range(2, 2 + n)) + "end\n"
    res = parse_probe(out)
    assert res.over_limit and len(res.holders) == MAX_PIDS


def test_output_after_end_does_not_count() -> None:
    res = parse_probe("fd 5 /dev/nvidia0\nend\nfd 6 /dev/nvidia1\n")
    assert res.complete and list(res.holders) == [5]


def _sh(script: str) -> subprocess.Popen[bytes]:
    return start_pct("/bin/sh -c", [script])


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


def test_finish_probe_records_over_limit() -> None:
    try:
        finish_probe(_sh("yes 'fd 1 /dev/nvidia0'"), 20)
    except RuntimeError as exc:
        assert "over its limit" in str(exc)
    else:
        raise AssertionError("a flood was accepted")


def test_probe_script_says_when_ls_is_missing(tmp_path: object) -> None:
    """Run with a plain shell and a PATH without ls, as on NixOS: a marker, not `end`."""
    proc = subprocess.Popen(["/bin/sh", "-c", PROBE_SCRIPT, "p", "/dev/nvidia*"],
                            stdout=subprocess.PIPE, env={"PATH": "/nonexistent"})
    out, _ = proc.communicate(timeout=20)
    res = parse_probe(out.decode())
    assert res.missing == "ls" and not res.complete and proc.returncode == 127


def test_probe_output_parsing() -> None:
    out = ("fd 12 /dev/nvidia0\nfd 12 /dev/nvidiactl\nmap 12 /dev/nvidia-uvm\n"
           "garbage line\nfd x /dev/nvidia1\nmap 40 /dev/nvidia-uvm\nend\n")
    res = probe.parse_probe(out)
    assert res.complete and res.bad_lines == 2
    assert res.holders == {12: ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm (mmap)"],
                           40: ["/dev/nvidia-uvm (mmap)"]}
    assert not probe.parse_probe("fd 1 /dev/nvidia0\n").complete  # cut short


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_probe_parser_never_crashes(text: str) -> None:
    res = probe.parse_probe(text)
    assert all(isinstance(k, int) for k in res.holders)


def test_probe_script_runs_in_plain_sh(tmp_path: Path) -> None:
    """The probe itself, run here by /bin/sh: it finds this test's own open GPU-like node."""
    node = tmp_path / "nvidia7"
    os.mknod(node, 0o600 | 0o020000, os.makedev(1, 7)) if os.geteuid() == 0 else node.touch()
    with open(node, "rb") as fh:
        r = subprocess.run(
            ["/bin/sh", "-c", probe.PROBE_SCRIPT, "probe", str(tmp_path) + "/nvidia*"],
            capture_output=True, text=True, check=True, timeout=60)
        res = probe.parse_probe(r.stdout)
        assert res.complete
        assert str(node) in res.holders.get(os.getpid(), []), r.stdout[-500:]
        del fh
