"""Entry point. `pveclean hook ...` and `pveclean unit ...` take a lean path (no typer, no
proxmoxer): they run on every container start and stop. `pveclean ct ...`, `gpus`,
`gpus --json` and `--version` skip typer too when their arguments are the common ones
(typer's import is most of a dry run's time); anything else goes through the typer app."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn


EXIT_PIPE = 141  # standard output closed early, as for a program that SIGPIPE ends


def fail(message: str, code: int) -> int:
    sys.stderr.write(f"pveclean: {message}\n")
    return code


def guarded(fn: Callable[[], int]) -> int:
    """Run a command: every expected failure becomes one line and an exit code, never a
    traceback (the lean commands and the typer app alike)."""
    from .config import ConfigError
    from .model import EXIT_ACCESS, EXIT_USAGE, PvecleanError

    try:
        return fn()
    except ConfigError as exc:
        return fail(str(exc), EXIT_USAGE)
    except PvecleanError as exc:
        return fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except BrokenPipeError:  # `pveclean gpus | head -1`: the reader is gone, nothing to say
        with contextlib.suppress(OSError):  # and nothing more to flush into the dead pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except Exception as exc:  # never a traceback
        return fail(f"internal error: {type(exc).__name__}: {exc}", EXIT_ACCESS)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "hook":
        from . import prelude

        # pre-stop, post-stop: the worker is forked before the hook's imports (prelude.py)
        early = (prelude.begin_early() if len(args) == 3 and args[2] in prelude.NVML_PHASES
                 else None)
        try:
            from .hook import main as hook_main

            return hook_main(args[1:], early)
        finally:
            if early is not None:
                early.close()
    if args and args[0] == "unit":  # the systemd drop-in: every start and stop, lean too
        from .dropin import from_argv

        return from_argv(args[1:])
    if args == ["--version"]:
        from . import __version__

        print(f"pveclean {__version__}")
        return 0
    if args and args[0] == "ct":
        from . import prelude

        wk = prelude.begin_early()  # forked before the run's imports (prelude.py)
        try:
            from . import ctcmd
            from .model import PvecleanError

            try:
                parsed = ctcmd.parse(args[1:])
            except PvecleanError:  # a bad --grace: typer says it the usual way
                parsed = None
            if parsed is not None:
                return guarded(lambda: ctcmd.run(parsed, wk))
        finally:
            if wk is not None:
                wk.close()
    if args in (["gpus"], ["gpus", "--json"]):  # the usual look at the GPUs, lean too
        from .config import load
        from .gpus import show

        # Its worker is forked once gpus.py is imported: one forked before would have to
        # import it (and nvidia-ml-py) after the request, which measured slower.
        return guarded(lambda: show(load(None), as_json=len(args) == 2))
    from .cli import run_app

    return run_app(args)


def entry() -> NoReturn:
    """The `pveclean` command: main(), then exit without the interpreter's teardown. Freeing
    the ~200 modules a run imports took 10 ms of a 130 ms dry run, on every hook too; by now
    everything is closed (workers, probe, lock, report) but stdout and stderr, flushed here."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or a broken pipe
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
