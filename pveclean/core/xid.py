"""NVIDIA Xids as the driver writes them to the kernel log, parsed exactly, and classified by
NVIDIA's Xid catalog. Pure: the records of /dev/kmsg come in as text.

The driver (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c,
krcReportXid_IMPL) prints one line per Xid:

    NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, <message>
    NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, pid=%s, name=%s, <message>
    NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, <message>

where pid is a decimal or `'<unknown>'` and name `<unknown>` when no channel names the
process; older drivers write `pid=N, <message>` or only `<message>`. Anything else that
mentions an Xid is kept as unparsed text, never guessed at. Only a record of the kernel's own
facility counts: a write to /dev/kmsg from user space is recorded under the user facility
(the kernel's devkmsg_write forces LOG_USER when the writer names facility 0), so a
container that writes Xid-looking text there cannot make one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    """The catalog's Resolution Bucket (Immediate Action), in pveclean's words."""

    APP = "app"  # RESTART_APP: an application fault; the GPU is fine
    RESET = "reset"  # RESET_GPU: the GPU needs a reset (`pveclean reset`)
    REBOOT = "reboot"  # RESTART_BM: the node needs a reboot
    NONE = "none"  # IGNORE: nothing to do
    SUPPORT = "support"  # CONTACT_SUPPORT
    UNLISTED = "unlisted"  # not in the table below: not guessed


# The subset of NVIDIA's Xid catalog pveclean carries: "Analyzing Xid Errors with the Xid
# Catalog", Ampere and newer, column "Resolution Bucket (Immediate Action)",
# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, as read 2026-12-06.
CATALOG_VERSION = "NVIDIA Xid Catalog (Ampere and newer), Immediate Action, read 2026-12-06"
CATALOG: dict[int, tuple[str, Action]] = {
    8: ("GPU stopped processing", Action.APP),
    11: ("Invalid or corrupted push buffer stream", Action.APP),
    13: ("Graphics Engine Exception", Action.APP),
    31: ("GPU memory page fault", Action.APP),
    43: ("GPU stopped processing (reset channel verification error)", Action.APP),
    45: ("Preemptive cleanup, due to previous errors", Action.NONE),
    48: ("Double Bit ECC Error", Action.RESET),
    63: ("ECC page retirement or row remapping recording event", Action.RESET),
    64: ("ECC page retirement or row remapper recording failure", Action.RESET),
    74: ("NVLink Error", Action.RESET),
    79: ("GPU has fallen off the bus", Action.REBOOT),
    92: ("High single-bit ECC error rate", Action.NONE),
    94: ("Contained ECC error", Action.APP),
    95: ("Uncontained ECC error", Action.RESET),
    119: ("GSP RPC Timeout", Action.RESET),
    120: ("GSP Error", Action.RESET),
    154: ("GPU recovery action changed", Action.UNLISTED),  # the action is in its text
}
# Xid 154 names the action NVML now asks for (nvmlDeviceGpuRecoveryAction_t) in its text:
# "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)".
_RECOVERY = re.compile(r"\bto 0x([0-9a-fA-F]+) ")
RECOVERY_ACTIONS = {0: Action.NONE, 1: Action.RESET, 2: Action.REBOOT, 3: Action.RESET,
                    4: Action.RESET, 6: Action.RESET, 7: Action.REBOOT}

_LINE = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})"
    r"(?: GPU-I:(?P<gi>[0-9]{2,})(?: GPU-CI:(?P<ci>[0-9]{2,}))?)?\): "
    r"(?P<xid>[0-9]{1,5}), (?P<rest>.*)\Z", re.DOTALL)
_PID = re.compile(r"pid=(?P<pid>[0-9]{1,10}|'<unknown>'), (?P<rest>.*)\Z", re.DOTALL)
# a process name as the driver took it (the RM client's name, from the task's comm: at most
# 100 bytes, no comma-space in what we take as the name; the rest is the message)
_NAME = re.compile(r"name=(?P<name>.{0,100}?), (?P<rest>.*)\Z", re.DOTALL)
UNKNOWN_NAME = "<unknown>"


def classify(xid: int, text: str = "") -> Action:
    """The catalog's immediate action for `xid` (154: the recovery action its text names)."""
    if xid == 154:
        m = _RECOVERY.search(text)
        return RECOVERY_ACTIONS.get(int(m.group(1), 16), Action.UNLISTED) if m else \
            Action.UNLISTED
    entry = CATALOG.get(xid)
    return entry[1] if entry else Action.UNLISTED


