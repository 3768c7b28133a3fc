"""The in-namespace view: a POSIX sh script run with `pct exec`, needing only busybox.

It prints `fd PID PATH` and `map PID PATH` lines for every process (as the container
numbers them) with an fd or mapping whose path matches the GPU patterns, then `end`.
The container's root controls the `/bin/sh` that runs it, so its output is data: bounded
(pct.wait_pct), parsed line by line with a cap on entries, and only a hint -- a holder it
names is signalled only if it is in the container's cgroup tree and the host sees it hold a
GPU device (stop.prove).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pveclean.core.lazyre import lazy
from pveclean.core.records import Scope
from pveclean.proxmox.pct import PctMissing, PctReader, start_pct, wait_pct

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

    from pveclean.proxmox.pct import PctReader


def start_probe(scope: Scope, pct_command: str) -> subprocess.Popen[bytes]:
    """Start the in-namespace view; it runs while the host view and NVML are read."""
    try:
        return start_pct(pct_command, probe_argv(scope.vmid, scope.probe_patterns))
    except PctMissing as exc:
        raise RuntimeError(str(exc)) from None


def finish_probe(proc: subprocess.Popen[bytes] | PctReader, timeout: float
                 ) -> ProbeResult:
    """The probe's result; raises RuntimeError with the reason when it did not work."""
    if isinstance(proc, PctReader):
        proc.pump(timeout)
        res = proc.result(max(timeout, 0.5))  # its output is complete: it exits right after
    else:
        res = wait_pct(proc, timeout)
    if res.over_limit:
        raise RuntimeError(f"probe output over its limit ({res.over_limit}); ignored")
    if res.returncode is None:
        raise RuntimeError(f"pct exec did not finish within {timeout:.1f} s (frozen container?)")
    parsed = parse_probe(res.stdout)
    if parsed.over_limit:
        raise RuntimeError(f"probe output over its limit ({parsed.over_limit}); ignored")
    if parsed.missing:
        raise RuntimeError(f"the container has no '{parsed.missing}' on pct exec's PATH; "
                           "the probe cannot look")
    if not res.ok or not parsed.complete:
        why = (res.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise RuntimeError(f"pct exec failed (exit {res.returncode}): {why}")
    return parsed


# $1.. are case patterns. No ps, fuser, readlink or python needed: one `ls -l` over every
# fd directory shows the link targets (busybox and coreutils alike); maps are read by the
# shell's own `read`, so the probe forks once, whatever the number of processes.
PROBE_SCRIPT = r"""
command -v ls >/dev/null 2>&1 || { echo "missing ls"; exit 127; }
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

_LINE = lazy(r"^(fd|map) (\d{1,10}) (/\S.{0,4095})$")
MAX_PIDS = 1024  # distinct container PIDs the probe may name
MAX_PATHS = 32  # paths kept per PID


@dataclass
class ProbeResult:
    """What the in-container probe found, and how much of its answer was read."""

    holders: dict[int, list[str]] = field(default_factory=dict)  # container PID -> paths
    complete: bool = False
    bad_lines: int = 0
    over_limit: str | None = None  # the probe named more than the caps allow
    missing: str | None = None  # a tool the probe needs is not in the container


def parse_probe(output: str, max_pids: int = MAX_PIDS,
                max_paths: int = MAX_PATHS) -> ProbeResult:
    """Parse probe output; malformed lines are counted, never fatal. Output past `end`
    does not count; more than `max_pids` PIDs set `over_limit` (a shell that invents
    holders by the thousand is not a probe)."""
    result = ProbeResult()
    for line in output.split("\n"):  # the probe's printf ends lines at \n only
        line = line.strip()
        if not line:
            continue
        if line == "end":
            result.complete = True
            break
        if line.startswith("missing ") and len(line) < 40:
            result.missing = line[8:]
            continue
        m = _LINE.match(line)
        if not m:
            result.bad_lines += 1
            continue
        kind, pid, path = m.group(1), int(m.group(2)), m.group(3)
        label = path if kind == "fd" else f"{path} (mmap)"
        paths = result.holders.get(pid)
        if paths is None:
            if len(result.holders) >= max_pids:
                result.over_limit = f"more than {max_pids} processes named"
                break
            paths = result.holders[pid] = []
        if label not in paths and len(paths) < max_paths:
            paths.append(label)
    return result


def probe_argv(vmid: int, patterns: list[str]) -> list[str]:
    return ["exec", str(vmid), "--", "/bin/sh", "-c", PROBE_SCRIPT, "pveclean-probe", *patterns]
