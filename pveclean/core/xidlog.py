"""What pveclean knows of the Xids of this boot and the ones before: where the kernel log was
last read, each Xid counted by GPU, owner, number and action, the last few per GPU, and the
messages that named an Xid without being the driver's line (unparsed). Pure: `fold` takes
the records read and whose each PID is, and returns the new log and what was new.

Whose an Xid's PID is: the container (or host) by its cgroup while the PID lives and its
name is the one the driver wrote (a PID reused since is no witness); else the owner the last
GPU map saw with that PID and name; else unknown. The file is <state_dir>/xid.json, read only
by `from_dict` here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from pveclean.core.owners import UNKNOWN, Owner, OwnerKind
from pveclean.core.text import safe
from pveclean.core.xid import Action, KmsgRecord, Xid, classify, mentions_xid, parse_line

LAST_PER_GPU = 8  # Xids kept per GPU for `gpus`, reports and the pre-start check
UNPARSED_KEPT = 8
TEXT_CAP = 200  # characters of a message kept
COMM_LEN = 15  # TASK_COMM_LEN - 1: what /proc/PID/comm shows of a longer name


@dataclass(frozen=True)
class Seen:
    """One Xid as pveclean recorded it: where in the log, and whose it was."""

    seq: int
    usec: int  # since boot
    xid: Xid
    owner: Owner
    how: str  # "cgroup" (the live process), "gpu map" (the last map), "unknown"

    @property
    def action(self) -> Action:
        return self.xid.action

    def as_dict(self) -> dict[str, object]:
        x = self.xid
        return {"seq": self.seq, "usec": self.usec, "pci": x.pci, "xid": x.xid,
                "action": str(self.action), "pid": x.pid, "name": x.name,
                "text": safe(x.text, TEXT_CAP), "gpu_instance": x.gpu_instance,
                "compute_instance": x.compute_instance, "owner": str(self.owner.kind),
                "vmid": self.owner.vmid, "owner_from": self.how}


def _owner(kind: object, vmid: object) -> Owner:
    try:
        k = OwnerKind(str(kind))
    except ValueError:
        return UNKNOWN
    if k is OwnerKind.CT:
        return Owner(k, int(str(vmid))) if str(vmid).isdigit() else UNKNOWN
    return Owner(k)


def _seen_from(d: Mapping[str, object]) -> Seen:
    def opt_int(v: object) -> int | None:
        return int(str(v)) if isinstance(v, int) and not isinstance(v, bool) else None

    xid = Xid(str(d["pci"]), int(str(d["xid"])), opt_int(d.get("pid")),
              None if d.get("name") is None else str(d.get("name")), str(d.get("text", "")),
              opt_int(d.get("gpu_instance")), opt_int(d.get("compute_instance")))
    return Seen(int(str(d["seq"])), int(str(d.get("usec", 0))), xid,
                _owner(d.get("owner"), d.get("vmid")), str(d.get("owner_from", "unknown")))


# (pci, owner, xid, action) -> count
CountKey = tuple[str, Owner, int, Action]


@dataclass(frozen=True)
class XidLog:
    """The saved state of the Xid reader."""

    boot_id: str = ""
    seq: int = -1  # the last record read (-1: none yet this boot)
    counts: Mapping[CountKey, int] = field(default_factory=dict)
    last: Mapping[str, tuple[Seen, ...]] = field(default_factory=dict)  # pci -> newest last
    unparsed: tuple[str, ...] = ()
    lost: int = 0  # records the kernel dropped before they were read
    pids: Mapping[int, tuple[Owner, str]] = field(default_factory=dict)  # the last GPU map's
    # pci -> the newest Xid that asks for a reset or a reboot and has not had one since
    # (a new boot clears them all; `pveclean reset` its GPU's)
    pending: Mapping[str, Seen] = field(default_factory=dict)
    # container -> its Xids not yet in one of its reports (the next one lists them)
    unreported: Mapping[int, tuple[Seen, ...]] = field(default_factory=dict)

    def take(self, vmid: int) -> tuple[XidLog, tuple[Seen, ...]]:
        """Container `vmid`'s Xids for its report, and the log without them."""
        got = self.unreported.get(vmid, ())
        return replace(self, unreported={v: s for v, s in self.unreported.items()
                                         if v != vmid}), got

    def last_on(self, pci_prefix: str) -> tuple[Seen, ...]:
        """The last Xids of the GPU whose address starts `0000:01:00` (any function)."""
        return self.last.get(pci_prefix.lower(), ())

    def needs_reset(self, pci_prefix: str) -> Seen | None:
        """The GPU's newest Xid that asks for a reset or a reboot, unless one came since."""
        return self.pending.get(pci_prefix.lower())

    def reset_done(self, pci_prefix: str) -> XidLog:
        """After a verified reset of that GPU: its pending Xid is resolved."""
        return replace(self, pending={p: s for p, s in self.pending.items()
                                      if p != pci_prefix.lower()})

    def with_map(self, pids: Mapping[int, tuple[Owner, str]]) -> XidLog:
        """The owners the latest GPU map saw, for Xids whose process is gone by then."""
        return replace(self, pids=dict(pids))

    def as_dict(self) -> dict[str, object]:
        return {"boot_id": self.boot_id, "seq": self.seq, "lost": self.lost,
                "counts": [[p, str(o.kind), o.vmid, x, str(a), n]
                           for (p, o, x, a), n in sorted(self.counts.items(), key=str)],
                "last": {p: [s.as_dict() for s in seen] for p, seen in sorted(self.last.items())},
                "unparsed": list(self.unparsed),
                "pids": {str(p): [str(o.kind), o.vmid, n] for p, (o, n) in
                         sorted(self.pids.items())},
                "pending": {p: s.as_dict() for p, s in sorted(self.pending.items())},
                "unreported": {str(v): [s.as_dict() for s in seen]
                               for v, seen in sorted(self.unreported.items())}}


