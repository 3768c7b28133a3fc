"""`pveclean reset GPU`'s place in the command line (typer), registered by commands/cli.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from pveclean.commands.conventions import need_root
from pveclean.commands.options import ConfigOpt, JsonOpt


def register(command: Callable[..., Callable[[Callable[..., None]], object]]) -> None:
    """Add `reset` to the app through cli's `command` decorator."""

    @command()
    def reset(
        ctx: typer.Context,
        gpu: Annotated[str, typer.Argument(metavar="GPU", help="NVML index, UUID (GPU-...) or "
                                           "PCI id (0000:01:00.0) of the GPU.")],
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", help="Show the plan (what would be stopped, or why it is refused); "
            "change nothing.")] = False,
        as_json: JsonOpt = False,
        config: ConfigOpt = None,
    ) -> None:
        """Reset one GPU through the driver's tool, only when that is safe.

        Refused, naming each, unless every holder of the GPU is a container's (stopped as
        `pveclean ct` stops it, a report each) or a host service pveclean knows how to stop
        and restart (nvidia-persistenced, DCGM's nv-hostengine, Fabric Manager); never a GPU
        a VM owns, or in MIG mode with instances. Persistence mode and the services are
        given back on every path (failure, deadline, Ctrl-C). Report kind: reset.

        Exit codes: 0 reset and verified (a dry run: it would reset); 1 the reset failed,
        timed out or was not verified; 2 usage or config error; 3 the host could not be
        read; 75 refused; 130 interrupted.

        Examples: pveclean reset 0 --dry-run | pveclean reset GPU-5c1e... |
        pveclean reset 0000:01:00.0
        """
        from pveclean.commands.reset import parse_gpu, run
        from pveclean.host.configfile import load

        asked = parse_gpu(gpu)
        need_root()
        raise typer.Exit(run(load(config), asked, dry_run, as_json, ctx.obj))
