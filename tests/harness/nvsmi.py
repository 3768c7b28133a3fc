"""Stand-ins for what `pveclean reset` runs on the host: the driver's reset tool
(`nvidia-smi -r -i <PCI id>`) and `systemctl stop|start UNIT`, written into a lab directory.

The nvidia-smi stand-in answers as the real one does for a reset: `GPU <busId> was
successfully reset.` and exit 0, or an error and exit 255; what it does is set per test in
`<dir>/nvsmi.mode`: `ok`, `fail`, `hang` (sleeps until killed). It refuses, as the driver
does, while the GPU's persistence mode is on (the fake NVML's state says so), and on success
appends `reset <index>` to the fake NVML's state: the GPU's leak is gone. The bus id maps to
the index as the fake NVML lays them out (bus 0x18 + index). Every call is logged to
`<dir>/calls.log`.

The systemctl stand-in logs `stop UNIT` / `start UNIT` to the same log, and on stop kills
the PIDs listed in `<dir>/units/<unit>` (the test's daemon stand-in); `<dir>/systemctl.fail`
names a unit whose stop fails."""

from __future__ import annotations

from pathlib import Path

NVIDIA_SMI = r"""#!/bin/sh
D="@DIR@"
STATE="@STATE@"
KMSG="@KMSG@"
echo "nvidia-smi $*" >> "$D/calls.log"
[ "$1" = "-r" ] && [ "$2" = "-i" ] || { echo "usage: nvidia-smi -r -i ID"; exit 2; }
bus=$(echo "$3" | sed -n 's/^[0-9A-Fa-f]*:\([0-9A-Fa-f][0-9A-Fa-f]\):00\.0$/\1/p')
[ -n "$bus" ] || { echo "No devices were found"; exit 6; }
idx=$(( 0x$bus - 0x18 ))
mode=$(cat "$D/nvsmi.mode" 2>/dev/null || echo ok)
last=$(grep "^persistence $idx " "$STATE" | tail -n 1)
if [ "$last" = "persistence $idx on" ]; then
    echo "Unable to reset GPU $3 because it's being used by some other process"
    exit 255
fi
case "$mode" in
    hang) exec sleep 3600 ;;
    fail) echo "GPU $3: In use by another client"; exit 255 ;;
    xid) lower=$(echo "$bus" | tr 'A-F' 'a-f')
         printf '3,999999,1,-;NVRM: Xid (PCI:0000:%s:00): 79, pid=0, %s\n' "$lower" \
             "GPU has fallen off the bus." >> "$KMSG" ;;
esac
[ "$mode" = noop ] || echo "reset $idx" >> "$STATE"
echo "GPU $3 was successfully reset."
"""

SYSTEMCTL = r"""#!/bin/sh
D="@DIR@"
echo "systemctl $*" >> "$D/calls.log"
verb=$1; unit=$2
if [ "$verb" = stop ]; then
    fail=$(cat "$D/systemctl.fail" 2>/dev/null)
    [ "$fail" = "$unit" ] && { echo "Job for $unit failed."; exit 1; }
    [ -f "$D/units/$unit" ] && for p in $(cat "$D/units/$unit"); do kill -9 "$p" 2>/dev/null; done
fi
exit 0
"""


def install(d: Path, state: Path, kmsg: Path | None = None) -> tuple[Path, Path]:
    """Both stand-ins in `d`; returns (nvidia-smi, systemctl). Modes beyond ok/fail/hang:
    `noop` says it reset the GPU and did not (its leak stays), `xid` resets it and the
    driver logs an Xid 79 for it to `kmsg` (the kernel log stand-in)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "units").mkdir(exist_ok=True)
    out = []
    for name, text in (("nvidia-smi", NVIDIA_SMI), ("systemctl", SYSTEMCTL)):
        p = d / name
        p.write_text(text.replace("@DIR@", str(d)).replace("@STATE@", str(state))
                     .replace("@KMSG@", str(kmsg or d / "kmsg")))
        p.chmod(0o755)
        out.append(p)
    return out[0], out[1]


def calls(d: Path) -> list[str]:
    log = d / "calls.log"
    return log.read_text().splitlines() if log.exists() else []
