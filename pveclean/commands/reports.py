"""`pveclean reports`: list past runs, or render one report (its options are typer's,
commands/cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

from pveclean.commands.render import render_report, reports_table
from pveclean.core.config import Config
from pveclean.core.reportread import row_of
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import reportfiles
from pveclean.proxmox.pveconf import parse_vmid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def show_one(cfg: Config, args: list[str], as_json: bool, echo: Callable[[str, bool], None]
             ) -> None:
    """`reports show FILE|latest [VMID]`."""
    which = args[1] if len(args) > 1 else "latest"
    vid = parse_vmid(args[2]) if len(args) > 2 else None
    if which == "latest":
        files = reportfiles.list_reports(cfg.report_dir, vid)
        if not files:
            raise PvecleanError(f"no reports in {cfg.report_dir}", ExitCode.USAGE)
        path = files[-1]
    else:
        path = Path(which) if "/" in which else Path(cfg.report_dir) / which
    try:
        # --json: the file's own values, as they are (a VM's report too); else typed
        doc = reportfiles.load(path)
        # a VM hook's or a reset's report: its own values, as --json shows
        own = doc.get("kind") in ("vm", "reset")
        text = (json.dumps(doc, indent=2, default=str) if as_json or own
                else render_report(reportfiles.load_report(path)))
    except (OSError, reportfiles.ReportError) as exc:
        raise PvecleanError(f"cannot read report {path}: {exc}", ExitCode.USAGE) from None
    except Exception as exc:  # a corrupt file: one line, not a traceback
        raise PvecleanError(f"{path} is not a readable report: {exc}", ExitCode.USAGE) from None
    echo(text, False)
    echo(f"report: {path}", True)


def list_runs(cfg: Config, args: list[str], last: int, verdict: str | None, as_json: bool,
              echo: Callable[[str, bool], None]) -> None:
    """`reports [VMID]`: the last `last` runs, those with `verdict` only when given."""
    if args and args[0] == "show":
        show_one(cfg, args, as_json, echo)
        return
    if len(args) > 1:
        raise PvecleanError("usage: pveclean reports [VMID] | reports show FILE|latest [VMID]",
                            ExitCode.USAGE)
    vid = parse_vmid(args[0]) if args else None
    rows = []
    for path in reportfiles.list_reports(cfg.report_dir, vid):
        try:
            data = reportfiles.load(path)
        except Exception:
            continue  # an unreadable file does not hide the others
        if verdict is None or data.get("verdict") == verdict:
            rows.append((path.name, data))
    rows = rows[-last:]
    if as_json:  # the files' own values, as they are
        echo(json.dumps([{"file": n, **{k: d.get(k) for k in (
            "start", "vmid", "phase", "verdict", "duration_s", "summary")}} for n, d in rows],
            indent=2, default=str), False)
    elif not rows:
        what = (f" for CT {vid}" if vid else "") + (f" with verdict {verdict}" if verdict else "")
        echo(f"no reports in {cfg.report_dir}{what}", False)
    else:
        echo("\n".join(reports_table([row_of(n, d) for n, d in rows])), False)
