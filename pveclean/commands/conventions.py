"""The conventions every `pveclean` command keeps: -h and --help, help on stdout, plain
help text, the exit codes, the root check, finite numbers, completion of VMIDs and phases,
and JSON errors under --json."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence

import click
import typer
from typer.core import TyperCommand, TyperGroup

from pveclean.errors import EXIT_MEANING
from pveclean.errors import need_root as need_root  # where the commands find it

EXIT_CODES_HELP = "Exit codes: " + "; ".join(
    f"{int(c)} {m}" for c, m in sorted(EXIT_MEANING.items())) + "."
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
PVE_LXC = "/etc/pve/lxc"  # where completion finds the VMIDs


class Passed(Exception):
    """Carries a Ctrl-C or a closed stdout past click's own handling of them, to guarded()."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class Formatter(click.HelpFormatter):
    """typer escapes `[required]` as `\\[required]` for rich whenever rich is installed (the
    venv route), even with rich output off: plain help shows it plain."""

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30,
                 col_spacing: int = 2) -> None:
        super().write_dl([(a, b.replace("\\[", "[")) for a, b in rows], col_max, col_spacing)


class Context(click.Context):
    formatter_class = Formatter


class Command(TyperCommand):
    context_class = Context


class Group(TyperGroup):
    context_class = Context

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        """Without typer's --install-completion (it writes root's ~/.bashrc) and
        --show-completion: the package ships bash completion."""
        return [p for p in super().get_params(ctx)
                if p.name not in ("install_completion", "show_completion")]

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, BrokenPipeError) as exc:
            raise Passed(exc) from None


def finite(value: float | None) -> float | None:
    """Reject nan and inf: every comparison with a NaN is false, so a range check alone
    lets it through (--grace nan sent SIGTERM, then the stop raised)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def complete_vmids(incomplete: str) -> list[str]:
    """The containers of this cluster, from pmxcfs' node-local view of /etc/pve/lxc."""
    try:
        names = os.listdir(PVE_LXC)
    except OSError:
        return []
    ids = sorted((n.removesuffix(".conf") for n in names if n.endswith(".conf")), key=len)
    return [i for i in ids if i.isdigit() and i.startswith(incomplete)]


def complete_from(words: Sequence[str]) -> Callable[[str], list[str]]:
    return lambda incomplete: [w for w in words if w.startswith(incomplete)]


def wants_json(args: list[str]) -> bool:
    """Whether the command line asks for --json (before any `--`): its errors are JSON too."""
    return "--json" in (args[:args.index("--")] if "--" in args else args)
