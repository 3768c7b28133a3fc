"""`pveclean doctor [VMID ...]`: why a GPU container will not see its GPU.

Everything is read in a worker bounded by deadline_seconds (a hung /etc/pve, NVML, or a
container's file system that stops answering hangs the worker, not the command): the
containers' configs with their line numbers, the host's NVIDIA nodes and majors, the loaded
module's version, NVML's version and each GPU's persistence mode, and each container's NVIDIA
libraries read from the host side (host/ctfiles.py). The checks are core/doctor.py's.
Exit 0: nothing found; 1: findings; 2: usage or config error; 3: the host could not be read.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pveclean.core import doctor
from pveclean.core.config import Config
from pveclean.core.doctor import CtGrantConf, Diagnosis, Finding, HostFacts, Userspace
from pveclean.core.text import safe
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import cgroupfs, ctfiles, hostfacts, worker
from pveclean.host.nvml import Nvml
from pveclean.host.nvmlfacts import nvml_facts
from pveclean.host.worker import RemoteError, Worker, WorkerError
from pveclean.proxmox import ctrootfs, doctorconf, pveconf


@dataclass(frozen=True)
class Gathered:
    host: HostFacts
    cts: tuple[tuple[CtGrantConf, Userspace | None], ...]
    vms: tuple[int, ...]  # VMIDs asked that are VMs
    warnings: tuple[str, ...]


def _host(cfg: Config, with_nvml: bool) -> HostFacts:
    version, gpus, why = (nvml_facts(Nvml.in_worker(worker.state())) if with_nvml
                          else (None, [], None))
    refs = doctorconf.vm_refs(str(Path(cfg.pve_config_dir).parent)) if with_nvml else []
    return HostFacts(hostfacts.module_version(cfg.nvidia_version_file), cfg.nvidia_version_file,
                     version, tuple(hostfacts.host_nodes(cfg.devices)),
                     hostfacts.char_majors(), tuple(gpus), tuple(refs), why)


def _asked(cfg: Config, vmids: list[int], warnings: list[str]
           ) -> tuple[list[CtGrantConf], list[int]]:
    """The containers to look at, and the VMs asked."""
    if not vmids:
        return [c for _v, c in doctorconf.gpu_containers(cfg.pve_config_dir)], []
    cts: list[CtGrantConf] = []
    vms: list[int] = []
    qemu = Path(cfg.pve_config_dir).parent / "qemu-server"
    for vmid in vmids:
        why, conf = doctorconf.read_conf(cfg.pve_config_dir, vmid)
        if conf is not None:
            cts.append(conf)
        elif (qemu / f"{vmid}.conf").is_file():
            vms.append(vmid)
        else:
            warnings.append(why)
    if vms:  # a VM's conflicts are the GPU containers'
        known = {c.vmid for c in cts}
        cts += [c for v, c in doctorconf.gpu_containers(cfg.pve_config_dir) if v not in known]
    return cts, vms


def w_gather(cfg: Config, vmids: list[int], with_nvml: bool = True,
             seconds: float = 2.0) -> Gathered:
    """Everything doctor reads, in a worker."""
    warnings: list[str] = []
    cts, vms = _asked(cfg, vmids, warnings)
    host = _host(cfg, with_nvml)
    root = cfg.cgroup_root or cgroupfs.cgroup2_root()
    out: list[tuple[CtGrantConf, Userspace | None]] = []
    for conf in cts:
        user = None
        if conf.grants:
            running = cgroupfs.monitor_running(root, conf.vmid)
            roots = [os.path.join(cfg.lxc_path, str(conf.vmid), "rootfs")]
            subvol = ctrootfs.read_rootfs_dir(str(Path(cfg.pve_config_dir).parent), conf.rootfs)
            user = ctfiles.userspace(root, roots + ([subvol] if subvol else []), conf.vmid,
                                     running, seconds)
        out.append((conf, user))
    return Gathered(host, tuple(out), tuple(vms), tuple(warnings))


def diagnose(g: Gathered) -> Diagnosis:
    findings: list[Finding] = doctor.host_findings(g.host)
    warnings = list(g.warnings)
    if g.host.nvml_error:
        warnings.append(f"NVML: {g.host.nvml_error} (no persistence or VM check)")
    for conf, user in g.cts:
        got = doctor.ct_findings(conf, g.host, user)
        if g.vms and conf.vmid not in g.vms:
            got = [f for f in got if f.vm in g.vms]
        findings += got
        if user is not None and user.why_not:
            warnings.append(f"CT {conf.vmid}: its libraries were not looked at: {user.why_not}")
    looked = [str(c.vmid) for c, _u in g.cts] + [str(v) for v in g.vms]
    return Diagnosis(tuple(findings), tuple(looked), tuple(warnings))


def gather(cfg: Config, vmids: list[int], shared: Worker | None = None) -> Gathered:
    """In a worker of its own, or in `shared` (the metrics look's, with its NVML session:
    one library load and init a run, not two), which the caller closes."""
    limit = cfg.deadline_seconds
    with contextlib.ExitStack() as own:
        wk = shared or own.enter_context(Worker(**Nvml.settings(cfg.nvml_library, limit)))
        try:
            got: Gathered = wk.call(w_gather, cfg, vmids, True,
                                    min(2.0, limit / 4), timeout=limit, what="doctor")
        except (WorkerError, RemoteError) as exc:
            raise PvecleanError(f"doctor: {exc}", ExitCode.ACCESS) from None
    return got


def render(d: Diagnosis) -> str:
    lines = []
    for f in d.findings:
        who = "host" if f.guest == doctor.HOST else f"CT {f.guest}"
        lines += [f"{who}  {f.check}: {safe(f.what, None)}",
                  f"    evidence: {safe(f.evidence, None)}", f"    fix: {safe(f.fix, None)}"]
    lines += [f"warning: {safe(w, None)}" for w in d.warnings]
    n = len(d.findings)
    looked = ", ".join(d.looked) or "no GPU container"
    lines.append(f"{n} finding(s); looked at {looked}" if n else
                 f"nothing found; looked at {looked}")
    return "\n".join(lines)


def run(cfg: Config, args: list[str], as_json: bool, echo: Callable[[str], None]) -> int:
    vmids = [pveconf.parse_vmid(a) for a in args]
    g = gather(cfg, vmids)
    if vmids and not g.cts and not g.vms:
        raise PvecleanError(g.warnings[0] if g.warnings else "nothing to look at",
                            ExitCode.ACCESS)
    d = diagnose(g)
    echo(json.dumps(d.as_dict(), indent=2) if as_json else render(d))
    return ExitCode.RESIDUAL if d.findings else ExitCode.OK


# ---- pre-start --------------------------------------------------------------------------------
def prestart(vmid: int, cfg: Config, say: Callable[[str], None]) -> None:
    """One task-log line per mismatch container `vmid` is about to start with (a library
    version, a stale major, a missing node); never raises, asks NVML nothing."""
    try:
        with Worker() as wk:
            g: Gathered = wk.call(w_gather, cfg, [vmid], False, 1.0,
                                  timeout=min(3.0, cfg.deadline_seconds), what="doctor")
    except Exception as exc:  # never in the way of a start
        say(f"pveclean: WARNING: CT {vmid} pre-start: doctor's checks skipped ({exc})")
        return
    for line in doctor.prestart_warnings(diagnose(g).findings):
        say(f"pveclean: WARNING: CT {vmid} pre-start: {safe(line, 400)}")


def counts(cfg: Config, vmids: list[int]) -> dict[int, dict[str, int]] | str:
    """Findings per container and check, without NVML (`pveclean status`), or why not."""
    try:
        with Worker() as wk:
            g: Gathered = wk.call(w_gather, cfg, vmids, False, 1.0,
                                  timeout=cfg.deadline_seconds, what="doctor")
    except (WorkerError, RemoteError, OSError) as exc:
        return str(exc)
    out: dict[int, dict[str, int]] = {}
    for (guest, check), n in diagnose(g).counts().items():
        if guest != doctor.HOST:
            out.setdefault(int(guest), {})[check] = n
    return out


# ---- metrics ------------------------------------------------------------------------------------
def write_metrics(cfg: Config, textfile_dir: str, shared: Worker | None = None) -> str | None:
    """<textfile_dir>/pveclean_doctor.prom (`pveclean metrics`): the findings per guest and
    check, or `pveclean_doctor_up 0` when the look did not finish; why it was not written,
    or None. `shared`: the worker to look in (gather)."""
    from pveclean.core import metrics, metrics_doctor
    from pveclean.host import notify

    node = os.uname().nodename
    try:
        fams = metrics_doctor.families(diagnose(gather(cfg, [], shared)), node)
    except PvecleanError:
        fams = metrics_doctor.failed(node)
    path = Path(textfile_dir) / metrics_doctor.FILE_NAME
    try:
        notify.update_textfile(str(path), lambda _old: metrics.render(fams))
    except OSError as exc:
        return f"{path} not written: {exc.strerror or exc}"
    return None
