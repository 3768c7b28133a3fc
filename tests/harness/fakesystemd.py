"""systemd in a lab container, as far as pveclean meets it: unit cgroups and `systemctl`.

`install_systemd()` puts into a lab container's rootfs a busybox-sh stand-in for the parts of
systemd that GPU services show to pveclean (what each mirrors is named, from systemd):

- cgroups: the service manager lives in `/init.scope` with PID 1 (systemd moves itself there
  at boot, `src/core/cgroup.c`), and each service's processes in `/system.slice/<unit>`
  (`unit_default_cgroup_path`), inside the container's cgroup namespace, so the host sees
  `lxc/<vmid>/ns/system.slice/<unit>`;
- `systemctl start UNIT`: a per-unit runner (playing PID 1's part for that unit, living in
  `init.scope`) starts `ExecStart=` in the unit's cgroup and, when the main process exits,
  starts it again per `Restart=` (`always`, `on-failure`, `no`; `service_shall_restart`),
  after `RestartSec=` (default 0 here; systemd's is 100 ms), at most `StartLimitBurst=` starts
  (default 5, as systemd; the interval is not modelled), then the unit is `failed`;
- `systemctl stop [--] UNIT...`: a stop job: the unit is not restarted any more (a stop job
  suppresses `Restart=`), its cgroup is killed (`KillMode=control-group`; here at once with
  `cgroup.kill`, or SIGKILL to each of `cgroup.procs` where the kernel lacks it), and the call
  returns when the cgroup is empty; a unit without a unit file fails as systemd does:
  `Failed to stop X: Unit X not loaded.`, exit 5;
- `systemctl is-active UNIT...`: `active`, `inactive` or `failed` per unit; exit 0 only when
  all are active (3 otherwise).

Unit files are `/etc/systemd/system/<unit>` with `ExecStart=`, `Restart=`, `RestartSec=`,
`StartLimitBurst=` lines (nothing else is read; ExecStart= is split on blanks, no quoting).
"""

from __future__ import annotations

import time

from .lxclab import Lab, Workload

SYSTEMCTL = r"""#!/bin/sh
# lab stand-in for systemctl: see tests/harness/fakesystemd.py
CG=/sys/fs/cgroup
UNITDIR=/etc/systemd/system
STATE=/run/lab-systemd
mkdir -p "$STATE"
cmd=$1
[ $# -gt 0 ] && shift
[ "$1" = "--" ] && shift

loaded() {
    case "$1" in */*|"") return 1 ;; esac
    [ -f "$UNITDIR/$1" ]
}

start_unit() {
    u=$1
    if ! loaded "$u"; then echo "Failed to start $u: Unit $u not found." >&2; return 5; fi
    r=$(cat "$STATE/$u.runner" 2>/dev/null)
    [ -n "$r" ] && [ -d "/proc/$r" ] && return 0
    rm -f "$STATE/$u.stop"
    mkdir -p "$CG/system.slice/$u"
    setsid /usr/lib/lab-systemd/runner "$u" </dev/null >/dev/null 2>&1 &
    i=0
    while [ ! -s "$STATE/$u.runner" ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i+1)); done
    return 0
}

stop_unit() {
    u=$1
    if ! loaded "$u"; then echo "Failed to stop $u: Unit $u not loaded." >&2; return 5; fi
    touch "$STATE/$u.stop"
    i=0
    while :; do
        procs=$(cat "$CG/system.slice/$u/cgroup.procs" 2>/dev/null)
        r=$(cat "$STATE/$u.runner" 2>/dev/null)
        alive=""
        [ -n "$r" ] && [ -d "/proc/$r" ] && alive=1
        [ -z "$procs" ] && [ -z "$alive" ] && break
        if [ -n "$procs" ]; then
            if [ -e "$CG/system.slice/$u/cgroup.kill" ]; then
                echo 1 > "$CG/system.slice/$u/cgroup.kill"
            else
                for p in $procs; do kill -9 "$p" 2>/dev/null; done
            fi
        fi
        i=$((i+1))
        if [ $i -gt 400 ]; then echo "Job for $u timed out." >&2; return 1; fi
        sleep 0.02
    done
    [ "$(cat "$STATE/$u.state" 2>/dev/null)" = failed ] || echo inactive > "$STATE/$u.state"
    return 0
}

rc=0
case "$cmd" in
    start)
        for u in "$@"; do start_unit "$u" || rc=$?; done ;;
    stop)
        for u in "$@"; do stop_unit "$u" || rc=$?; done ;;
    is-active)
        for u in "$@"; do
            s=$(cat "$STATE/$u.state" 2>/dev/null)
            echo "${s:-inactive}"
            [ "$s" = active ] || rc=3
        done ;;
    *)
        echo "Unknown command verb '$cmd'." >&2; rc=1 ;;
esac
exit $rc
"""