@dataclass(frozen=True)
class Xid:
    """One Xid line of the driver, as it wrote it."""

    pci: str  # 0000:01:00, domain:bus:device as the driver prints it (no function)
    xid: int
    pid: int | None  # None: the driver did not know it ('<unknown>', or an older driver)
    name: str | None  # None: not told (`<unknown>`, or an older driver)
    text: str  # the message after pid/name
    gpu_instance: int | None = None  # MIG attribution
    compute_instance: int | None = None

    @property
    def action(self) -> Action:
        return classify(self.xid, self.text)

    @property
    def bus_prefix(self) -> str:
        """What a function's address starts with: `0000:01:00.` (lower case)."""
        return f"{self.pci}."


def parse_line(text: str) -> Xid | None:
    """The Xid of one kernel message, or None when it is not exactly the driver's line."""
    m = _LINE.match(text)
    if m is None:
        return None
    rest = m.group("rest")
    pid: int | None = None
    name: str | None = None
    pm = _PID.match(rest)
    if pm is None and rest.startswith("pid="):
        return None  # cut short, or a pid the driver does not write
    if pm is not None:
        pid = None if pm.group("pid").startswith("'") else int(pm.group("pid"))
        rest = pm.group("rest")
        nm = _NAME.match(rest)
        if nm is None and rest.startswith("name="):
            return None  # cut short before the message
        if nm is not None:
            name = None if nm.group("name") == UNKNOWN_NAME else nm.group("name")
            rest = nm.group("rest")
    gi, ci = m.group("gi"), m.group("ci")
    return Xid(m.group("pci"), int(m.group("xid")), pid, name, rest.rstrip("\n"),
               None if gi is None else int(gi), None if ci is None else int(ci))


def mentions_xid(text: str) -> bool:
    """A kernel message that names an Xid without being the driver's exact line: kept as
    unparsed, so a format pveclean does not know is seen rather than lost."""
    return "Xid" in text and "NVRM" in text


# ---- /dev/kmsg records (Documentation/ABI/testing/dev-kmsg) ------------------------------
KERNEL_FACILITY = 0


@dataclass(frozen=True)
class KmsgRecord:
    """One record of /dev/kmsg: `prefix,seq,usec,flags[,...];message`, then continuation
    lines (` KEY=value`) that are not part of the message."""

    facility: int
    level: int
    seq: int
    usec: int
    flags: str
    message: str

    @property
    def kernel(self) -> bool:
        return self.facility == KERNEL_FACILITY


_HEADER = re.compile(r"(?P<prefix>[0-9]{1,10}),(?P<seq>[0-9]{1,20}),(?P<usec>[0-9]{1,20}),"
                     r"(?P<flags>[^,;]{0,8})(?:,[^;]*)?;")
_ESCAPE = re.compile(r"\\x([0-9a-f]{2})")


def unescape(message: str) -> str:
    """The kernel writes non-printable bytes and backslashes as `\\xNN`."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), message)


def parse_record(record: str) -> KmsgRecord | None:
    """One record (its first line is the header and message); None when it is not one."""
    head, _, _cont = record.partition("\n")
    m = _HEADER.match(head)
    if m is None:
        return None
    prefix = int(m.group("prefix"))
    return KmsgRecord(prefix >> 3, prefix & 7, int(m.group("seq")), int(m.group("usec")),
                      m.group("flags"), unescape(head[m.end():]))
