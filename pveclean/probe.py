"""The in-namespace view: a POSIX sh script run with `pct exec`, needing only busybox.

It prints `fd PID PATH` and `map PID PATH` lines for every process (as the container
numbers them) with an fd or mapping whose path matches the GPU patterns, then `end`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# $1.. are case patterns. No ps, fuser, readlink or python needed: one `ls -l` over every
# fd directory shows the link targets (busybox and coreutils alike); maps are read by the
# shell's own `read`, so the probe forks once, whatever the number of processes.
PROBE_SCRIPT = r"""
self=$$
p=
ls -l /proc/[0-9]*/fd/ 2>/dev/null | while read -r line; do
  case $line in
    /proc/*/fd:|/proc/*/fd/:) p=${line#/proc/}; p=${p%%/*}; continue;;
    *" -> "*) ;;
    *) continue;;
  esac
  [ "$p" = "$self" ] && continue
  t=${line##* -> }
  for pat in "$@"; do
    case $t in $pat) echo "fd $p $t"; break;; esac
  done
done
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  [ "$p" = "$self" ] && continue
  [ -r "$d/maps" ] || continue
  while read -r a b c d2 e path; do
    case $path in /*) ;; *) continue;; esac
    for pat in "$@"; do
      case $path in $pat) echo "map $p $path"; break;; esac
    done
  done < "$d/maps" 2>/dev/null
done
echo end
"""

_LINE = re.compile(r"^(fd|map) (\d+) (/\S.*)$")


@dataclass
class ProbeResult:
    holders: dict[int, list[str]] = field(default_factory=dict)  # container PID -> paths
    complete: bool = False
    bad_lines: int = 0


def parse_probe(output: str) -> ProbeResult:
    """Parse probe output; malformed lines are counted, never fatal."""
    result = ProbeResult()
    for line in output.splitlines():
        line = line.strip()
        if not line:
            continue
        if line == "end":
            result.complete = True
            continue
        m = _LINE.match(line)
        if not m:
            result.bad_lines += 1
            continue
        kind, pid, path = m.group(1), int(m.group(2)), m.group(3)
        label = path if kind == "fd" else f"{path} (mmap)"
        paths = result.holders.setdefault(pid, [])
        if label not in paths:
            paths.append(label)
    return result


def probe_argv(vmid: int, patterns: list[str]) -> list[str]:
    return ["exec", str(vmid), "--", "/bin/sh", "-c", PROBE_SCRIPT, "pveclean-probe", *patterns]
