"""Entry point. `pveclean hook ...` and `pveclean unit ...` take a lean path (no typer, no
proxmoxer): they run on every container start and stop."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "hook":
        from .hook import main as hook_main

        return hook_main(args[1:])
    if args and args[0] == "unit":  # the systemd drop-in: every start and stop, lean too
        from .unit import from_argv

        return from_argv(args[1:])
    from .cli import run_app

    return run_app(args)


if __name__ == "__main__":
    sys.exit(main())
