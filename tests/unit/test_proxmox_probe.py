"""proxmox/probe: parsing the in-namespace view's output (the container's text: bounded bytes,
lines and entries, fuzzed), judging its run, and the probe script itself in a plain sh."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.core.records import GpuDevices, Scope
from pveclean.proxmox import probe
from pveclean.proxmox.pct import PctReader, start_pct
from pveclean.proxmox.probe import (
    MAX_PATHS,
    MAX_PIDS,
    PROBE_SCRIPT,
    ProbeResult,
    finish_probe,
    parse_probe,
    probe_argv,
)


def test_paths_per_pid_are_capped_and_deduplicated() -> None:
    out = "".join(f"fd 7 /dev/nvidia{i}\n" for i in range(10)) + "fd 7 /dev/nvidia0\nend\n"
    res = parse_probe(out, max_paths=3)
    assert res.holders == {7: ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]}
    assert res.complete and res.over_limit is None and res.bad_lines == 0


def test_the_same_path_as_fd_and_as_map_are_two_entries() -> None:
    res = parse_probe("fd 3 /dev/nvidia-uvm\nmap 3 /dev/nvidia-uvm\nmap 3 /dev/nvidia-uvm\nend\n")
    assert res.holders == {3: ["/dev/nvidia-uvm", "/dev/nvidia-uvm (mmap)"]}


def test_pid_limit_is_a_parameter_and_stops_the_parse() -> None:
    res = parse_probe("fd 1 /dev/a\nfd 2 /dev/b\nfd 3 /dev/c\nend\n", max_pids=2)
    assert res.over_limit == "more than 2 processes named"
    assert list(res.holders) == [1, 2] and not res.complete


def test_a_known_pid_does_not_count_against_the_pid_limit() -> None:
    res = parse_probe("fd 1 /dev/a\nfd 2 /dev/b\nmap 1 /dev/c\nend\n", max_pids=2)
    assert res.over_limit is None and res.holders[1] == ["/dev/a", "/dev/c (mmap)"]


@pytest.mark.parametrize("line", [
    "fd 12345678901 /dev/nvidia0",  # more than 10 digits
    "fd -1 /dev/nvidia0",
    "fd 1 dev/nvidia0",  # not an absolute path
    "fd 1 /",  # a path needs more than the slash
    "exe 1 /dev/nvidia0",
    "fd  1 /dev/nvidia0",
    "FD 1 /dev/nvidia0",
    "fd 1 /" + "x" * 5000,  # longer than a path can be
    "missing " + "x" * 40,  # too long to be the marker
])
def test_malformed_lines_are_counted(line: str) -> None:
    res = parse_probe(f"{line}\nend\n")
    assert res.bad_lines == 1 and res.holders == {} and res.complete and res.missing is None


def test_paths_with_spaces_and_surrounding_blanks() -> None:
    res = parse_probe("  fd 9 /tmp/my dir/nvidia0  \n\n\nend  \n")
    assert res.holders == {9: ["/tmp/my dir/nvidia0"]} and res.complete


def test_missing_tool_marker() -> None:
    res = parse_probe("missing ls\n")
    assert res.missing == "ls" and not res.complete and res.bad_lines == 0


def test_empty_output_is_incomplete() -> None:
    assert parse_probe("") == ProbeResult()


def test_probe_argv_passes_the_script_and_each_pattern_as_arguments() -> None:
    argv = probe_argv(129, ["/dev/nvidia*", "/dev/nvidia-caps/*"])
    assert argv[:6] == ["exec", "129", "--", "/bin/sh", "-c", probe.PROBE_SCRIPT]
    assert argv[6:] == ["pveclean-probe", "/dev/nvidia*", "/dev/nvidia-caps/*"]


# ---- finish_probe: a run's output judged -------------------------------------------------
def _sh(script: str) -> subprocess.Popen[bytes]:
    return start_pct("/bin/sh -c", [script])


def test_finish_probe_returns_the_parsed_holders() -> None:
    res = finish_probe(_sh("echo 'fd 5 /dev/nvidia0'; echo end"), 10)
    assert res.complete and res.holders == {5: ["/dev/nvidia0"]}


def test_finish_probe_takes_a_reader_started_earlier() -> None:
    reader = PctReader(_sh("echo 'map 6 /dev/nvidia-uvm'; echo end"))
    res = finish_probe(reader, 10)
    assert res.holders == {6: ["/dev/nvidia-uvm (mmap)"]}


@pytest.mark.parametrize(("script", "needle"), [
    ("echo 'missing ls'; exit 127", "has no 'ls' on pct exec's PATH"),
    ("echo 'fd 5 /dev/nvidia0'; echo 'no such container' >&2; exit 2",
     "pct exec failed (exit 2): no such container"),
    ("echo 'fd 5 /dev/nvidia0'", "pct exec failed (exit 0): no output"),  # no `end`
    ("echo end; exit 1", "pct exec failed (exit 1)"),
])
def test_finish_probe_says_why_it_did_not_work(script: str, needle: str) -> None:
    with pytest.raises(RuntimeError) as exc:
        finish_probe(_sh(script), 10)
    assert needle in str(exc.value)


def test_finish_probe_of_a_hung_probe_names_the_timeout() -> None:
    with pytest.raises(RuntimeError, match=r"did not finish within 0\.3 s"):
        finish_probe(_sh("sleep 30"), 0.3)


def test_finish_probe_refuses_too_many_pids() -> None:
    script = f"i=0; while [ $i -lt {probe.MAX_PIDS + 5} ]; do echo \"fd $i /dev/x\"; " \
             "i=$((i+1)); done; echo end"
    with pytest.raises(RuntimeError, match="over its limit"):
        finish_probe(_sh(script), 30)


def test_start_probe_without_pct_is_a_runtime_error() -> None:
    scope = Scope(vmid=129, cgroup_dir=Path("/nonexistent"), devices=GpuDevices({}, frozenset()),
                  protect=frozenset(), probe_patterns=["/dev/nvidia*"])
    with pytest.raises(RuntimeError, match="pct command not found"):
        probe.start_probe(scope, "/nonexistent/pct")


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
