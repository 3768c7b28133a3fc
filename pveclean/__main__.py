"""Entry point: makes the run's NVML worker (forked at once for `ct` and the pre-stop and
post-stop hooks, before any heavy import: host/prelude.py), then runs the command.
`pveclean hook VMID PHASE`, `pveclean vmhook VMID PHASE` and `pveclean unit [-c FILE] VMID
PHASE` take a fixed argv from Proxmox and systemd on every guest start and stop, and
`pveclean metrics --textfile-dir DIR` from pveclean-metrics.service every 30 s: they skip
typer (and proxmoxer); any other form of them (help, more options) goes through typer.
Every other command goes through the typer app (commands/cli.py)."""

from __future__ import annotations

import contextlib
import os
import sys

from pveclean.host.prelude import NvmlWorker, forks_early

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn


def timer_argv(args: list[str]) -> bool:
    """The command line pveclean-metrics.service runs: `metrics --textfile-dir DIR`, DIR
    not an option (`-h` there is typer's to read)."""
    return (len(args) == 3 and args[:2] == ["metrics", "--textfile-dir"]
            and args[2][:1] not in ("", "-"))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with NvmlWorker(early=forks_early(args)) as nvml:
        if args[:1] in (["hook"], ["unit"], ["vmhook"]) and ("-h" in args or "--help" in args):
            pass  # by hand at a terminal: typer's help, with its examples (below)
        elif args[:1] == ["hook"]:
            from pveclean.commands.hook import main as hook_main

            return hook_main(args[1:], nvml)
        elif args[:1] == ["unit"]:
            from pveclean.commands.unit import from_argv

            return from_argv(args[1:], nvml)
        elif args[:1] == ["vmhook"]:
            from pveclean.commands.vmhook import main as vmhook_main

            return vmhook_main(args[1:], nvml)
        elif timer_argv(args):
            from pveclean.commands.metrics import from_timer

            return from_timer(args[2])
        from pveclean.commands.cli import run_app

        return run_app(args, nvml)


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
