"""A run's verdicts and the exit code each one means."""

from __future__ import annotations

from pveclean.errors import ExitCode

VERDICT_EXIT = {
    "clean": ExitCode.OK,
    "nothing-to-do": ExitCode.OK,
    "dry-run": ExitCode.OK,
    "residual": ExitCode.RESIDUAL,
    "leaked": ExitCode.RESIDUAL,
    "error": ExitCode.ACCESS,
    "busy": ExitCode.BUSY,
}


VERDICTS = ("clean", "nothing-to-do", "dry-run", "residual", "leaked", "error", "busy")
