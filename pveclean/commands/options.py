"""The options and arguments several `pveclean` commands share (typer annotations)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pveclean.commands.conventions import complete_from, complete_vmids, finite

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (else $PVECLEAN_CONFIG, else "
                 "/etc/pveclean/pveclean.yaml, else built-in defaults)."),
]

VmidArg = Annotated[str, typer.Argument(help="Container ID, e.g. 129.",
                                        autocompletion=complete_vmids)]
GraceOpt = Annotated[
    float | None, typer.Option("--grace", min=0, max=3600, callback=finite,
                               help="Seconds from SIGTERM to SIGKILL.")
]
StopUnitsOpt = Annotated[
    bool, typer.Option("--stop-units", help="First stop the holders' systemd units in the "
                       "container (pct exec VMID -- systemctl stop UNIT...), so that "
                       "Restart= does not bring them back.")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]
VmidsArg = Annotated[list[str] | None, typer.Argument(help="Container IDs (VM IDs with --vm).",
                                                      autocompletion=complete_vmids)]
VmOpt = Annotated[bool, typer.Option("--vm", help="The IDs are VMs passing an NVIDIA GPU "
                                     "through: their hookscript frees it before they start.")]
PhaseArg = Annotated[str, typer.Argument(
    help="pre-start, post-start, pre-stop or post-stop.",
    autocompletion=complete_from(("pre-start", "post-start", "pre-stop", "post-stop")))]
