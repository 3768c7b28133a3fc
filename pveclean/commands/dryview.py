"""What `pveclean ct VMID --dry-run` shows: what an admin decides on, in the terminal's width
(80 columns unless it is wider). Per holder its command line (shell-quoted, escaped, cut),
its GPUs and MiB; what would be sent; the memory it would free; and the GPU users it will
not touch, and why."""

from __future__ import annotations

import shlex

from pveclean.commands.render import unit_lines
from pveclean.commands.table import table
from pveclean.core.text import fit, safe
from pveclean.core.units import unit_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.records import Holder, OtherUser
    from pveclean.core.report import Report

COLUMNS = 80  # the width when the terminal's is unknown or narrower


def command_text(h: Holder) -> str:
    """The holder's command line, each argument shell-quoted (so that spaces and quotes in
    one show where it ends); its name when the command line is empty (a kernel thread, a
    zombie)."""
    if h.argv:
        return shlex.join(h.argv)
    return f"[{h.name or '?'}]"


def gpu_text(mib: dict[int, int | None] | None) -> str:
    """`0:18000 1:512`: the GPU index and the MiB the process holds there; `?` unknown,
    `-` no memory (it holds GPU nodes only)."""
    parts = [f"{g}:{'?' if m is None else m}" for g, m in sorted((mib or {}).items())]
    return " ".join(parts) or "-"


def owner_of(cgroup: str | None) -> str:
    """Why a GPU user outside the container is left alone: whose it is (core/owners.py reads
    the path; a container's monitor and a plain LXC container's count as a container)."""
    from pveclean.core.owners import Owner, OwnerKind, place  # only when there are others

    where = place(cgroup or "")
    if where.number is not None:
        return f"another container ({Owner(OwnerKind.CT, where.number).label})"
    unit = unit_of(cgroup)
    return f"a host process ({safe(unit, 40)})" if unit else "a host process"


def _table(rows: list[tuple[str, ...]], commands: list[str], columns: int) -> list[str]:
    """The one table (commands/table.py), each row followed by its command line on a line
    of its own, cut to `columns` (a command line is what tells four `python3` ranks apart)."""
    out = []
    for n, line in enumerate(table(rows, "  ")):
        out.append(line)
        if n:
            out.append("      " + safe(commands[n - 1], columns - 6))
    return out


def render_dry_run(rep: Report, columns: int = COLUMNS, grace: float | None = None) -> str:
    """The dry run's view. `columns`: the terminal's width (never under 80); `grace`: the
    grace this run would give (the config's, or --grace)."""
    columns = max(columns, COLUMNS)
    stop = [h for h in rep.holders if not h.protected]
    spared = [h for h in rep.holders if h.protected]
    g = grace if grace is not None else (rep.settings.grace_seconds if rep.settings else None)
    head = f"CT {safe(rep.vmid, 20)}: dry run, nothing signalled, no report written"
    lines = [head]
    if not stop:
        lines.append("would stop nothing: no GPU holder to stop")
    else:
        after = f" after {g:g} s" if isinstance(g, int | float) else ""
        lines.append(f"would stop {len(stop)} GPU holder(s): SIGTERM, then SIGKILL to any "
                     f"left{after}")
        rows: list[tuple[str, ...]] = [("HOST PID", "CT PID", "NAME", "GPU:MiB", "UNIT")]
        for h in stop:
            rows.append((safe(h.host_pid, 12), safe(h.ct_pid or "-", 12),
                         safe(h.name, 16), safe(gpu_text(h.gpu_memory_mib), 24),
                         safe(h.unit or "-", 24 if columns <= COLUMNS else 48)))
        lines += _table(rows, [command_text(h) for h in stop], columns)
        lines.append(free_line(stop))
    bystanders: list[tuple[OtherUser | Holder, str]] = [
        (o, owner_of(o.cgroup)) for o in rep.other_gpu_users]
    bystanders += [(h, f"protected: {safe(h.protected, 60)}") for h in spared]
    if bystanders:
        lines.append(f"will not touch {len(bystanders)} other GPU user(s):")
        for p, why in bystanders:
            lines.append(fit(f"  PID {p.host_pid} {safe(p.name, 16)}, "
                             f"GPU:MiB {gpu_text(p.gpu_memory_mib)}: {why}", columns))
    for gpu in rep.gpus:
        used = gpu.used_before_mib
        lines.append(fit(f"GPU {gpu.index} {safe(gpu.name, 40)}: "
                         f"{'?' if used is None else used} of {safe(gpu.total_mib or '?')} "
                         "MiB used now", columns))
    # each piece made safe once, then cut: escaped twice, a backslash pasted is wrong
    lines += [fit(line, columns) for line in unit_lines(rep)]
    lines += [safe(f"warning: {w}", columns) for w in rep.warnings]
    lines += [safe(f"error: {e}", columns) for e in rep.errors]
    return "\n".join(lines)


def free_line(stop: list[Holder]) -> str:
    """`would free 26348 MiB on GPUs 0, 1, 2, 3` (what NVML says these processes hold)."""
    per: dict[int, int] = {}
    unknown = False
    for h in stop:
        for g, m in h.gpu_memory_mib.items():
            per[int(g)] = per.get(int(g), 0) + (m or 0)
            unknown |= m is None
    if not per:
        return "would free no GPU memory NVML accounts for (they hold GPU nodes only)"
    gpus = ", ".join(str(g) for g in sorted(per))
    more = " (and memory NVML gives no figure for)" if unknown else ""
    return f"would free {sum(per.values())} MiB{more} on GPU(s) {gpus}"
