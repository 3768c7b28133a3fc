"""The `pveclean` command line (typer). The hook path does not come through here."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Annotated

import click
import typer

from pveclean import __version__
from pveclean.commands.conventions import (
    EXIT_CODES_HELP,
    HELP_OPTIONS,
    Command,
    Group,
    Passed,
    complete_from,
    complete_vmids,
    finite,
    need_root,
    wants_json,
)
from pveclean.commands.options import (
    ConfigOpt,
    DryRunOpt,
    GraceOpt,
    JsonOpt,
    PhaseArg,
    StopUnitsOpt,
    VmidArg,
    VmidsArg,
    VmOpt,
)
from pveclean.core.config import dump
from pveclean.core.verdicts import Verdict
from pveclean.errors import ExitCode, PvecleanError, guarded
from pveclean.host.configfile import load
from pveclean.host.prelude import NvmlWorker

app = typer.Typer(
    name="pveclean",
    cls=Group,
    help="Find, stop and verify the GPU holders of one Proxmox LXC container.\n\n"
    + EXIT_CODES_HELP + "\n\nExamples: pveclean ct 129 --dry-run | pveclean gpus | "
    "pveclean install --all --dry-run | pveclean COMMAND -h",
    invoke_without_command=True,
    add_completion=True,  # its completion classes; its two options are dropped (Group)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=HELP_OPTIONS,
)
config_app = typer.Typer(cls=Group, help="Show and check the configuration.\n\n"
                         "Example: pveclean config check", invoke_without_command=True,
                         context_settings=HELP_OPTIONS)
app.add_typer(config_app, name="config")
command = partial(app.command, cls=Command)

def _version(value: bool) -> None:
    if value:
        typer.echo(f"pveclean {__version__}")
        raise typer.Exit(0)


def _help_alone(ctx: typer.Context) -> None:
    """A group given no command: its help on stdout, exit 0 (click's no_args_is_help says it
    on stderr as a usage error)."""
    if ctx.invoked_subcommand is None and not ctx.resilient_parsing:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show version.")
    ] = False,
) -> None:
    """pveclean."""
    _help_alone(ctx)


@config_app.callback()
def config_main(ctx: typer.Context) -> None:
    """Show and check the configuration."""
    _help_alone(ctx)


@command()
def ct(
    ctx: typer.Context,
    vmid: VmidArg,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what a cleanup would stop and free; signal nothing, write no "
        "report, no syslog line and no metrics.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    grace: GraceOpt = None,
    stop_units: StopUnitsOpt = False,
    report_file: Annotated[Path | None, typer.Option(
        "--report-file", metavar="FILE", help="Also write the report to FILE, a new file "
        "(0600): how a dry run's report is kept.")] = None,
    config: ConfigOpt = None,
) -> None:
    """Stop every GPU holder of container VMID and verify its GPU memory is free.

    A VMID that is a VM exits 2, a container on another node exits 3; the message says so
    and what to run instead.

    Examples: pveclean ct 129 --dry-run | pveclean ct 129 --stop-units |
    pveclean ct 129 --dry-run --report-file /root/ct129-before.yaml
    """
    from pveclean.commands.ct import CtArgs, run

    need_root()
    raise typer.Exit(run(CtArgs(vmid, dry_run, as_json, grace, stop_units,
                                str(config) if config else None,
                                str(report_file) if report_file else None), ctx.obj))


@command()
def hook(
    ctx: typer.Context,
    vmid: VmidArg,
    phase: PhaseArg,
) -> None:
    """Run a hook phase, as Proxmox calls the hookscript (normally via pveclean-hook).

    Every failure is one line in the task log and exit 0, but a pre-start that refuses the
    start (pre_start_policy: refuse): exit 75.

    Example: pveclean hook 129 pre-stop
    """
    from pveclean.commands.hook import main as hook_main

    need_root()
    raise typer.Exit(hook_main([vmid, phase], ctx.obj))


@command()
def unit(
    ctx: typer.Context,
    vmid: VmidArg,
    phase: Annotated[str, typer.Argument(help="start-pre or stop-post.",
                                         autocompletion=complete_from(("start-pre",
                                                                        "stop-post")))],
    config: ConfigOpt = None,
) -> None:
    """Run from the systemd drop-in that 'install --systemd' writes (ExecStartPre=,
    ExecStopPost=). Says everything in the journal. Exit 75 only when pre_start_policy
    refuses the start; a bad argument exits 2 by hand, 0 under systemd (a start goes on).

    Example: pveclean unit 129 start-pre
    """
    from pveclean.commands.unit import main as unit_main

    need_root()
    raise typer.Exit(unit_main([vmid, phase], ctx.obj, str(config) if config else None))


@command()
def vmhook(
    ctx: typer.Context,
    vmid: VmidArg,
    phase: PhaseArg,
) -> None:
    """Run a phase of a VM's hookscript (pveclean-vm-hook, see 'install --vm').

    pre-start names every holder of the VM's passed-through GPUs and refuses the start
    (exit 75) or stops the containers' holders, by vm_gpu_policy; post-stop gives a GPU that
    vm_gpu_rebind handed to vfio-pci back. Every other outcome is exit 0.

    Example: pveclean vmhook 200 pre-start
    """
    from pveclean.commands.vmhook import main as vmhook_main

    need_root()
    raise typer.Exit(vmhook_main([vmid, phase], ctx.obj))


@command()
def install(
    vmids: VmidsArg = None,
    all_: Annotated[bool, typer.Option("--all", help="Every container with GPUs.")] = False,
    all_gpu: Annotated[bool, typer.Option("--all-gpu", hidden=True)] = False,  # the old name
    vm: VmOpt = False,
    all_gpu_vms: Annotated[bool, typer.Option(
        "--all-gpu-vms", help="Every VM of this node whose hostpci lines pass an NVIDIA GPU.")
    ] = False,
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
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
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

    With --vm or --all-gpu-vms the hookscript (as pveclean-vm-hook) goes on VMs: at a VM's
    start it finds every holder of the VM's GPUs and refuses the start or stops the
    containers' holders, by vm_gpu_policy in the config.

    Examples: pveclean install --all --dry-run | pveclean install 129 --systemd |
    pveclean install --vm 200
    """
    from pveclean.commands.install import apply_install, plan_install
    from pveclean.commands.installplan import InstallRequest, carry_out
    from pveclean.proxmox.pveapi import connect
    from pveclean.proxmox.pveconf import parse_vmid

    ids = [parse_vmid(v) for v in vmids or []]
    every = all_ or all_gpu or all_gpu_vms
    if bool(ids) == every or (all_gpu_vms and (all_ or all_gpu)):
        raise PvecleanError("give guest IDs, --all or --all-gpu-vms (one of them)",
                            ExitCode.USAGE)
    need_root()
    cfg = load(config)
    api = connect(cfg)
    req = InstallRequest(tuple(ids), every, "qemu" if vm or all_gpu_vms else "lxc", storage,
                         chain, enable_snippets, systemd)
    plan = plan_install(api, cfg, req)
    raise typer.Exit(carry_out(plan, dry_run, lambda: apply_install(api, cfg, plan),
                               _echo, as_json))


