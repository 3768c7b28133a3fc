"""Entry point. `pveclean hook ...` takes a lean path (no typer, no proxmoxer): it runs on
every container start and stop."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "hook":
        from .hook import main as hook_main

        return hook_main(args[1:])
    from .cli import run_app

    return run_app(args)


if __name__ == "__main__":
    sys.exit(main())
