"""Exit codes, the error types every layer raises, and the one mapping of an error to one
line on stderr and an exit code (never a traceback)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from enum import IntEnum


class ExitCode(IntEnum):
    """pveclean's exit codes, documented in the README and `pveclean --help`."""

    OK = 0  # clean, nothing to do, dry run
    RESIDUAL = 1  # holders or their GPU memory remain (residual, leaked)
    USAGE = 2  # bad arguments or config
    ACCESS = 3  # container does not exist, pct or cgroup access failed
    REPORT = 4  # the cleanup ran but its report could not be written
    BUSY = 5  # another run holds this container's lock
    # the holders were stopped, but NVML did not answer for the GPU memory they had (a GPU's
    # process list failed, hung or is not supported, their memory "not available", NVML
    # down): neither clean nor leaked (verdict `not-judged`, issue 38)
    NOT_JUDGED = 6
    # `pveclean hook CT pre-start` only: a deliberate refusal to start (pre_start_policy:
    # refuse with holders left, or a chained hookscript that failed). The shim fails the start
    # on this code alone; any other status (a crash, a missing interpreter) is a warning and
    # exit 0. 75 is EX_TEMPFAIL in sysexits.h; nothing else in pveclean uses it.
    REFUSE = 75
    INTERNAL = 70  # a bug in pveclean (EX_SOFTWARE): the message names the exception
    NOT_ROOT = 77  # run by a user other than root (EX_NOPERM): nothing was read or done
    INTERRUPTED = 130  # Ctrl-C
    PIPE = 141  # standard output closed early, as for a program that SIGPIPE ends


# What each exit code means, as `pveclean --help` and pveclean(8)'s EXIT STATUS say it.
EXIT_MEANING: dict[ExitCode, str] = {
    ExitCode.OK: "clean, nothing to do, a dry run, or help shown",
    ExitCode.RESIDUAL: "GPU holders or their memory remain (residual, leaked)",
    ExitCode.USAGE: "usage or config error",
    ExitCode.ACCESS: "container missing, or pct/cgroup/API access failed",
    ExitCode.REPORT: "the report could not be written",
    ExitCode.BUSY: "another run holds the container's lock",
    ExitCode.NOT_JUDGED: "NVML did not answer for the GPU memory (not-judged)",
    ExitCode.INTERNAL: "internal error (a bug in pveclean: please report it)",
    ExitCode.REFUSE: "a hook's pre-start refused the start (pre_start_policy: refuse)",
    ExitCode.NOT_ROOT: "not run as root",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
    ExitCode.PIPE: "standard output closed early (| head)",
}


class PvecleanError(Exception):
    """An error with a one-line message for the admin and an exit code. It pickles with both
    (it crosses a worker whole, see host/worker.py)."""

    def __init__(self, message: str, exit_code: int = ExitCode.ACCESS) -> None:
        super().__init__(message)
        self.message, self.exit_code = message, exit_code

    def __reduce__(self) -> tuple[type[PvecleanError], tuple[str, int]]:
        return type(self), (self.message, self.exit_code)


class ConfigError(Exception):
    """A config file that cannot be used; the message is one line for the admin."""


def need_root() -> None:
    """One line instead of a PermissionError deep in a run: pveclean reads every process's
    /proc, /etc/pve and its 0600 reports, and signals."""
    if os.geteuid() != 0:
        raise PvecleanError("must be run as root (it reads every process, /etc/pve and its "
                            "reports); try: sudo pveclean ...", ExitCode.NOT_ROOT)


def fail(message: str, code: int, as_json: bool = False) -> int:
    """Say `message` on stderr, one line; under --json also as a JSON object on stdout, so
    that a script reading stdout gets JSON whatever happened."""
    if as_json:
        with contextlib.suppress(OSError):
            sys.stdout.write(json.dumps({"error": message, "exit_code": int(code)}) + "\n")
            sys.stdout.flush()
    sys.stderr.write(f"pveclean: {message}\n")
    return code


def guarded(fn: Callable[[], int], as_json: bool = False) -> int:
    """Run a command: every expected failure becomes one line and an exit code, never a
    traceback (with `as_json`, also a JSON object on stdout)."""
    try:
        return fn()
    except ConfigError as exc:
        return fail(str(exc), ExitCode.USAGE, as_json)
    except PvecleanError as exc:
        return fail(str(exc), exc.exit_code, as_json)
    except KeyboardInterrupt:
        return fail("interrupted", ExitCode.INTERRUPTED)
    except BrokenPipeError:  # `pveclean gpus | head -1`: the reader is gone, nothing to say
        with contextlib.suppress(OSError):  # and nothing more to flush into the dead pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.PIPE
    except Exception as exc:  # never a traceback
        return fail(f"internal error: {type(exc).__name__}: {exc}", ExitCode.INTERNAL, as_json)
