"""A stand-in for nvidia-persistenced in the lab: it keeps the device node of every GPU whose
persistence mode is on open, as the daemon does, and follows NVML's changes: when
nvmlDeviceSetPersistenceMode turns a GPU's mode off (the fake NVML appends `persistence N off`
to its state file), it closes that GPU's node, and opens it again when the mode comes back on
(nvidia-persistenced's RPC from NVML does this on a real host).

Usage: persistenced.py STATE_FILE READY_FILE NODE0 [NODE1 ...]  (NODEi: GPU i's /dev/nvidiaI)
Started through a link named `nvidia-persistenced`, so that its comm is the daemon's.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path

POLL = 0.05


def modes(state: Path) -> dict[int, bool]:
    """GPU index -> persistence on, the last `persistence` line of the state file winning."""
    out: dict[int, bool] = {}
    with contextlib.suppress(OSError):
        for line in state.read_text(encoding="ascii").splitlines():
            m = re.fullmatch(r"persistence (\d+) (on|off)", line.strip())
            if m:
                out[int(m.group(1))] = m.group(2) == "on"
    return out


def main(argv: list[str]) -> int:
    state, ready, nodes = Path(argv[0]), Path(argv[1]), argv[2:]
    fds: dict[int, int] = {}
    first = True
    while True:
        now = modes(state)
        for gpu, node in enumerate(nodes):
            on = now.get(gpu, False)
            if on and gpu not in fds:
                fds[gpu] = os.open(node, os.O_RDWR)
            elif not on and gpu in fds:
                os.close(fds.pop(gpu))
        if first:
            ready.write_text(f"{os.getpid()}\n")
            first = False
        time.sleep(POLL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
