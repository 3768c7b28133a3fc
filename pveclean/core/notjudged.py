"""What `pveclean gpus`' look at the host could not read whole, as typed records: a
container's cgroup tree, one of its processes, the host's processes. None of it is innocent:
each is a `not judged` row in `gpus` and a blocker of a VM's start (core/vmguard.py), whatever
GPU it may hold, since what it holds could not be told."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pveclean.core.owners import HOST, Owner, OwnerKind

Json = dict[str, object]
MOST_PER_TREE = 20  # processes named one by one per container; the rest counted in one row


@dataclass(frozen=True)
class NotJudged:
    """One part of the host that was not read whole, whose it is, and why."""

    owner: Owner
    what: str  # "PID 4242", "its cgroup tree", "the host's processes"
    why: str  # the reader's own words (kernel text, a worker's reason), shown, never parsed
    host_pid: int | None = None

    def as_dict(self) -> Json:
        return {"owner": str(self.owner.kind), "vmid": self.owner.vmid,
                "host_pid": self.host_pid, "what": self.what, "why": self.why}


def of_container(vmid: int, unjudged: Mapping[int, list[str]]) -> list[NotJudged]:
    """A container's processes its scan could not judge whole (PID -> why), the first
    MOST_PER_TREE by PID one by one, the rest in one row that counts them."""
    owner = Owner(OwnerKind.CT, vmid)
    pids = sorted(unjudged)
    out = [NotJudged(owner, f"PID {pid}", "; ".join(unjudged[pid][:3]), pid)
           for pid in pids[:MOST_PER_TREE]]
    if len(pids) > MOST_PER_TREE:
        out.append(NotJudged(owner, f"{len(pids) - MOST_PER_TREE} more processes",
                             "fds, io_uring files or mappings not judged"))
    return out


def tree(vmid: int, why: str) -> NotJudged:
    """A container's cgroup tree, or part of it, that was not walked or read."""
    return NotJudged(Owner(OwnerKind.CT, vmid), "its cgroup tree", why)


def of_host(problems: Iterable[str]) -> list[NotJudged]:
    """What the host's scan could not read (its readers' own lines)."""
    return [NotJudged(HOST, "the host's processes", p) for p in problems]
