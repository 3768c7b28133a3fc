"""`pveclean reset GPU`: one GPU reset through the driver's tool, only when that is safe.

The plan (core/reset.py) names every holder of the GPU and refuses unless each is a
container's holder pveclean may stop or a host service it knows how to stop and restart;
`--dry-run` shows it. Then the containers' holders are stopped as `pveclean ct` stops them
(a report each), the GPU looked at again (anything new refuses), NVML's own session closed
(an open session holds the GPU), and host/gpureset.py turns persistence off, stops the
services, runs `<reset_command> -r -i <PCI id>` within reset_timeout_seconds, and gives
both back on every path. After it: the GPU must answer NVML, hold no memory no process
accounts for, and have logged no new Xid. The report (kind: reset) says each step.

Exit codes: 0 reset and verified (or a dry run that would reset); 1 the reset failed, timed
out or was not verified; 2 usage or config error; 3 the host could not be read; 75 refused
(each reason said); 130 interrupted (persistence and services given back first)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pveclean.core import reset as plan_of
from pveclean.core.config import Config
from pveclean.core.gpumap import GpuMap
from pveclean.core.pci import PciAddress
from pveclean.core.text import safe
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import gpureset
from pveclean.host.prelude import NvmlWorker

T = TypeVar("T")
REFUSED = ExitCode.REFUSE
NOT_DONE = 1
SETTLE_POLL = 0.2  # s between looks while stopped holders' memory is released


def say(text: str, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(text + "\n")
    (sys.stderr if err else sys.stdout).flush()


def _look(cfg: Config) -> GpuMap:
    from pveclean.commands.gpus import look_once

    return look_once(cfg, Path(cfg.pci_sysfs) / "devices", cfg.deadline_seconds,
                     "reading the host's GPUs")


def _nvml(cfg: Config, fn: Callable[..., T], *args: object, what: str) -> T | Exception:
    """One NVML call in a worker of its own, gone when it returns: a session left open
    would hold the GPU's device node through the reset."""
    from pveclean.host.nvml import Nvml
    from pveclean.host.worker import RemoteError, Worker, WorkerError

    with Worker(**Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)) as wk:
        try:
            got: T = wk.call(fn, *args, timeout=cfg.deadline_seconds, what=what)
            return got
        except (WorkerError, RemoteError) as exc:
            return exc


def local_cts(cfg: Config) -> frozenset[int]:
    """The containers whose config is on this node (/etc/pve/lxc is this node's)."""
    try:
        names = os.listdir(cfg.pve_config_dir)
    except OSError:
        return frozenset()
    return frozenset(int(n[:-5]) for n in names if n.endswith(".conf") and n[:-5].isdigit())


def facts(cfg: Config, gmap: GpuMap, asked: str) -> plan_of.HostFacts:
    from pveclean.host.mig import w_mig_state
    from pveclean.proxmox.vmtake import reservations

    g = plan_of.find(gmap, asked)
    mig: bool | None = False
    left = 0
    if g is not None:
        got = _nvml(cfg, w_mig_state, g.index, cfg.deadline_seconds, what="MIG mode")
        mig, left = (got[0], got[1]) if isinstance(got, tuple) else (None, 0)
    held = reservations(Path(cfg.qemu_run_dir))  # qemu-server's live ones (PCI.pm)
    return plan_of.HostFacts({a: r.vmid for a, r in held.items()},
                             frozenset(r.vmid for r in held.values() if not r.starting),
                             local_cts(cfg), mig, left)


def show_plan(p: plan_of.Plan, dry_run: bool) -> None:
    t = p.target
    name = "?" if t is None else f"GPU {t.index} ({t.address}, {t.uuid or 'no UUID'})"
    for line in p.notes:
        say(f"pveclean: reset {name}: {line}")
    if p.decision is plan_of.Decision.REFUSE:
        for line in p.blockers:
            say(f"pveclean: reset {name}: refused: {line}", err=True)
        return
    verb = "would" if dry_run else "will"
    for ct, (idx, _m) in sorted(p.stop.items()):
        say(f"pveclean: reset {name}: {verb} stop CT {ct}'s holders of GPU "
            f"{', '.join(map(str, sorted(idx)))} (as `pveclean ct {ct}`)")
    for unit in p.services:
        say(f"pveclean: reset {name}: {verb} stop {unit} and start it again after")
    say(f"pveclean: reset {name}: {verb} turn persistence mode off for it (and back on "
        "after) and reset it through the driver's tool")


