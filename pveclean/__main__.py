"""Entry point. `pveclean hook ...` and `pveclean unit ...` take a lean path (no typer, no
proxmoxer): they run on every container start and stop. `pveclean ct ...`, `gpus`,
`gpus --json` and `--version` skip typer too when their arguments are the common ones
(typer's import is most of a dry run's time); anything else goes through the typer app."""

from __future__ import annotations

import contextlib
import os
import sys

from pveclean.errors import guarded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "hook":
        from pveclean.host import prelude

        # pre-stop, post-stop: the worker is forked before the hook's imports (prelude.py)
        early = (prelude.begin_early() if len(args) == 3 and args[2] in prelude.NVML_PHASES
                 else None)
        try:
            from pveclean.commands.hook import main as hook_main

            return hook_main(args[1:], early)
        finally:
            if early is not None:
                early.close()
    if args and args[0] == "unit":  # the systemd drop-in: every start and stop, lean too
        from pveclean.commands.unit import from_argv

        return from_argv(args[1:])
    if args == ["--version"]:
        from pveclean import __version__

        print(f"pveclean {__version__}")
        return 0
    if args and args[0] == "ct":
        from pveclean.host import prelude

        wk = prelude.begin_early()  # forked before the run's imports (prelude.py)
        try:
            from pveclean.commands import ct
            from pveclean.errors import PvecleanError

            try:
                parsed = ct.parse(args[1:])
            except PvecleanError:  # a bad --grace: typer says it the usual way
                parsed = None
            if parsed is not None:
                return guarded(lambda: ct.run(parsed, wk))
        finally:
            if wk is not None:
                wk.close()
    if args in (["gpus"], ["gpus", "--json"]):  # the usual look at the GPUs, lean too
        from pveclean.commands.gpus import show
        from pveclean.host.configfile import load

        # Its worker is forked once gpus.py is imported: one forked before would have to
        # import it (and nvidia-ml-py) after the request, which measured slower.
        return guarded(lambda: show(load(None), as_json=len(args) == 2))
    from pveclean.commands.cli import run_app

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
