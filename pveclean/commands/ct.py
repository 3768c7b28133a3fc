"""`pveclean ct VMID [...]`: the body of the command, and a lean way in that skips typer.

typer and click cost more to import than the rest of a `ct --dry-run` together, so the common
invocations (the flags below, in any order) are parsed here; anything else (`--help`, a typo,
a missing value) goes to typer, which owns the messages and the help text.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from pveclean.errors import ExitCode, PvecleanError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.host.worker import Worker


FLAGS = {"--dry-run": "dry_run", "--json": "as_json", "--stop-units": "stop_units"}
VALUES = {"--grace": "grace", "--config": "config", "-c": "config"}


@dataclass
class CtArgs:
    vmid: str
    dry_run: bool = False
    as_json: bool = False
    grace: float | None = None
    stop_units: bool = False
    config: str | None = None


def grace_value(text: str) -> float:
    """--grace: a finite number of seconds 0..3600 (a NaN passes every range check)."""
    try:
        value = float(text)
    except ValueError:
        raise PvecleanError(f"--grace: {text!r} is not a number", ExitCode.USAGE) from None
    if not math.isfinite(value) or not 0 <= value <= 3600:
        raise PvecleanError(f"--grace: {text} is not a number of seconds 0..3600", ExitCode.USAGE)
    return value


def parse(argv: list[str]) -> CtArgs | None:
    """The arguments after `ct`, or None when typer should handle them."""
    vmid: str | None = None
    opts: dict[str, object] = {}
    it = iter(argv)
    for arg in it:
        name, eq, inline = arg.partition("=")
        if arg in FLAGS:
            opts[FLAGS[arg]] = True
        elif name in VALUES and (eq or arg in VALUES):
            value = inline if eq else next(it, None)
            if value is None or VALUES[name] in opts:
                return None
            opts[VALUES[name]] = value
        elif arg.startswith("-") or vmid is not None:
            return None
        else:
            vmid = arg
    if vmid is None:
        return None
    grace = opts.pop("grace", None)
    args = CtArgs(vmid, **opts)  # type: ignore[arg-type]
    args.grace = grace_value(str(grace)) if grace is not None else None
    return args


def run(args: CtArgs, wk: Worker | None = None) -> int:
    """Load the config, clean the container, print the result; returns the exit code. `wk`:
    the run's worker, forked early by __main__ (prelude.py); else forked here."""
    from pveclean.host import prelude

    if wk is None:
        with prelude.begin() as own:
            return run(args, own)
    from pveclean.cleanup import clean
    from pveclean.host.configfile import load
    from pveclean.proxmox.pveconf import parse_vmid

    cfg = load(args.config)
    vid = parse_vmid(args.vmid)
    prelude.warm(wk, cfg, vid)
    progress = None
    if not args.as_json and sys.stderr.isatty():
        from pveclean.core.text import safe

        def progress(msg: str) -> None:
            print(f"... {safe(msg, 300)}", file=sys.stderr, flush=True)

    result = clean(vid, cfg, dry_run=args.dry_run, grace=args.grace, progress=progress,
                   stop_units=args.stop_units, worker=wk)
    if args.as_json:
        import json

        print(json.dumps(result.report.as_dict(), indent=2, default=str))
    else:
        from pveclean.commands.render import render_run

        print(render_run(result.report.as_dict()))
        if result.path:
            print(f"report: {result.path}")
    sys.stdout.flush()
    if result.report_error:
        print(f"pveclean: {result.report_error}", file=sys.stderr)
        if not args.as_json:
            from pveclean.host.reportfiles import to_yaml

            print("--- report (not saved) ---", file=sys.stderr)
            print(to_yaml(result.report.as_dict(), terminal=True), file=sys.stderr)
    return result.exit_code
