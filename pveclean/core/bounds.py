"""Caps on what one report lists, all in one place: whatever a container's root does (400
holders, 64 GPU paths of 4,000 characters each), a report stays under MAX_REPORT_BYTES, so it
is redacted, dumped and written within the run's deadline and an admin can still read it.

What is cut is counted, never dropped silently: the holders past the cap are summarized in
`holders_not_listed` (how many, per outcome, their PIDs as ranges, their most frequent names,
their GPU memory per GPU); a holder's device paths past the cap are counted in its
`devices_more` (the report's "…+N more"); a list past its cap ends in "… N more not
listed"; a string past TEXT ends in "…". The holders that matter most are listed first:
those the run left behind, then those it could not signal.
Sizes are estimates of the YAML each value becomes, never below it (see `size`)."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Sequence

from pveclean.core.records import MORE, DeviceUse, Holder, Sent
from pveclean.core.verdicts import REMAINING, Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing's import alone cost a hook run 2 ms (nothing else there needs it)
    from typing import Protocol, TypeVar

    from pveclean.core.amendments import NotListed, UnitStop, UnitStops

    class Plain(Protocol):
        def as_dict(self) -> dict[str, object]: ...

    P = TypeVar("P", bound=Plain)
    T = TypeVar("T")

MAX_REPORT_BYTES = 1 << 20  # the report file, at most
HOLDERS = 100  # holders listed in full
HOLDERS_BYTES = 512 << 10  # ... and at most this much YAML for the listed holders together
DEVICES = 8  # device paths listed per holder (and one for each other device it holds)
TEXT = 4096  # characters of one string of a listed holder (PATH_MAX: a whole path)
DEVICE_CHARS = 512  # characters of one device path label: its start and its end (the device)
ITEMS = 16  # entries of a holder's other lists (its signals)
HOLDER_BYTES = 32 << 10  # one holder past this is listed shorter: SHORT characters a string,
SHORT = 128  # ... SHORT_ITEMS entries a list (an admin still sees who it is and what it held)
SHORT_ITEMS = 4
PID_RANGES = 64  # PID ranges of the holders not listed
NAMES = 10  # names of the holders not listed (the most frequent), each cut to NAME_CHARS
NAME_CHARS = 64
SECTION_BYTES = {  # the report's other lists; what is left of MAX_REPORT_BYTES is the rest's
    "warnings": 64 << 10, "errors": 64 << 10, "hints": 16 << 10, "other_gpu_users": 64 << 10,
    "unit_stops": 64 << 10, "removed_cgroups": 64 << 10, "leaks": 16 << 10,
}
UNSAVED_SHOWN = 16 << 10  # characters of an unsaved report shown on stderr (the task log)


def size(v: object) -> int:
    """An upper bound on the bytes of `v` in the report's YAML: printable ASCII as is (a
    quote doubled), other printable text as its escapes (\\u202e: never shorter than its
    UTF-8), text with anything unprintable at the longest escape per character (\\U000e0001)
    plus the indentation of each line of a literal block; keys, dashes and indentation per
    entry. C-speed string methods only: it runs over every listed holder."""
    if isinstance(v, str):
        if v.isprintable():
            quotes = v.count("'") + v.count('"') + v.count("\\")
            if v.isascii():
                return len(v) + quotes + 4
            return len(v.encode("ascii", "backslashreplace")) + quotes + 4
        return 10 * len(v) + 8 * v.count("\n") + 4
    if isinstance(v, dict):
        return sum(size(k) + size(x) + 8 for k, x in v.items()) + 4
    if isinstance(v, list | tuple | set | frozenset):
        return sum(size(x) + 8 for x in v) + 4
    return 24


def cut(s: str, limit: int = TEXT) -> str:
    return s if len(s) <= limit else s[: limit - 1] + MORE


def cut_middle(s: str, limit: int = DEVICE_CHARS) -> str:
    """`s` cut in the middle: a device path label keeps its start and its device number."""
    if len(s) <= limit:
        return s
    half = (limit - 1) // 2
    return s[:half] + MORE + s[len(s) - (limit - 1 - half):]


def clip(v: T, budget: int, text: int = TEXT) -> T:
    """`v` (a list of strings, or any plain value) with every string cut to `text` characters
    and every list cut where the estimated YAML passes `budget`; a cut list ends with how
    many entries were left out."""
    return _clip(v, budget, text)  # type: ignore[return-value]  # _clip keeps v's shape


def _clip(v: object, budget: int, text: int) -> object:
    if isinstance(v, str):
        return cut(v, text)
    if isinstance(v, dict):
        return {k: _clip(x, budget, text) for k, x in v.items()}
    if isinstance(v, list | tuple):
        out: list[object] = []
        used = 0
        for i, x in enumerate(v):
            x = _clip(x, budget, text)
            used += size(x) + 8
            if used > budget:
                out.append(f"{MORE} {len(v) - i} more not listed")
                break
            out.append(x)
        return out
    return v


def clip_strings(v: P, text: int = TEXT) -> P:
    """A record with each of its strings cut to `text` characters (those of its dicts'
    values too); its lists are the caller's (clip_list)."""
    changes: dict[str, object] = {}
    for f in dataclasses.fields(v):  # type: ignore[arg-type]
        x = getattr(v, f.name)
        if isinstance(x, str) and len(x) > text:
            changes[f.name] = cut(x, text)
        elif isinstance(x, dict):
            changes[f.name] = {k: cut(y, text) if isinstance(y, str) else y
                               for k, y in x.items()}
    return dataclasses.replace(v, **changes) if changes else v  # type: ignore[type-var]