RUNNER = r"""#!/bin/sh
# lab stand-in for PID 1's part in one service (see tests/harness/fakesystemd.py)
u=$1
CG=/sys/fs/cgroup
STATE=/run/lab-systemd
F=/etc/systemd/system/$u
mkdir -p "$CG/init.scope"
echo $$ > "$CG/init.scope/cgroup.procs"
get() { sed -n "s/^$1=//p" "$F" | tail -n 1; }
exec_start=$(get ExecStart)
restart=$(get Restart); [ -n "$restart" ] || restart=no
rsec=$(get RestartSec); [ -n "$rsec" ] || rsec=0
burst=$(get StartLimitBurst); [ -n "$burst" ] || burst=5
echo $$ > "$STATE/$u.runner"
n=0
while [ ! -e "$STATE/$u.stop" ]; do
    n=$((n+1))
    if [ "$burst" -gt 0 ] && [ $n -gt "$burst" ]; then echo failed > "$STATE/$u.state"; break; fi
    echo active > "$STATE/$u.state"
    echo $n > "$STATE/$u.starts"
    sh -c 'echo $$ > "$0/cgroup.procs" && exec $1' "$CG/system.slice/$u" "$exec_start" &
    wait $!
    code=$?
    [ -e "$STATE/$u.stop" ] && break
    case "$restart" in
        always) ;;
        on-failure) if [ $code -eq 0 ]; then echo inactive > "$STATE/$u.state"; break; fi ;;
        *) if [ $code -eq 0 ]; then echo inactive > "$STATE/$u.state"
           else echo failed > "$STATE/$u.state"; fi
           break ;;
    esac
    [ "$rsec" = 0 ] || sleep "$rsec"
done
rm -f "$STATE/$u.runner"
"""


def install_systemd(lab: Lab, vmid: int) -> None:
    """Put the stand-in into the running container, mount its cgroup2 file system and move
    its PID 1 to `init.scope`."""
    root = lab.rootfs(vmid)
    for d in ("usr/bin", "usr/lib/lab-systemd", "etc/systemd/system", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for path, text in ((root / "usr/bin/systemctl", SYSTEMCTL),
                       (root / "usr/lib/lab-systemd/runner", RUNNER)):
        path.write_text(text)
        path.chmod(0o755)
    # systemd mounts cgroup2 at boot (src/shared/mount-setup.c) and moves itself (PID 1)
    # into init.scope; the lab's LXC config mounts no cgroup file system in the container.
    lab.pct("exec", str(vmid), "--", "/bin/sh", "-c",
            "grep -q ' /sys/fs/cgroup cgroup2 ' /proc/self/mounts || "
            "mount -t cgroup2 cgroup2 /sys/fs/cgroup && "
            "mkdir -p /run/lab-systemd /sys/fs/cgroup/init.scope /sys/fs/cgroup/system.slice && "
            "echo 1 > /sys/fs/cgroup/init.scope/cgroup.procs")


def add_unit(lab: Lab, vmid: int, unit: str, name: str, hold: list[str],
             restart: str = "always", restart_sec: float = 0, burst: int = 5,
             gpu_mib: dict[int, int] | None = None, start: bool = True) -> Workload:
    """A service `unit` whose ExecStart= is a holder named `name`; started (and waited for)
    through the stand-in's `systemctl start`. The workload's host_pids() are its live and
    respawned holders."""
    tag, ready = lab.ct_holder(vmid, name)
    argv = [f"/opt/lab/bin/{name}",
            *lab._holder_args(tag, hold, [], False, 0, 0, False, 0, ready)]
    (lab.rootfs(vmid) / "etc/systemd/system" / unit).write_text(
        "[Service]\n"
        f"ExecStart={' '.join(argv)}\n"
        f"Restart={restart}\n"
        f"RestartSec={restart_sec:g}\n"
        f"StartLimitBurst={burst}\n"
    )
    w = Workload(vmid, tag, lab.rootfs(vmid) / ready.lstrip("/"))
    lab.workloads.append(w)
    if start:
        systemctl(lab, vmid, "start", unit)
        lab._wait_ready(w, 1)
        if gpu_mib:
            lab.set_gpu_memory(w, gpu_mib)
    return w


def systemctl(lab: Lab, vmid: int, *args: str, check: bool = True) -> str:
    return lab.pct("exec", str(vmid), "--", "systemctl", *args, check=check).stdout


def state(lab: Lab, vmid: int, unit: str) -> str:
    path = lab.rootfs(vmid) / "run/lab-systemd" / f"{unit}.state"
    try:
        return path.read_text().strip()
    except OSError:
        return "inactive"


def starts(lab: Lab, vmid: int, unit: str) -> int:
    path = lab.rootfs(vmid) / "run/lab-systemd" / f"{unit}.starts"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def unit_pids(lab: Lab, vmid: int, unit: str) -> list[int]:
    procs = lab.cgroup(vmid) / "ns" / "system.slice" / unit / "cgroup.procs"
    try:
        return [int(x) for x in procs.read_text().split()]
    except OSError:
        return []


def wait_for(cond: object, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if callable(cond) and cond():
            return True
        time.sleep(0.02)
    return False