def _echo(line: str, err: bool) -> None:
    typer.echo(line, err=err)


@command()
def uninstall(
    vmids: VmidsArg = None,
    all_: Annotated[bool, typer.Option("--all", help="Every container and VM with pveclean's "
                                       "hook.")] = False,
    vm: VmOpt = False,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Remove the hookscript, restoring what was there before (a script kept by --chain).

    With --all the snippet file goes too once no guest uses it.
    Exit codes as for install.

    Examples: pveclean uninstall 129 | pveclean uninstall --vm 200 |
    pveclean uninstall --all --dry-run
    """
    from pveclean.commands.installplan import carry_out
    from pveclean.commands.uninstall import apply_uninstall, plan_uninstall
    from pveclean.proxmox.pveapi import connect
    from pveclean.proxmox.pveconf import parse_vmid

    ids = [parse_vmid(v) for v in vmids or []]
    if bool(ids) == all_:
        raise PvecleanError("give guest IDs or --all (one of them)", ExitCode.USAGE)
    need_root()
    cfg = load(config)
    api = connect(cfg)
    plan = plan_uninstall(api, cfg, ids, all_, "qemu" if vm else "lxc")
    raise typer.Exit(carry_out(plan, dry_run, lambda: apply_uninstall(api, cfg, plan),
                               _echo, as_json))


@command()
def status(as_json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Containers, their GPUs, hookscripts and (on this node) current holders and last report.
    Reads only: no report, no syslog line, no metrics.

    Exit codes: 0 shown (warnings included); 2 config error; 3 the API failed.

    Examples: pveclean status | pveclean status --json
    """
    from pveclean.commands.gpuview import render_status as render
    from pveclean.commands.status import collect
    from pveclean.proxmox.pveapi import connect

    need_root()
    cfg = load(config)
    view = collect(connect(cfg), cfg)
    if as_json:
        typer.echo(json.dumps(view.as_dict(), indent=2, default=str))
    else:
        typer.echo(render(view))


@command()
def gpus(
    as_json: JsonOpt = False,
    watch: Annotated[
        float | None, typer.Option("--watch", min=0.5, max=3600, metavar="SECONDS",
                                   callback=finite,
                                   help="Refresh every SECONDS until Ctrl-C (in place on a "
                                   "terminal).")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, max=1_000_000,
                                 help="With --watch: stop after N refreshes.")
    ] = None,
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

    if count is not None and watch is None:
        raise PvecleanError("--count needs --watch (see 'pveclean gpus -h')", ExitCode.USAGE)
    need_root()
    raise typer.Exit(show(load(config), as_json, watch, count or 0, sysfs_pci))


@command()
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

    Example: pveclean metrics --textfile-dir /var/lib/prometheus/node-exporter
    """
    from pveclean.commands.metrics import write

    need_root()
    raise typer.Exit(write(load(config), textfile_dir, job_dir=dcgm_job_dir))


from pveclean.commands.resetcli import register as _reset  # noqa: E402, I001
_reset(command)
VERDICTS = [str(v) for v in Verdict]


@command()
def reports(
    target: Annotated[
        list[str] | None,
        typer.Argument(help="VMID to list, or: show FILE|latest [VMID]", show_default=False,
                       autocompletion=complete_vmids),
    ] = None,
    last: Annotated[int, typer.Option("--last", min=1, max=1_000_000,
                                      help="Show the last N runs.")] = 20,
    verdict: Annotated[
        str | None, typer.Option("--verdict", click_type=click.Choice(VERDICTS),
                                 help="Only runs with this verdict.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
    config: ConfigOpt = None,
) -> None:
    """List past runs (time, vmid, phase, verdict, holders stopped, MiB freed, duration),
    or render one report.

    Examples: pveclean reports 129 --last 5 | pveclean reports --verdict residual |
    pveclean reports show latest | pveclean reports show latest 129
    """
    from pveclean.commands.reports import list_runs

    need_root()
    list_runs(load(config), list(target or []), last, verdict, as_json, _echo)


@config_app.command("check", cls=Command)
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
        except Passed as exc:
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
                where = getattr(getattr(exc, "ctx", None), "command_path", "pveclean")
                raise PvecleanError(f"{exc.format_message()} (see '{where} -h')",
                                    ExitCode.USAGE) from None
            raise
        # click returns the code of typer.Exit without raising
        return rv if isinstance(rv, int) else ExitCode.OK

    return guarded(go, wants_json(args))