def clip_list(items: Sequence[P], budget: int, text: int = TEXT) -> tuple[list[P], int]:
    """The records of a list, strings cut, as many as fit in `budget` (their estimated
    YAML, as clip() counts it); and how many more were left out."""
    out: list[P] = []
    used = 0
    for i, x in enumerate(items):
        x = clip_strings(x, text)
        used += size(x.as_dict()) + 8
        if used > budget:
            return out, len(items) - i
        out.append(x)
    return out, 0


def _clip_ints(items: list[int], budget: int) -> tuple[list[int], int]:
    """As clip() cuts a list of numbers: each counts size(0) + 8 bytes."""
    fit = min(len(items), budget // (size(0) + 8))
    return items[:fit], len(items) - fit


def clip_unit_stops(stops: UnitStops, budget: int, text: int = TEXT) -> UnitStops:
    """What --stop-units did, within its share: each unit's PIDs and the units cut where
    they pass `budget`, strings cut to `text`."""
    units: list[UnitStop] = []
    for u in stops.units:
        pids, more = _clip_ints(u.holders, budget)
        units.append(dataclasses.replace(clip_strings(u, text), holders=pids,
                                         holders_more=u.holders_more + more))
    kept, more = clip_list(units, budget, text)
    return dataclasses.replace(clip_strings(stops, text), units=kept,
                               units_more=stops.units_more + more)


def cap_devices(devices: list[DeviceUse], more: int = 0, limit: int = DEVICES
                ) -> tuple[list[DeviceUse], int]:
    """A holder's device paths: the first one of each device it holds (their number is the
    host's GPU nodes, not the tenant's to grow), then the others up to `limit`, in their
    order; and how many are not listed (`more`: those capped before, at the scan)."""
    if len(devices) <= limit:
        return list(devices), more
    seen: set[tuple[int, int]] = set()
    keep: set[int] = set()
    for i, d in enumerate(devices):
        number = d.number
        if number is not None and number not in seen:
            seen.add(number)
            keep.add(i)
    for i in range(len(devices)):
        if len(keep) >= max(limit, len(seen)):
            break
        keep.add(i)
    return [devices[i] for i in sorted(keep)], len(devices) - len(keep) + more


def cut_device(d: DeviceUse, limit: int = DEVICE_CHARS) -> DeviceUse:
    """`d` with its label cut in the middle to `limit` characters (as cut_middle): its path
    cut, its device number kept; a label whose end is too short for it is kept as text."""
    label = str(d)
    if len(label) <= limit:
        return d
    half = (limit - 1) // 2
    suffix = len(label) - len(d.name)
    tail = limit - 1 - half - suffix
    if tail < 0:
        return DeviceUse.named(cut_middle(label, limit))
    name = d.name
    return dataclasses.replace(d, path=name[:half] + MORE + name[len(name) - tail:], fd=None)


def bound_holder(h: Holder, text: int = TEXT, items: int = ITEMS, devices: int = DEVICES,
                 device_chars: int = DEVICE_CHARS) -> Holder:
    """The holder as a report lists it: strings cut to `text`, device paths to `devices`
    (each device kept), its other lists to `items`."""
    changes: dict[str, str | int | list[str] | list[Sent] | list[DeviceUse]] = {}
    for f in dataclasses.fields(h):
        v = getattr(h, f.name)
        if f.name == "devices":
            v, changes["devices_more"] = cap_devices(v, h.devices_more, devices)
            v = [cut_device(x, device_chars) for x in v]
        elif isinstance(v, str) and len(v) > text:
            v = cut(v, text)
        elif f.name == "signals" and (len(v) > items or any(len(str(x)) > text for x in v)):
            v = [x if len(str(x)) <= text else Sent(note=cut(str(x), text)) for x in v[:items]]
            if len(h.signals) > items:
                v.append(Sent(note=f"{MORE} {len(h.signals) - items} more not listed"))
        elif isinstance(v, list) and (len(v) > items or any(
                isinstance(x, str) and len(x) > text for x in v)):
            v = [cut(x, text) if isinstance(x, str) else x for x in v[:items]]
            if len(getattr(h, f.name)) > items:
                v.append(f"{MORE} {len(getattr(h, f.name)) - items} more not listed")
        else:
            continue
        changes[f.name] = v
    if not changes:
        return h
    bounded = copy.copy(h)  # as dataclasses.replace would, whose **changes mypy types per field
    for name, value in changes.items():
        setattr(bounded, name, value)
    return bounded


READ_CHARS = 4 << 20  # characters of holders' strings one scan keeps as bound_holder cuts them
ARGV_SHORT = 512  # characters of a holder's argv in all, past READ_CHARS


class ReadBudget:
    """What one scan keeps of its holders' strings, in the worker where they are read: each
    as bound_holder cuts it until READ_CHARS characters are kept (the report lists at most
    HOLDERS of them in full), every later one cut short (SHORT characters a string, its argv
    to ARGV_SHORT in all): 2,000 holders of any shape stay a few MB, not 140 MB."""

    def __init__(self, chars: int = READ_CHARS) -> None:
        self.left = chars

    def keep(self, h: Holder) -> Holder:
        if self.left > 0:
            self.left -= _chars(h)
            return h
        short = bound_holder(h, SHORT, SHORT_ITEMS, SHORT_ITEMS, SHORT)
        if short is h:
            short = copy.copy(h)
        short.argv = _cut_argv(h.argv, ARGV_SHORT)
        return short


def _chars(h: Holder) -> int:
    return (sum(len(a) for a in h.argv) + sum(len(str(d)) for d in h.devices)
            + sum(len(v) for v in (h.name, h.exe, h.cgroup, h.user, h.protected, h.unit) if v))


def _cut_argv(argv: tuple[str, ...], limit: int) -> tuple[str, ...]:
    """`argv` while it fits `limit` characters in all, the item that crosses it cut, then how
    many items were left out."""
    out: list[str] = []
    left = limit
    for i, a in enumerate(argv):
        if left <= 0:
            out.append(f"{MORE} {len(argv) - i} more not listed")
            break
        out.append(cut(a, left))
        left -= len(out[-1])
    return tuple(out)


def listed_holder(h: Holder) -> tuple[Holder, int]:
    """The holder bounded, shorter when it is still over HOLDER_BYTES; and its size."""
    b = bound_holder(h)
    need = size(b.as_dict())
    if need > HOLDER_BYTES:
        b = bound_holder(h, SHORT, SHORT_ITEMS, SHORT_ITEMS, SHORT)
        need = size(b.as_dict())
    return b, need + 8


def _rank(h: Holder) -> int:
    """Which holders a report lists first: those the run left behind, then those it did not
    signal, then those with GPU memory, then the rest."""
    if h.outcome in REMAINING:
        return 0
    if h.outcome is Outcome.SKIPPED:
        return 1
    return 2 if h.gpu_memory_mib else 3


def select(holders: list[Holder], limit: int = HOLDERS, budget: int = HOLDERS_BYTES
           ) -> tuple[list[Holder], list[Holder]]:
    """(listed, not listed): the holders a report lists in full, bounded, in their order,
    those that matter most chosen first; the others, to be summarized."""
    order = sorted(range(len(holders)), key=lambda i: (_rank(holders[i]), i))
    listed: dict[int, Holder] = {}
    used = 0
    for i in order:
        if len(listed) >= limit:
            break
        b, need = listed_holder(holders[i])
        if used + need > budget:
            break
        used += need
        listed[i] = b
    rest = [h for i, h in enumerate(holders) if i not in listed]
    return [listed[i] for i in sorted(listed)], rest


def pid_ranges(pids: list[int], limit: int = PID_RANGES) -> str:
    """1000-1299, 1400, 1402-1410 ... at most `limit` ranges, then how many PIDs more."""
    ranges: list[list[int]] = []
    for p in sorted(set(pids)):
        if ranges and p == ranges[-1][1] + 1:
            ranges[-1][1] = p
        else:
            ranges.append([p, p])
    shown = [f"{a}-{b}" if b > a else str(a) for a, b in ranges[:limit]]
    more = sum(b - a + 1 for a, b in ranges[limit:])
    return ", ".join(shown) + (f", {MORE} {more} more" if more else "")


def not_listed(rest: list[Holder]) -> NotListed | None:
    """What a report says of the holders it does not list in full."""
    if not rest:
        return None
    from pveclean.core.amendments import NotListed  # past the caps only

    outcomes = Counter(str(h.outcome) if h.outcome else "unknown" for h in rest)
    names = Counter(cut(h.name, NAME_CHARS) for h in rest)
    top = dict(names.most_common(NAMES))
    if len(names) > NAMES:
        top[f"({len(names) - NAMES} other names)"] = sum(names.values()) - sum(top.values())
    memory: dict[int, int] = {}
    for h in rest:
        for gpu, mib in h.gpu_memory_mib.items():
            memory[int(gpu)] = memory.get(int(gpu), 0) + (mib or 0)
    return NotListed(count=len(rest), outcomes=dict(sorted(outcomes.items())),
                     host_pids=pid_ranges([h.host_pid for h in rest]), names=top,
                     gpu_memory_mib=dict(sorted(memory.items())),
                     why=f"a report lists at most {HOLDERS} holders in full, in at most "
                         f"{HOLDERS_BYTES >> 10} KiB (those left behind first); `pveclean ct "
                         "VMID --dry-run` shows what is there now")
