"""The Xid reader in every hook phase (`pveclean hook`), and a container's pre-start onto a
GPU whose last Xid asks for a reset or a reboot: a warning, or a refusal under
`pre_start_policy: refuse`. Never raises: the hook goes on whatever the kernel log does."""

from __future__ import annotations

from collections.abc import Callable

from pveclean.core.config import Config
from pveclean.core.text import safe
from pveclean.core.xidlog import Seen, XidLog
from pveclean.host import procfs


def minor_to_pci() -> dict[int, str]:
    """N of /dev/nvidiaN -> the driver's `0000:01:00`, from the driver's own information
    file of each GPU (procfs.driver_gpus_info)."""
    out: dict[int, str] = {}
    for name, fields in procfs.driver_gpus_info().items():
        minor = fields.get("Device Minor", "")
        if minor.isdigit():
            out[int(minor)] = name.lower().rsplit(".", 1)[0]
    return out


def _container_minors(cfg: Config, vmid: int) -> frozenset[int] | None:
    """The GPUs (minors) the container's config passes; None: every GPU, or not known."""
    from pveclean.host.worker import RemoteError, Worker, WorkerError
    from pveclean.proxmox.pveconf import CtConfig, w_read_config

    with Worker() as wk:
        try:
            got = wk.call(w_read_config, cfg.pve_config_dir, vmid,
                          timeout=min(cfg.deadline_seconds, 5.0), what="the container's config")
        except (WorkerError, RemoteError):
            return None
    return got.gpu().minors if isinstance(got, CtConfig) else None


def pending_for(log: XidLog, minors: frozenset[int] | None, pcis: dict[int, str]
                ) -> list[Seen]:
    """The pending reset-needing Xids of the GPUs a container gets (all GPUs when its
    minors, or one minor's PCI id, are not known)."""
    if minors is None or any(m not in pcis for m in minors):
        return [log.pending[p] for p in sorted(log.pending)]
    wanted = {pcis[m] for m in minors}
    return [log.pending[p] for p in sorted(log.pending) if p in wanted]


def before_phase(vmid: int, phase: str, cfg: Config, say: Callable[[str], None]) -> bool:
    """The Xid pass of a hook phase; in pre-start, True when the start is to be refused."""
    from pveclean.commands.xids import advice, describe, xid_pass

    try:
        log, _new, _why = xid_pass(cfg)
        if phase != "pre-start" or not log.pending:
            return False
        seen = pending_for(log, _container_minors(cfg, vmid), minor_to_pci())
    except Exception as exc:  # the Xid check never breaks a hook
        say(f"pveclean: CT {vmid} {phase}: Xid check skipped: {type(exc).__name__}: "
            f"{safe(exc, 200)}")
        return False
    refuse = bool(seen) and cfg.pre_start_policy == "refuse"
    for s in seen:
        head = "refusing to start" if refuse else "WARNING"
        say(f"pveclean: CT {vmid} pre-start: {head}: GPU {s.xid.pci}'s last Xid asks for a "
            f"{s.action}: {describe(s)}; {advice(s.action, s.xid.pci)}"
            + ("" if refuse else "; starting anyway (pre_start_policy: warn)"))
    return refuse
