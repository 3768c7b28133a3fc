"""Messages to the systemd journal through its native protocol, for runs whose output nobody
reads: the drop-in's lines run with the unit's StandardOutput=null and
StandardError=file:/run/pve/ct-%i.stderr (lxc-start's own error log, which vm_start shows when
a start fails). journald adds the unit (_SYSTEMD_UNIT, from the sender's cgroup): `journalctl
-u pve-container@<vmid>` shows the lines; `journalctl -t pveclean` shows every run's.
"""

from __future__ import annotations

import struct

JOURNAL_SOCKET = "/run/systemd/journal/socket"
MAX_MESSAGE = 48 << 10  # bytes of one message: a datagram journald takes on any host
PRIORITY = {"err": 3, "warning": 4, "info": 6}


def encode(fields: dict[str, str]) -> bytes:
    """journald's native datagram: `KEY=value\\n`, or, for a value holding a newline, the key,
    a newline, the value's length as a little-endian 64-bit number, the value, a newline."""
    out = bytearray()
    for key, value in fields.items():
        raw = value.encode("utf-8", "replace")
        if b"\n" in raw:
            out += key.encode() + b"\n" + struct.pack("<Q", len(raw)) + raw + b"\n"
        else:
            out += key.encode() + b"=" + raw + b"\n"
    return bytes(out)


def send(message: str, priority: str = "info", fields: dict[str, str] | None = None,
         socket_path: str = JOURNAL_SOCKET) -> bool:
    """One entry with identifier `pveclean`; False when no journal took it (no journald, a
    full socket buffer: never waited for)."""
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "\n[... cut: the whole text is in the report]"
    payload = encode({"MESSAGE": message, "PRIORITY": str(PRIORITY.get(priority, 6)),
                      "SYSLOG_IDENTIFIER": "pveclean", **(fields or {})})
    try:
        import socket  # only when a run writes to the journal

        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(payload, socket_path)
        return True
    except OSError:
        return False