def _stop_cts(cfg: Config, nvml: NvmlWorker, p: plan_of.Plan) -> list[dict[str, object]]:
    from pveclean.cleanup import RunOptions, clean
    from pveclean.host.clock import start_deadline

    out: list[dict[str, object]] = []
    for ct, only in sorted(p.stop.items()):
        deadline = start_deadline(cfg.deadline_seconds)
        res = clean(ct, cfg, nvml.warm(cfg, ct), RunOptions(phase="gpu-reset", only=only),
                    deadline)
        say(f"pveclean: reset: CT {ct}: {res.report.verdict}; {res.path or 'no report written'}")
        out.append({"vmid": ct, "verdict": str(res.report.verdict),
                    "report": None if res.path is None else str(res.path)})
    return out


def host_ops(cfg: Config) -> gpureset.Ops:
    from pveclean.host.persistence import w_persistence_mode, w_set_persistence_mode

    t = cfg.deadline_seconds

    def mode(index: int) -> bool | None:
        got = _nvml(cfg, w_persistence_mode, index, t, what="persistence mode")
        return got[0] if isinstance(got, tuple) else None

    def set_mode(index: int, on: bool) -> str | None:
        got = _nvml(cfg, w_set_persistence_mode, index, on, t, what="persistence mode change")
        return None if got is None else str(got)

    return gpureset.Ops(
        mode, set_mode,
        lambda verb, unit: gpureset.systemctl(cfg.systemctl_command, verb, unit),
        lambda address, timeout: gpureset.run_tool(
            [cfg.reset_command, "-r", "-i", address], timeout))


def verify(cfg: Config, target: plan_of.Target, new_xids: list[str]) -> list[str]:
    """After the reset: what is wrong with the GPU (nothing: verified)."""
    try:
        g = plan_of.find(_look(cfg), target.uuid or str(target.address))
    except PvecleanError as exc:
        return [f"the host could not be read after the reset: {exc}"]
    if g is None:
        return [f"GPU {target.address} is not listed by NVML after the reset"]
    wrong = [] if g.ok else [f"NVML says GPU {g.index} is {g.status}"]
    if g.leak_mib:
        wrong.append(f"{g.leak_mib} MiB are still allocated with no process")
    wrong += [f"a new Xid after the reset: {x}" for x in new_xids]
    return wrong


def _write(cfg: Config, doc: dict[str, object], index: int | None) -> str | None:
    from pveclean.host import reportfiles
    from pveclean.host.reportfiles import utc_stamp

    name = f"reset-gpu{'' if index is None else index}-{utc_stamp(time.time())}.yaml"
    try:
        return str(reportfiles.write(doc, cfg.report_dir, name))
    except (OSError, reportfiles.ReportError) as exc:
        say(f"pveclean: reset: WARNING: report not written: {exc}", err=True)
        return None


def _xids_after(cfg: Config, target: plan_of.Target) -> list[str]:
    from pveclean.commands.xids import describe, xid_pass

    _log, new, _why = xid_pass(cfg)
    return [describe(s) for s in new if s.xid.pci == target.driver_pci]


