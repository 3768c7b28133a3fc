"""probe: parsing the in-namespace view's output (the container's text) and judging its run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pveclean.core.records import GpuDevices, Scope
from pveclean.proxmox import probe
from pveclean.proxmox.pct import PctReader, start_pct
from pveclean.proxmox.probe import ProbeResult, finish_probe, parse_probe, probe_argv


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
