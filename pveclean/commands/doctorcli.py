"""`pveclean doctor`'s registration on the typer app (commands/cli.py calls `register`)."""

from __future__ import annotations

from typing import Annotated

import typer

from pveclean.commands.conventions import Command, complete_vmids, need_root
from pveclean.commands.options import ConfigOpt, JsonOpt
from pveclean.host.configfile import load


def doctor(
    vmids: Annotated[
        list[str] | None,
        typer.Argument(metavar="[VMID]...", help="Containers (or VMs) to check; default: every "
                       "GPU container.", show_default=False, autocompletion=complete_vmids),
    ] = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Why a GPU container will not see its GPU: its NVIDIA libraries against the host
    driver's version, device majors that moved, nodes the host lacks, binds without allow
    rules (and the reverse), a node put in twice, a GPU also passed to a VM, persistence mode
    off, nodes bound from what is no device. One row per finding with its evidence and fix.
    Reads only; runs nothing inside a container.

    Exit codes: 0 nothing found; 1 findings; 2 usage or config error; 3 the host could not be
    read within deadline_seconds.

    Examples: pveclean doctor | pveclean doctor 129 --json
    """
    from pveclean.commands.doctor import run

    need_root()
    raise typer.Exit(run(load(config), list(vmids or []), as_json, typer.echo))


def register(app: typer.Typer) -> None:
    app.command(cls=Command)(doctor)