def from_dict(raw: object) -> XidLog:
    """The saved log; anything not as written starts afresh (ValueError from the caller's
    view: it starts a new log)."""
    if not isinstance(raw, dict):
        raise ValueError("not a mapping")
    counts: dict[CountKey, int] = {}
    for p, kind, vmid, x, a, n in raw.get("counts", []):
        counts[(str(p), _owner(kind, vmid), int(x), Action(str(a)))] = int(n)
    last = {str(p): tuple(_seen_from(s) for s in seen)
            for p, seen in dict(raw.get("last", {})).items()}
    pids = {int(p): (_owner(v[0], v[1]), str(v[2])) for p, v in dict(raw.get("pids", {})).items()}
    pending = {str(p): _seen_from(s) for p, s in dict(raw.get("pending", {})).items()}
    unreported = {int(v): tuple(_seen_from(s) for s in seen)
                  for v, seen in dict(raw.get("unreported", {})).items()}
    return XidLog(str(raw.get("boot_id", "")), int(raw.get("seq", -1)), counts, last,
                  tuple(str(u) for u in raw.get("unparsed", [])), int(raw.get("lost", 0)), pids,
                  pending, unreported)


def same_name(driver: str | None, comm: str | None) -> bool:
    """Whether a process named `comm` now (/proc/PID/comm) is the one the driver named."""
    if driver is None or comm is None:
        return False
    return comm == driver[:COMM_LEN] or driver == comm


def xids_in(records: Iterable[KmsgRecord]) -> list[tuple[KmsgRecord, Xid]]:
    """The kernel's own records that are exactly a driver's Xid line."""
    out = []
    for r in records:
        x = parse_line(r.message) if r.kernel else None
        if x is not None:
            out.append((r, x))
    return out


def _whose(log: XidLog, x: Xid, live: Mapping[int, Owner]) -> tuple[Owner, str]:
    if x.pid is None:
        return UNKNOWN, "unknown"
    if x.pid in live:
        return live[x.pid], "cgroup"
    mapped = log.pids.get(x.pid)
    if mapped is not None and (x.name is None or same_name(x.name, mapped[1])):
        return mapped[0], "gpu map"
    return UNKNOWN, "unknown"


def fold(log: XidLog, boot_id: str, records: list[KmsgRecord], live: Mapping[int, Owner],
         lost: int = 0) -> tuple[XidLog, list[Seen]]:
    """The log after `records` (read in order from the kernel log). `live`: PID -> owner of
    each Xid PID that still lives under the name the driver wrote; `lost`: records the
    kernel dropped unread (EPIPE). A new boot starts the position afresh; counts go on."""
    same_boot = boot_id == log.boot_id
    seq = log.seq if same_boot else -1
    pending = dict(log.pending) if same_boot else {}  # a reboot resets every GPU
    unreported = {v: list(s) for v, s in log.unreported.items()}
    counts = dict(log.counts)
    last = {p: list(s) for p, s in log.last.items()}
    unparsed = list(log.unparsed)
    new: list[Seen] = []
    for r in records:
        if r.seq <= seq:
            continue
        if seq >= 0 and r.seq > seq + 1:
            lost += r.seq - seq - 1
        seq = r.seq
        if not r.kernel:
            continue  # user space's writes to /dev/kmsg: never an Xid
        x = parse_line(r.message)
        if x is None:
            if mentions_xid(r.message):
                unparsed.append(safe(r.message, TEXT_CAP))
            continue
        owner, how = _whose(log, x, live)
        s = Seen(r.seq, r.usec, x, owner, how)
        key = (x.pci, owner, x.xid, classify(x.xid, x.text))
        counts[key] = counts.get(key, 0) + 1
        last.setdefault(x.pci, []).append(s)
        if s.action in (Action.RESET, Action.REBOOT):
            pending[x.pci] = s
        if owner.kind is OwnerKind.CT and owner.vmid is not None:
            unreported.setdefault(owner.vmid, []).append(s)
        new.append(s)
    out = XidLog(boot_id, seq, counts,
                 {p: tuple(s[-LAST_PER_GPU:]) for p, s in last.items()},
                 tuple(unparsed[-UNPARSED_KEPT:]), log.lost + lost, log.pids, pending,
                 {v: tuple(s[-LAST_PER_GPU:]) for v, s in unreported.items()})
    return out, new
