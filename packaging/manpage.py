#!/usr/bin/env python3
"""pveclean(8) in roff, built from the CLI's own help: the click command tree behind the typer
app, every command's help text and every parameter's help record (what `--help` prints).

Usage: manpage.py [--date YYYY-MM-DD] [OUT]   (stdout without OUT)

Run it with the tree to document first on sys.path (build_deb.py runs it on the staged
/usr/lib/pveclean). rich is hidden so that the text is the plain click help an installed
pveclean prints (the package does not ship rich).
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import re
import sys
from pathlib import Path
from typing import Any

FILES = (
    ("/etc/pveclean/pveclean.yaml", "the configuration (a conffile; $PVECLEAN_CONFIG or "
     "--config name another one)."),
    ("/usr/share/pveclean/hookscripts/pveclean-hook", "the guest hookscript that "
     "pveclean install copies to a storage's snippets directory."),
    ("/var/log/pveclean/", "one YAML report per run."),
    ("/var/lib/pveclean/", "locks, and the hookscripts that pveclean install --chain replaced."),
)


def esc(text: str) -> str:
    """Text for roff: backslashes, hyphens as minus signs, no control character at a line
    start."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"(?m)^([.'])", r"\\&\1", text)


def paragraphs(text: str) -> list[str]:
    """Help text as roff paragraphs; click's \\b blocks (no rewrap) stay preformatted."""
    text = inspect.cleandoc(text).split("\f", 1)[0]
    out = []
    for para in re.split(r"\n\s*\n", text.strip()):
        if para.startswith("\b"):
            body = para[1:].strip("\n")
            out.append(".PP\n.nf\n" + esc(body) + "\n.fi")
        else:
            out.append(".PP\n" + esc(" ".join(para.split())))
    return out


def params_section(cmd: Any, ctx: Any) -> list[str]:
    import click

    args: list[str] = []
    opts: list[str] = []
    for p in cmd.get_params(ctx):
        rec = p.get_help_record(ctx)
        if rec is None and isinstance(p, click.Argument):
            make: Any = p.make_metavar  # click 8.2 added ctx
            rec = (make(ctx) if _metavar_takes_ctx(p) else make(), "")
        if rec is None:
            continue
        term, text = rec
        helptext = getattr(p, "help", None)
        if isinstance(p, click.Argument) and helptext and helptext not in text:
            text = f"{helptext}  {text}".strip()
        entry = f".TP\n.B {esc(term)}\n{esc(' '.join(text.split()))}"
        (args if isinstance(p, click.Argument) else opts).append(entry)
    out = []
    if args:
        out.append(".PP\nArguments:\n.RS\n" + "\n".join(args) + "\n.RE")
    if opts:
        out.append(".PP\nOptions:\n.RS\n" + "\n".join(opts) + "\n.RE")
    return out


def _metavar_takes_ctx(p: Any) -> bool:
    return "ctx" in inspect.signature(p.make_metavar).parameters


def walk(cmd: Any, ctx: Any, path: list[str]) -> list[str]:
    """One .SS per command, depth first, in the order `--help` lists them."""
    import click

    out = []
    if path:
        usage = " ".join(["pveclean", *path, *cmd.collect_usage_pieces(ctx)])
        out.append(f".SS {esc(' '.join(path))}")
        out.append(f".PP\n.B {esc(usage)}")
        out += paragraphs(cmd.help or "")
        out += params_section(cmd, ctx)
        if cmd.epilog:
            out += paragraphs(cmd.epilog)
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            out += walk(sub, click.Context(sub, info_name=name, parent=ctx), [*path, name])
    return out


def render(date: str) -> str:
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]  # plain click help
    import click
    import typer.main

    from pveclean import __version__
    from pveclean.commands.cli import app

    cmd = typer.main.get_command(app)
    ctx = click.Context(cmd, info_name="pveclean")
    help_paras = inspect.cleandoc(cmd.help or "").split("\n\n")
    summary = help_paras[0].rstrip(".")
    lines = [
        f'.TH PVECLEAN 8 "{date}" "pveclean {__version__}" "System Administration"',
        ".SH NAME",
        f"pveclean \\- {esc(summary[0].lower() + summary[1:])}",
        ".SH SYNOPSIS",
        ".B pveclean",
        ".RI [ OPTIONS ] \" COMMAND \" [ ARGS ]...",
        ".SH DESCRIPTION",
        *paragraphs(cmd.help or ""),
        *params_section(cmd, ctx),
        ".SH COMMANDS",
        *walk(cmd, ctx, []),
        ".SH FILES",
    ]
    for path, what in FILES:
        lines += [".TP", f".I {esc(path)}", esc(what)]
    lines += [
        ".SH ENVIRONMENT",
        ".TP",
        ".B PVECLEAN_CONFIG",
        "the configuration file when no \\-\\-config is given.",
        ".SH SEE ALSO",
        ".BR pct (1),",
        ".BR nvidia\\-smi (1),",
        "/usr/share/doc/pveclean/README.md",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--date", default=dt.date.today().isoformat())
    args = ap.parse_args()
    text = render(args.date)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