def run(cfg: Config, asked: str, dry_run: bool, as_json: bool, nvml: NvmlWorker) -> int:
    from pveclean.commands import xids

    started = time.time()
    gmap = _look(cfg)
    xids.xid_pass(cfg, gmap)  # Xids so far are not the reset's
    p = plan_of.plan(gmap, asked, facts(cfg, gmap, asked), [v.pci_bus_id for v in gmap.vfio])
    doc: dict[str, object] = {"pveclean_report": 1, "kind": "reset", "asked": asked,
                              "node": os.uname().nodename, "dry_run": dry_run,
                              "plan": p.as_dict()}
    if as_json and dry_run:
        say(json.dumps(doc, indent=2))
    else:
        show_plan(p, dry_run)
    if dry_run:
        return REFUSED if p.decision is plan_of.Decision.REFUSE else ExitCode.OK
    if p.decision is plan_of.Decision.REFUSE or p.target is None:
        return _finish(cfg, doc, "refused", REFUSED, started, p.target, as_json)
    doc["containers"] = _stop_cts(cfg, nvml, p)
    again = _settled(cfg, asked, gmap)
    if again.decision is plan_of.Decision.REFUSE or again.stop:
        left = again.blockers + [f"CT {ct}'s holders are still there" for ct in again.stop]
        doc["left"] = left
        for line in left:
            say(f"pveclean: reset: not reset: {line}", err=True)
        return _finish(cfg, doc, "aborted", NOT_DONE, started, p.target, as_json)
    nvml.close()  # the run's NVML session would hold the GPU
    return _reset(cfg, doc, again, started, as_json)


def _settled(cfg: Config, asked: str, gmap: GpuMap) -> plan_of.Plan:
    """The plan again once the stopped holders' memory is released (NVML may list a
    process a moment after it exited): looked at until no container's holder is left, or
    half the deadline."""
    end = time.monotonic() + cfg.deadline_seconds / 2
    while True:
        again = plan_of.plan(_look(cfg), asked, facts(cfg, gmap, asked),
                             [v.pci_bus_id for v in gmap.vfio])
        if not again.stop or time.monotonic() >= end:
            return again
        time.sleep(SETTLE_POLL)


def _reset(cfg: Config, doc: dict[str, object], p: plan_of.Plan, started: float,
           as_json: bool) -> int:
    t = p.target
    assert t is not None
    say(f"pveclean: reset GPU {t.index}: resetting (deadline {cfg.reset_timeout_seconds:g} s)")
    res = gpureset.guarded_reset(host_ops(cfg), t.index, t.address.nvml, p.services,
                                 cfg.reset_timeout_seconds)
    doc["steps"] = [s.as_dict() for s in res.steps]
    doc["restored"] = res.restored
    for s in res.steps:
        say(f"pveclean: reset GPU {t.index}: {s.what}: {'ok' if s.ok else 'FAILED'}"
            f"{': ' + safe(s.detail, 200) if s.detail and not s.ok else ''}")
    if res.outcome is not gpureset.Outcome.DONE:
        code = ExitCode.INTERRUPTED if res.outcome is gpureset.Outcome.INTERRUPTED else NOT_DONE
        return _finish(cfg, doc, str(res.outcome), code, started, t, as_json)
    new = _xids_after(cfg, t)
    wrong = verify(cfg, t, new)
    doc["verify"] = wrong
    if wrong:
        for line in wrong:
            say(f"pveclean: reset GPU {t.index}: not verified: {line}", err=True)
        return _finish(cfg, doc, "not-verified", NOT_DONE, started, t, as_json)
    from pveclean.host import kmsg

    kmsg.reset_done(cfg.state_dir, t.driver_pci)
    return _finish(cfg, doc, "reset", ExitCode.OK, started, t, as_json)


def _finish(cfg: Config, doc: dict[str, object], outcome: str, code: int, started: float,
            target: plan_of.Target | None, as_json: bool) -> int:
    from pveclean.core.report import iso

    doc.update({"outcome": outcome, "start": iso(started),
                "duration_s": round(time.time() - started, 3)})
    path = _write(cfg, doc, None if target is None else target.index)
    if as_json:
        say(json.dumps({**doc, "report": path}, indent=2, default=str))
    else:
        say(f"pveclean: reset: {outcome}; report {path or 'not written'}")
    return code


def parse_gpu(text: str) -> str:
    """GPU as given: an index, a UUID (GPU-...) or a PCI id; else a usage error."""
    t = text.strip()
    if t.isdigit() or t.upper().startswith(("GPU-", "MIG-")) or PciAddress.parse(t):
        if t.upper().startswith("MIG-"):
            raise PvecleanError(f"{t} is a MIG device: reset its GPU", ExitCode.USAGE)
        return t
    raise PvecleanError(f"not a GPU index, UUID or PCI id: {safe(t, 60)}", ExitCode.USAGE)
