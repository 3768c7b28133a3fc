"""A stand-in for /dev/kmsg that tests feed: records in the kernel's own format
(Documentation/ABI/testing/dev-kmsg: `prefix,seq,usec,flags;message`, then continuation lines
` KEY=value`), written to a regular file that pveclean reads through `kmsg_path`. The kernel's
own messages go under facility 0; what user space writes is recorded under the user facility
(1), as devkmsg_write records it whatever prefix the writer gave."""

from __future__ import annotations

import os
from pathlib import Path

KERN_ERR = 3
KERN_WARNING = 4
USER = 1


def escape(message: str) -> str:
    """The kernel writes bytes < 0x20 (but tab), 0x7f and backslash as \\xNN."""
    return "".join(f"\\x{ord(c):02x}" if (ord(c) < 0x20 and c != "\t") or c in "\\\x7f"
                   else c for c in message)


def xid_line(pci: str = "0000:01:00", xid: int = 13, pid: int | str | None = 4242,
             name: str | None = "python3", text: str = "Graphics Exception: ESR 0x504648",
             gi: int | None = None) -> str:
    """A line as the driver's krcReportXid writes it."""
    where = f"PCI:{pci}" + ("" if gi is None else f" GPU-I:{gi:02d}")
    if pid is None:
        return f"NVRM: Xid ({where}): {xid}, {text}"
    p = "'<unknown>'" if pid == "unknown" else str(pid)
    if name is None:
        return f"NVRM: Xid ({where}): {xid}, pid={p}, {text}"
    return f"NVRM: Xid ({where}): {xid}, pid={p}, name={name}, {text}"


class Kmsg:
    """The stand-in file: each call appends one record with the next sequence number."""

    def __init__(self, path: Path, first_seq: int = 0) -> None:
        self.path = path
        self.seq = first_seq
        self.usec = 1_000_000
        path.touch()

    def record(self, message: str, facility: int = 0, level: int = KERN_ERR,
               flags: str = "-", extra: str = "", cont: tuple[str, ...] = ()) -> int:
        seq = self.seq
        self.seq += 1
        self.usec += 1234
        head = f"{facility * 8 + level},{seq},{self.usec},{flags}{extra};{escape(message)}\n"
        body = "".join(f" {c}\n" for c in cont)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(head + body)
        return seq

    def kernel(self, message: str, **kw: object) -> int:
        return self.record(message, 0, **kw)  # type: ignore[arg-type]

    def user(self, message: str) -> int:
        """What a process writes to /dev/kmsg, `<0>` prefix or not: the user facility."""
        return self.record(message, USER, KERN_WARNING if not message.startswith("<") else 0)

    def xid(self, **kw: object) -> int:
        return self.kernel(xid_line(**kw))  # type: ignore[arg-type]

    def raw(self, text: str) -> None:
        """Bytes as they are, for truncated or broken records."""
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(text)

    def skip(self, n: int) -> None:
        """Records the ring buffer overwrote before anyone read them."""
        self.seq += n

    def wipe(self) -> None:
        os.truncate(self.path, 0)
