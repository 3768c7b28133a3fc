"""The `pveclean` command line (typer). The hook path does not come through here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated

import click
import typer
from typer.core import TyperGroup

from pveclean import __version__
from pveclean.core.config import dump
from pveclean.errors import ExitCode, PvecleanError, guarded
from pveclean.host.configfile import load
from pveclean.host.prelude import NvmlWorker

EXIT_CODES_HELP = (
    "Exit codes: 0 clean, nothing to do or dry run; 1 GPU holders or their memory remain; "
    "2 usage or config error; 3 container missing, or pct/cgroup access failed; "
    "4 report could not be written; 5 another run holds the container's lock; "
    "141 standard output closed early (| head)."
)

class _Passed(Exception):
    """Carries a Ctrl-C or a closed stdout past click's own handling of them, to guarded()."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class _Group(TyperGroup):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, BrokenPipeError) as exc:
            raise _Passed(exc) from None


app = typer.Typer(
    name="pveclean",
    cls=_Group,
    help="Find, stop and verify the GPU holders of one Proxmox LXC container.\n\n"
    + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
config_app = typer.Typer(help="Show and check the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (else $PVECLEAN_CONFIG, else "
                 "/etc/pveclean/pveclean.yaml, else built-in defaults)."),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pveclean {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show version.")
    ] = False,
) -> None:
    """pveclean."""


def _finite(value: float | None) -> float | None:
    """Reject nan and inf: every comparison with a NaN is false, so a range check alone
    lets it through (--grace nan sent SIGTERM, then the stop raised)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


GraceOpt = Annotated[
    float | None, typer.Option("--grace", min=0, max=3600, callback=_finite,
                               help="Seconds from SIGTERM to SIGKILL.")
]
StopUnitsOpt = Annotated[
    bool, typer.Option("--stop-units", help="First stop the holders' systemd units in the "
                       "container (pct exec VMID -- systemctl stop UNIT...), so that "
                       "Restart= does not bring them back.")
]


@app.command()
def ct(
    ctx: typer.Context,
    vmid: Annotated[str, typer.Argument(help="Container ID, e.g. 129.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Find and report; signal nothing.")]
    = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    grace: GraceOpt = None,
    stop_units: StopUnitsOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Stop every GPU holder of container VMID and verify its GPU memory is free.

    A VMID that is a VM exits 2, a container on another node exits 3; the message says so
    and what to run instead.

    Examples: pveclean ct 129 --dry-run | pveclean ct 129 --stop-units
    """
    from pveclean.commands.ct import CtArgs, run

    raise typer.Exit(run(CtArgs(vmid, dry_run, as_json, grace, stop_units,
                                str(config) if config else None), ctx.obj))


@app.command()
def hook(
    ctx: typer.Context,
    vmid: Annotated[str, typer.Argument(help="Container ID.")],
    phase: Annotated[str, typer.Argument(help="pre-start, post-start, pre-stop or post-stop.")],
) -> None:
    """Run a hook phase, as Proxmox calls the hookscript (normally via pveclean-hook).

    Example: pveclean hook 129 pre-stop
    """
    from pveclean.commands.hook import main as hook_main

    raise typer.Exit(hook_main([vmid, phase], ctx.obj))


@app.command()
def unit(
    ctx: typer.Context,
    vmid: Annotated[str, typer.Argument(help="Container ID.")],
    phase: Annotated[str, typer.Argument(help="start-pre or stop-post.")],
    config: ConfigOpt = None,
) -> None:
    """Run from the systemd drop-in that 'install --systemd' writes (ExecStartPre=,
    ExecStopPost=). Exit 1 only when pre_start_policy refuses the start.

    Example: pveclean unit 129 start-pre
    """
    from pveclean.commands.unit import main as unit_main

    raise typer.Exit(unit_main([vmid, phase], ctx.obj, str(config) if config else None))


