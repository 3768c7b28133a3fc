"""Verdicts and outcomes: their words, the rules that decide a verdict, their exit codes."""

from __future__ import annotations

import pytest

from pveclean.core.verdicts import (
    VERDICT_EXIT,
    VERDICTS,
    Outcome,
    Verdict,
    after_stop,
    exit_code,
    with_leaks,
    with_problems,
    with_unjudged,
)
from pveclean.errors import ExitCode


def test_the_words_are_the_reports() -> None:
    assert [str(v) for v in VERDICTS] == ["clean", "nothing-to-do", "dry-run", "deferred",
                                          "residual", "leaked", "not-judged", "error",
                                          "busy"]
    assert {str(o) for o in Outcome} == {"terminated", "killed", "survived", "protected",
                                         "exited", "skipped", "would-stop", "exiting"}
    assert f"{Outcome.WOULD_STOP}" == "would-stop" and Verdict("nothing-to-do").name == \
        "NOTHING_TO_DO"


@pytest.mark.parametrize(("verdict", "code"), [
    ("clean", ExitCode.OK), ("nothing-to-do", ExitCode.OK), ("dry-run", ExitCode.OK),
    ("residual", ExitCode.RESIDUAL), ("leaked", ExitCode.RESIDUAL), ("error", ExitCode.ACCESS),
    ("busy", ExitCode.BUSY), ("not-judged", ExitCode.NOT_JUDGED), ("something-new", ExitCode.OK)])
def test_each_verdict_has_its_exit_code(verdict: str, code: ExitCode) -> None:
    assert exit_code(verdict) == code
    if verdict in VERDICTS:
        assert exit_code(Verdict(verdict)) == code


def test_every_verdict_has_an_exit_code() -> None:
    assert set(VERDICT_EXIT) == set(Verdict)


@pytest.mark.parametrize(("verified", "outcomes", "want"), [
    (True, [Outcome.TERMINATED, Outcome.KILLED, Outcome.EXITED], Verdict.CLEAN),
    (True, [], Verdict.CLEAN),
    (False, [Outcome.TERMINATED], Verdict.RESIDUAL),
    (True, [Outcome.TERMINATED, Outcome.SURVIVED], Verdict.RESIDUAL),
    (True, [Outcome.PROTECTED], Verdict.RESIDUAL),
    (True, [Outcome.SKIPPED, None], Verdict.CLEAN),
])
def test_a_cleanup_is_clean_only_when_verified_and_nothing_remains(
        verified: bool, outcomes: list[Outcome | None], want: Verdict) -> None:
    assert after_stop(verified, outcomes) is want


@pytest.mark.parametrize("verdict", list(Verdict))
def test_problems_make_an_untroubled_verdict_residual(verdict: Verdict) -> None:
    assert with_problems(verdict, []) is verdict
    want = Verdict.RESIDUAL if verdict in (Verdict.CLEAN, Verdict.NOTHING_TO_DO) else verdict
    assert with_problems(verdict, ["PID 5: reading its /proc files did not finish"]) is want


@pytest.mark.parametrize("verdict", list(Verdict))
def test_leaks_make_an_untroubled_verdict_leaked(verdict: Verdict) -> None:
    assert with_leaks(verdict, []) is verdict
    want = Verdict.LEAKED if verdict in (Verdict.CLEAN, Verdict.NOTHING_TO_DO,
                                         Verdict.NOT_JUDGED) else verdict
    assert with_leaks(verdict, [{"index": 0}]) is want


@pytest.mark.parametrize("verdict", list(Verdict))
def test_memory_nvml_did_not_answer_for_is_never_clean(verdict: Verdict) -> None:
    """Issue 38: not judged is neither clean nor leaked; a worse verdict (holders left,
    memory NVML did show leaked) stays."""
    assert with_unjudged(verdict, []) is verdict
    want = (Verdict.NOT_JUDGED if verdict in (Verdict.CLEAN, Verdict.NOTHING_TO_DO)
            else verdict)
    assert with_unjudged(verdict, ["GPU 0 is unavailable (process list: Unknown)"]) is want
    assert exit_code(Verdict.NOT_JUDGED) == 6 not in (ExitCode.OK, ExitCode.RESIDUAL)
