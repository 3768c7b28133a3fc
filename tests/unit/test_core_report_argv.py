"""A holder's command line is its argv: the report keeps the list of exact arguments,
redaction matches across arguments and keeps their bounds, displays join them for humans,
and a status the kernel cannot have written protects a holder from every signal."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.commands.render import command_line, render_report
from pveclean.core.config import DEFAULT_REDACT
from pveclean.core.discovery import protect_reason
from pveclean.core.records import GpuDevices, Holder, ProcStatus, Scope
from pveclean.core.report import MAX_VALUE, Redactor
from pveclean.core.reportread import from_dict

SCOPE = Scope(129, Path("/sys/fs/cgroup/lxc/129"), GpuDevices({}, frozenset()),
              frozenset({"nvidia-persistenced"}))


def holder(argv: tuple[str, ...]) -> Holder:
    return Holder(host_pid=5, starttime=1, ct_pid=3, name="python3", exe=None, argv=argv,
                  uid=0, user="root", state="S", ppid=1, cgroup="/lxc/129/ns")


def test_the_report_shows_the_argv_as_a_list() -> None:
    argv = ("python3", "-c", "two words", "", "a\nb")
    assert holder(argv).as_dict()["cmdline"] == list(argv)


def test_redaction_matches_across_arguments_and_keeps_their_bounds() -> None:
    red = Redactor(list(DEFAULT_REDACT))
    argv = ("python3", "--hf-token=hf_abc", "--api-key", "sk-secret", "HF_TOKEN=x", "--db",
            "postgres://me:pa55@db/x", "--password", "two words", "plain")
    assert red.argv(argv) == ("python3", "--hf-token=***", "--api-key", "***", "HF_TOKEN=***",
                              "--db", "postgres://me:***@db/x", "--password", "*** words",
                              "plain")
    assert red.value(holder(argv)).argv == red.argv(argv)  # the report's holders too
    assert red.argv(()) == () and red.argv(("", "")) == ("", "")


def test_redaction_of_a_huge_command_line_is_bounded() -> None:
    out = Redactor(list(DEFAULT_REDACT)).argv(("x" * MAX_VALUE, "--token", "s3cret"))
    assert out == ("x" * (MAX_VALUE - 1) + "…",)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=8))
def test_redaction_never_merges_or_splits_arguments(args: list[str]) -> None:
    out = Redactor(list(DEFAULT_REDACT)).argv(tuple(args))
    assert len(out) == len(args)
    assert all(o == a for o, a in zip(out, args, strict=True) if "***" not in o)


def test_displays_join_the_arguments_and_read_older_reports() -> None:
    assert command_line(["python3", "two words", ""]) == "python3 two words "
    assert command_line("python3 -m x") == "python3 -m x"  # a report from before the list
    assert command_line(None) == ""
    h = dict(holder(("python3", "a\tb", "\x1b[2J")).as_dict(), sources=["host"], signals=[])
    rep = {"vmid": 129, "phase": "manual", "verdict": "clean", "start": "x", "duration_s": 0.5,
           "holders": [h]}
    shown = render_report(from_dict(rep))
    assert "python3 a\\x09b \\x1b[2J" in shown and "\x1b" not in shown
    older = {**rep, "holders": [{**h, "cmdline": "python3 -m x", "signals": [
        "SIGTERM +0.001s", "SIGKILL +10.002s failed: No such process", "a note"]}]}
    shown = render_report(from_dict(older))  # a report from before the list: its line whole
    assert "python3 -m x" in shown
    assert ("signals: SIGTERM +0.001s, SIGKILL +10.002s failed: No such process, a note"
            in shown)


def test_a_refused_status_protects_and_says_why() -> None:
    st_ = ProcStatus(7, "?", "S", 1, -1, (), 5, refused="its /proc/PID/status is not as "
                     "the kernel writes it (the key 'NSpid' twice)")
    assert protect_reason(st_, SCOPE, None, ()) == (
        "not identified: its /proc/PID/status is not as the kernel writes it "
        "(the key 'NSpid' twice)")
    container = ProcStatus(7, "nvidia-persiste", "S", 1, 0, (7, 3), 5)
    assert protect_reason(container, SCOPE, None, ("/usr/bin/nvidia-persistenced",)) is None