@app.command()
def install(
    vmids: Annotated[list[str] | None, typer.Argument(help="Container IDs.")] = None,
    all_gpu: Annotated[bool, typer.Option("--all-gpu", help="Every container with GPUs.")]
    = False,
    storage: Annotated[str, typer.Option(help="Storage for the snippet.")] = "local",
    chain: Annotated[bool, typer.Option(help="Keep and call an existing hookscript.")] = False,
    enable_snippets: Annotated[
        bool, typer.Option("--enable-snippets", help="Add 'snippets' to the storage's content.")
    ] = False,
    systemd: Annotated[
        bool, typer.Option("--systemd", help="Also add a pve-container@VMID.service drop-in: "
                           "cleanup before every start, leak check after every stop, the "
                           "reboot from inside the guest included.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]
    = False,
    config: ConfigOpt = None,
) -> None:
    """Register the hookscript on containers (through the Proxmox API, see 'api' in the config).

    Copies hookscripts/pveclean-hook into the storage's snippets directory and sets it as the
    containers' hookscript. Another hookscript is never replaced: without --chain the install
    stops and names it; with --chain pveclean keeps it and runs it in every phase.
    Running it again changes nothing.

    Exit codes: 0 done, nothing to change, or a valid dry run; 2 bad arguments, or the plan
    cannot go ahead (another hookscript, snippets not enabled, an API token...); 3 container
    missing, node offline, container locked, or the API failed.

    Example: pveclean install --all-gpu --dry-run
    """
    from pveclean.commands.install import apply_install, plan_install
    from pveclean.commands.installplan import carry_out
    from pveclean.proxmox.pveapi import connect
    from pveclean.proxmox.pveconf import parse_vmid

    cfg = load(config)
    ids = [parse_vmid(v) for v in vmids or []]
    if bool(ids) == all_gpu:
        raise PvecleanError("give container IDs or --all-gpu (one of them)", ExitCode.USAGE)
    api = connect(cfg)
    plan = plan_install(api, cfg, ids, all_gpu, storage, chain, enable_snippets, systemd)
    raise typer.Exit(carry_out(plan, dry_run, lambda: apply_install(api, cfg, plan),
                               lambda line, err: typer.echo(line, err=err)))


@app.command()
def uninstall(
    vmids: Annotated[list[str] | None, typer.Argument(help="Container IDs.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every container with pveclean's hook.")]
    = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")]
    = False,
    config: ConfigOpt = None,
) -> None:
    """Remove the hookscript, restoring what was there before (a script kept by --chain).

    With --all the snippet file goes too once no container uses it.
    Exit codes as for install.

    Examples: pveclean uninstall 129 | pveclean uninstall --all --dry-run
    """
    from pveclean.commands.install import apply_uninstall, plan_uninstall
    from pveclean.commands.installplan import carry_out
    from pveclean.proxmox.pveapi import connect
    from pveclean.proxmox.pveconf import parse_vmid

    cfg = load(config)
    ids = [parse_vmid(v) for v in vmids or []]
    if bool(ids) == all_:
        raise PvecleanError("give container IDs or --all (one of them)", ExitCode.USAGE)
    api = connect(cfg)
    plan = plan_uninstall(api, cfg, ids, all_)
    raise typer.Exit(carry_out(plan, dry_run, lambda: apply_uninstall(api, cfg, plan),
                               lambda line, err: typer.echo(line, err=err)))


@app.command()
def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Containers, their GPUs, hookscripts and (on this node) current holders and last report.

    Exit codes: 0 shown (warnings included); 2 config error; 3 the API failed.

    Examples: pveclean status | pveclean status --json
    """
    from pveclean.commands.render import render_status as render
    from pveclean.commands.status import collect
    from pveclean.proxmox.pveapi import connect

    cfg = load(config)
    data = collect(connect(cfg), cfg)
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        typer.echo(render(data))


@app.command()
def gpus(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")] = False,
    watch: Annotated[
        float | None, typer.Option("--watch", min=0.5, max=3600, metavar="SECONDS",
                                   help="Refresh every SECONDS in place until Ctrl-C.")
    ] = None,
    count: Annotated[
        int, typer.Option("--count", min=0, max=1_000_000,
                          help="With --watch: stop after N refreshes (0: until Ctrl-C).")
    ] = 0,
    sysfs_pci: Annotated[
        Path, typer.Option("--sysfs-pci", hidden=True, help="PCI sysfs devices directory.")
    ] = Path("/sys/bus/pci/devices"),
    config: ConfigOpt = None,
) -> None:
    """Every GPU of this host and who uses it: containers (VMID, hostname, systemd unit),
    host processes (and their unit), VMs the GPU is passed to; memory per owner, and memory
    no process accounts for (a leak). Signals nothing.

    Exit codes: 0 shown (Ctrl-C during --watch too); 2 usage or config error; 3 the host
    could not be read within deadline_seconds (a hung /etc/pve, a process wedged in the GPU
    driver, NVML).

    Examples: pveclean gpus | pveclean gpus --json | pveclean gpus --watch 2
    """
    from pveclean.commands.gpus import show

    raise typer.Exit(show(load(config), as_json, watch, count, sysfs_pci))


@app.command()
def metrics(
    textfile_dir: Annotated[
        str, typer.Option("--textfile-dir", metavar="DIR",
                          help="node_exporter's textfile collector directory.")
    ] = "/var/lib/prometheus/node-exporter",
    dcgm_job_dir: Annotated[
        str | None, typer.Option("--dcgm-job-dir", metavar="DIR",
                                 help="Also write dcgm-exporter's HPC job mapping files "
                                 "(its --hpc-job-mapping-dir) naming the guests per GPU.")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Write `pveclean gpus`' map of this node to DIR/pveclean_gpus.prom for node_exporter
    (what pveclean-metrics.timer runs). Signals nothing.

    Exit codes: 0 written; 2 usage or config error; 3 the host could not be read within
    deadline_seconds (the file then says pveclean_gpus_up 0); 4 the file could not be written.
    """
    from pveclean.commands.metrics import write

    raise typer.Exit(write(load(config), textfile_dir, job_dir=dcgm_job_dir))


@app.command()
def reports(
    target: Annotated[
        list[str] | None,
        typer.Argument(help="VMID to list, or: show FILE|latest [VMID]", show_default=False),
    ] = None,
    last: Annotated[int, typer.Option("--last", min=1, help="Show the last N runs.")] = 20,
    verdict: Annotated[
        str | None, typer.Option("--verdict", help="Only runs with this verdict.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    config: ConfigOpt = None,
) -> None:
    """List past runs (time, vmid, phase, verdict, holders stopped, MiB freed, duration),
    or render one report.

    Examples: pveclean reports 129 --last 5 | pveclean reports --verdict residual |
    pveclean reports show latest | pveclean reports show latest 129
    """
    from pveclean.commands.render import render_report, reports_table
    from pveclean.host import reportfiles
    from pveclean.proxmox.pveconf import parse_vmid

    cfg = load(config)
    args = list(target or [])
    if args and args[0] == "show":
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
            data = reportfiles.load(path)
        except (OSError, reportfiles.ReportError) as exc:
            raise PvecleanError(f"cannot read report {path}: {exc}", ExitCode.USAGE) from None
        except Exception as exc:  # a corrupt file: one line, not a traceback
            raise PvecleanError(f"{path} is not a readable report: {exc}", ExitCode.USAGE) from None
        typer.echo(json.dumps(data, indent=2, default=str) if as_json else render_report(data))
        typer.echo(f"report: {path}", err=True)
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
    if as_json:
        typer.echo(json.dumps([{"file": n, **{k: d.get(k) for k in (
            "start", "vmid", "phase", "verdict", "duration_s", "summary")}} for n, d in rows],
            indent=2, default=str))
    elif not rows:
        typer.echo(f"no reports in {cfg.report_dir}" + (f" for CT {vid}" if vid else ""))
    else:
        typer.echo("\n".join(reports_table(rows)))


@config_app.command("check")
def config_check(
    path: Annotated[Path | None, typer.Argument(help="Config file to check.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Validate a config file and print the effective configuration.

    Examples: pveclean config check | pveclean config check /tmp/new.yaml
    """
    cfg = load(path or config)
    typer.echo(dump(cfg), nl=False)
    typer.echo(f"config OK ({cfg.source})", err=True)


def run_app(args: list[str], nvml: NvmlWorker | None = None) -> int:
    """Run the typer app: the exit code, and every failure one line through guarded(), the
    one mapping of errors (click's usage errors, a Ctrl-C and a closed stdout included).
    `nvml`: the run's NVML worker, made by __main__ (`ct` and the hook commands use it); a
    caller without one (a test) gets one made here, forked on its first call."""
    if nvml is None:
        with NvmlWorker() as own:
            return run_app(args, own)

    def go() -> int:
        try:
            rv = app(args=args, prog_name="pveclean", standalone_mode=False, obj=nvml)
        except _Passed as exc:
            raise exc.original from None
        except typer.Exit as exc:
            return int(exc.exit_code)
        except SystemExit:
            # click's answer to a stdout closed while it wrote (its help): exit 1, `residual`
            if type(sys.stdout).__name__ == "PacifyFlushWrapper":
                raise BrokenPipeError from None
            raise
        except Exception as exc:  # click's usage errors (typer may vendor click)
            if type(exc).__name__ == "Abort":
                raise PvecleanError("aborted", ExitCode.INTERRUPTED) from None
            if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
                raise PvecleanError(f"{exc.format_message()} (see 'pveclean --help')",
                                    ExitCode.USAGE) from None
            raise
        # click returns the code of typer.Exit without raising
        return rv if isinstance(rv, int) else ExitCode.OK

    return guarded(go)
