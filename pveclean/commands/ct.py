"""`pveclean ct VMID [...]`: the body of the command (its options are typer's, commands/cli.py)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass

from pveclean.cleanup import RunOptions, clean
from pveclean.commands.dryview import render_dry_run
from pveclean.commands.render import render_run
from pveclean.core.text import safe
from pveclean.errors import ExitCode
from pveclean.host.configfile import load
from pveclean.host.prelude import NvmlWorker
from pveclean.proxmox.pveconf import parse_vmid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.amendments import NotListed
    from pveclean.core.report import Report


@dataclass
class CtArgs:
    """What `pveclean ct` was asked, as typer parsed it."""

    vmid: str
    dry_run: bool = False
    as_json: bool = False
    grace: float | None = None
    stop_units: bool = False
    config: str | None = None
    report_file: str | None = None


def save_to(path: str, rep: Report) -> str | None:
    """The report as YAML in a new file `path` (0600, never over another file), where the
    admin asks for it (--report-file); the error, in one line, or None."""
    from pveclean.host.reportfiles import to_yaml  # the report writer: not a dry run's

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return f"cannot write the report to {path}: {exc.strerror}"
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(to_yaml(rep.as_dict()))
    return None


def not_listed_line(more: NotListed) -> str:
    """The holders past the report's caps (core/bounds.py), in one line."""
    outcomes = ", ".join(f"{safe(k, 20)} {safe(v, 12)}" for k, v in more.outcomes.items())
    names = ", ".join(f"{safe(k, 40)} ({safe(v, 12)})" for k, v in more.names.items())
    return (f"... and {safe(more.count, 12)} more holder(s) not listed ({outcomes}): host "
            f"PIDs {safe(more.host_pids, 400)}; names {safe(names, 400)}")


def terminal_columns() -> int:
    """The terminal's width; 80 when stdout is not a terminal (a pipe, a log)."""
    return shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else 80


def run(args: CtArgs, nvml: NvmlWorker) -> int:
    """Load the config, clean the container, print the result; returns the exit code.
    `nvml`: the run's NVML worker, forked by __main__ before the run's imports (prelude.py)."""
    cfg = load(args.config)
    vid = parse_vmid(args.vmid)
    worker = nvml.warm(cfg, vid)
    progress = None
    if not args.as_json and sys.stderr.isatty():

        def progress(msg: str) -> None:
            print(f"... {safe(msg, 300)}", file=sys.stderr, flush=True)

    # a dry run only reads: no report file, no syslog line, no metrics (an alert on the last
    # verdict must not be silenced by a look), no keep_reports slot used
    result = clean(vid, cfg, worker, RunOptions(dry_run=args.dry_run, grace=args.grace,
                   progress=progress, stop_units=args.stop_units,
                   write_report=not args.dry_run))
    if args.as_json:
        print(json.dumps(result.report.as_dict(), indent=2, default=str))
    else:
        rep = result.report
        if args.dry_run:
            print(render_dry_run(rep, terminal_columns(), args.grace if args.grace is not None
                                 else cfg.grace_seconds))
        else:
            print(render_run(rep))
        more = rep.holders_not_listed
        if more:
            print(not_listed_line(more))
        if result.path:
            print(f"report: {result.path}")
    sys.stdout.flush()
    code = result.exit_code
    if args.report_file:
        failed = save_to(args.report_file, result.report)
        if failed:
            print(f"pveclean: {failed}", file=sys.stderr)
            code = max(code, ExitCode.REPORT)
    if result.report_error:
        print(f"pveclean: {result.report_error}", file=sys.stderr)
        if not args.as_json:
            from pveclean.host.reportfiles import unsaved_text

            print("--- report (not saved) ---", file=sys.stderr)
            print(unsaved_text(result.report, result.spare), file=sys.stderr)
        elif result.spare:
            print(f"pveclean: the whole report is in {result.spare}", file=sys.stderr)
    return code
