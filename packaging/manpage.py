#!/usr/bin/env python3
"""pveclean(8) and pveclean.yaml(5) in roff. pveclean(8) is built from the CLI's own help:
the click command tree behind the typer app, every command's help text and every parameter's
help record (what `--help` prints), and the exit codes from pveclean.errors; pveclean.yaml(5)
from the config's schema (every key, its type and default) and the comments of the shipped
config/pveclean.yaml.

Usage: manpage.py [--date YYYY-MM-DD] [--page 8|yaml.5] [OUT]   (stdout without OUT)

Run it with the tree to document first on sys.path (debian/rules runs it on the staged
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

HERE = Path(__file__).resolve().parent
FILES = (
    ("/etc/pveclean/pveclean.yaml", "the configuration (a conffile; $PVECLEAN_CONFIG or "
     "--config name another one), see pveclean.yaml(5)."),
    ("/usr/share/pveclean/hookscripts/pveclean-hook", "the guest hookscript that "
     "pveclean install copies to a storage's snippets directory."),
    ("/var/log/pveclean/", "one YAML report per run (0600), pruned on every run by "
     "keep_reports and max_report_age_days over every container."),
    ("/usr/lib/tmpfiles.d/pveclean.conf", "creates the report and state directories, root only "
     "(systemd-tmpfiles); reports age by keep_reports and max_report_age_days."),
    ("/run/pveclean/unsaved/", "reports that could not be written to the report directory."),
    ("/var/lib/pveclean/", "locks, and the hookscripts that pveclean install --chain replaced."),
    ("/etc/pve/lxc/VMID.conf", "the containers' configs (read, never written; the VMIDs "
     "completion offers)."),
    ("/usr/share/bash-completion/completions/pveclean", "bash completion of commands, "
     "options, VMIDs and hook phases."),
)
EXAMPLES = (
    ("pveclean ct 129 --dry-run", "what a cleanup of CT 129 would stop and free, and what it "
     "leaves alone; nothing signalled, nothing written."),
    ("pveclean ct 129", "stop CT 129's GPU holders, verify the memory is free, write a report."),
    ("pveclean install --all --dry-run", "the hookscript plan for every container with GPUs."),
    ("pveclean install --all --systemd", "register it, and the systemd drop-ins."),
    ("pveclean gpus --watch 2", "who holds which GPU, refreshed every 2 s."),
    ("pveclean reports --verdict residual", "past runs that left holders behind."),
    ("pveclean status --json", "every container, its GPUs, hook and last report, as JSON."),
)
ENVIRONMENT = (
    ("PVECLEAN_CONFIG", "the configuration file when no --config is given."),
    ("TERM", "gpus --watch redraws in place only on a terminal whose TERM is set and not dumb."),
    ("COLUMNS", "the width of a dry run's view on a terminal (never under 80)."),
    ("INVOCATION_ID", "set by systemd: pveclean unit then says a bad argument in the journal "
     "and exits 0, so that a start goes on."),
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
        ".SH EXIT STATUS",
        *exit_status(),
        ".SH EXAMPLES",
        *[line for ex, what in EXAMPLES for line in (".TP", f".B {esc(ex)}", esc(what))],
        ".SH FILES",
    ]
    for path, what in FILES:
        lines += [".TP", f".I {esc(path)}", esc(what)]
    lines += [".SH ENVIRONMENT"]
    for name, what in ENVIRONMENT:
        lines += [".TP", f".B {name}", esc(what)]
    lines += [
        ".SH SEE ALSO",
        ".BR pveclean.yaml (5),",
        ".BR pct (1),",
        ".BR nvidia\\-smi (1),",
        ".BR systemd\\-tmpfiles (8),",
        "/usr/share/doc/pveclean/README.md",
    ]
    return "\n".join(lines) + "\n"


def exit_status() -> list[str]:
    from pveclean.errors import EXIT_MEANING

    out = []
    for code, meaning in sorted(EXIT_MEANING.items()):
        out += [".TP", f".B {int(code)}", esc(meaning)]
    return out


def yaml_comments(path: Path) -> dict[str, str]:
    """Each top-level key of the annotated config and the comment above it (a key without
    one shares the previous key's)."""
    out: dict[str, str] = {}
    block: list[str] = []
    last = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            block.append(line.lstrip("#").strip())
        elif not line.strip():
            if block and not out:  # the file's own header
                block = []
        elif not line[0].isspace() and ":" in line:
            key = line.split(":", 1)[0]
            if block:
                last = " ".join(block)
            out[key] = last
            block = []
    return out


def render_config(date: str, sample: Path | None = None) -> str:
    """pveclean.yaml(5): every key of the config's schema, with its type, its default and
    what the shipped config says of it."""
    from dataclasses import fields

    from pveclean import __version__
    from pveclean.core import config

    comments = yaml_comments(sample or HERE.parent / "config" / "pveclean.yaml")
    defaults = config.Config()
    lines = [
        f'.TH PVECLEAN.YAML 5 "{date}" "pveclean {__version__}" "File Formats"',
        ".SH NAME",
        "pveclean.yaml \\- configuration of pveclean",
        ".SH SYNOPSIS",
        ".I /etc/pveclean/pveclean.yaml",
        ".SH DESCRIPTION",
        ".PP",
        esc("A YAML mapping, read with PyYAML's safe loader. Search order: --config PATH, "
            "then $PVECLEAN_CONFIG, then /etc/pveclean/pveclean.yaml, then the built-in "
            "defaults. Unknown keys and wrong types are errors naming the key and its line "
            "(pveclean config check shows them). Run as root, the file must be owned by root "
            "and not writable by group or others."),
        ".SH KEYS",
    ]
    for f in fields(config.Config):
        if f.name == "source":
            continue
        kind = config._SCHEMA[f.name][0]
        default = getattr(defaults, f.name)
        shown = "null" if default is None else str(default).lower() if isinstance(
            default, bool) else ", ".join(map(str, default)) if isinstance(default, list) \
            else str(default)
        if len(shown) > 100:  # the redact patterns: too long for a line
            shown = f"{len(default)} patterns, those of the annotated default file"
        lines += [".TP", f".B {esc(f.name)}",
                  esc(f"{kind[0].upper()}{kind[1:]}; default: {shown}."),
                  *([".br", esc(comments[f.name])] if comments.get(f.name) else [])]
    lines += [
        ".SH EXAMPLE",
        ".PP",
        ".nf",
        esc("grace_seconds: 20\nkeep_reports: 200\npre_start_policy: refuse\n"
            "metrics_path: /var/lib/prometheus/node-exporter/pveclean.prom"),
        ".fi",
        ".SH FILES",
        ".TP",
        ".I /etc/pveclean/pveclean.yaml",
        "the configuration; /usr/share/doc/pveclean has the annotated default.",
        ".SH SEE ALSO",
        ".BR pveclean (8)",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--date", default=dt.date.today().isoformat())
    ap.add_argument("--page", choices=("8", "yaml.5"), default="8",
                    help="pveclean(8) (default) or pveclean.yaml(5)")
    args = ap.parse_args()
    text = render(args.date) if args.page == "8" else render_config(args.date)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
