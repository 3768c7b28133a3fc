#!/usr/bin/env python3
"""A `pct` stand-in over lxc-*, for the lab. Stdlib only.

It does what Proxmox's pct does for the subcommands pveclean uses, with pct's output
formats and errors (see shared/docs/proxmox-facts.md):
- config lives in <lab>/etc/pve/lxc/<vmid>.conf; `start` turns it into an LXC config
  as pve-container does (classic lxc.* lines verbatim, devN: as nodes made in the
  container's /dev with the same device number);
- hook phases run as Proxmox runs them: `[script, vmid, phase]`, no shell, env cleared to
  PATH=/sbin:/bin:/usr/sbin:/usr/bin LC_ALL=C, stdin a pipe closed at once; pre-start is
  fatal, post-start and pre-stop only warn, post-stop runs from LXC's post-stop hook with
  its output going only to a debug log;
- the config lock (flock, 10 s) is held during start/stop and their hooks, and taken by set.
Usage: pct.py --lab DIR <subcommand> ...
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

HOOK_ENV = {"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"}
NODE = "labnode"


class PctError(Exception):
    def __init__(self, message: str, code: int = 255) -> None:
        super().__init__(message)
        self.code = code


class Lab:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.lxcpath = root / "lxc"
        self.confdir = root / "etc/pve/lxc"
        self.lockdir = root / "run/lock/lxc"
        self.storage = {"local": root / "var/lib/vz"}
        self.devdir = root / "dev"

    def conf_path(self, vmid: str) -> Path:
        return self.confdir / f"{vmid}.conf"

    def read_conf(self, vmid: str) -> list[tuple[str, str]]:
        path = self.conf_path(vmid)
        if not path.exists():
            raise PctError(
                f"Configuration file 'nodes/{NODE}/lxc/{vmid}.conf' does not exist", 255
            )
        lines = []
        for raw in path.read_text().splitlines():
            if raw.startswith("["):
                break
            if not raw.strip() or raw.startswith("#"):
                continue
            k, _, v = raw.partition(":")
            lines.append((k.strip(), v.strip()))
        return lines

    def write_conf(self, vmid: str, lines: list[tuple[str, str]]) -> None:
        path = self.conf_path(vmid)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(f"{k}: {v}\n" for k, v in lines))
        os.replace(tmp, path)

    def lock(self, vmid: str, timeout: float = 10.0) -> int:
        self.lockdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lockdir / f"pve-config-{vmid}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= end:
                    os.close(fd)
                    raise PctError(
                        f"can't lock file '/run/lock/lxc/pve-config-{vmid}.lock' - got timeout"
                    ) from None
                time.sleep(0.05)

    def state(self, vmid: str) -> str:
        res = subprocess.run(
            ["lxc-info", "-P", str(self.lxcpath), "-n", vmid, "-s", "-H"],
            capture_output=True, text=True, check=False,
        )
        return "running" if res.stdout.strip() == "RUNNING" else "stopped"

    def init_pid(self, vmid: str) -> int | None:
        res = subprocess.run(
            ["lxc-info", "-P", str(self.lxcpath), "-n", vmid, "-p", "-H"],
            capture_output=True, text=True, check=False,
        )
        return int(res.stdout) if res.stdout.strip().isdigit() else None

    def resolve_volume(self, volid: str) -> Path:
        storage, _, rest = volid.partition(":")
        if storage not in self.storage or not rest.startswith("snippets/"):
            raise PctError(f"unable to parse volume ID '{volid}'")
        return self.storage[storage] / rest

    def hookscript(self, vmid: str) -> Path | None:
        vol = dict(self.read_conf(vmid)).get("hookscript")
        return self.resolve_volume(vol) if vol else None

    def lxc_config(self, vmid: str) -> str:
        """The LXC config pve-container would write for this .conf (lab subset)."""
        conf = self.read_conf(vmid)
        ct = self.lxcpath / vmid
        lines = [
            f"lxc.rootfs.path = dir:{ct}/rootfs",
            f"lxc.uts.name = {dict(conf).get('hostname', 'ct' + vmid)}",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.signal.halt = SIGUSR1",
            "lxc.autodev = 1",
            "lxc.tty.max = 1",
            "lxc.pty.max = 4",
            f"lxc.cgroup.dir.container = lxc/{vmid}",
            "lxc.cgroup.dir.container.inner = ns",
            f"lxc.cgroup.dir.monitor = lxc.monitor/{vmid}",
            "lxc.mount.auto = cgroup:mixed proc:mixed sys:ro",
            f"lxc.hook.post-stop = {self.root}/bin/pct-poststop",
        ]
        devnodes = []
        for k, v in conf:
            if k.startswith("lxc."):
                # The lab's nodes live under <lab>/dev, not the host's /dev.
                if k == "lxc.mount.entry" and v.startswith("/dev/nvidia"):
                    v = str(self.devdir) + v[len("/dev"):]
                lines.append(f"{k} = {v}")
            elif k.startswith("dev") and k[3:].isdigit():
                src = v.split(",")[0].removeprefix("path=")
                devnodes.append(src)
        if devnodes:
            (ct / "devnodes").write_text(
                "".join(f"{p} {self.devdir / p.removeprefix('/dev/')}\n" for p in devnodes)
            )
            lines.append(f"lxc.hook.autodev = {self.root}/bin/pct-autodev")
        return "\n".join(lines) + "\n"


def run_hook(lab: Lab, vmid: str, phase: str, capture: bool = False) -> tuple[int, str]:
    script = lab.hookscript(vmid)
    if script is None:
        return 0, ""
    if not os.access(script, os.X_OK):
        raise PctError(f"hookscript error for {vmid} on {phase}: script '{script}' "
                       "does not exist or is not executable")
    r, w = os.pipe()
    os.close(w)  # stdin: a pipe closed at once, as PVE::Tools::run_command does
    try:
        proc = subprocess.run(
            [str(script), vmid, phase],
            stdin=r, env=dict(HOOK_ENV), check=False,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            text=True,
        )
    finally:
        os.close(r)
    return proc.returncode, proc.stdout or ""


def hook_phase(lab: Lab, vmid: str, phase: str, fatal: bool) -> None:
    code, _ = run_hook(lab, vmid, phase)
    if code != 0:
        script = lab.hookscript(vmid)
        msg = (f"hookscript error for {vmid} on {phase}: command '{script} {vmid} {phase}' "
               f"failed: exit code {code}")
        if fatal:
            raise PctError(msg)
        print(msg, file=sys.stderr)


def cmd_list(lab: Lab, _args: list[str]) -> None:
    vmids = sorted((p.stem for p in lab.confdir.glob("*.conf")), key=int)
    if not vmids:
        return
    print(f"{'VMID':<10} {'Status':<10} {'Lock':<12} {'Name':<20}")
    for vmid in vmids:
        conf = dict(lab.read_conf(vmid))
        print(f"{vmid:<10} {lab.state(vmid):<10} {conf.get('lock', ''):<12} "
              f"{conf.get('hostname', ''):<20}")


def cmd_status(lab: Lab, args: list[str]) -> None:
    vmid = args[0]
    conf = dict(lab.read_conf(vmid))
    state = lab.state(vmid)
    if "--verbose" not in args:
        print(f"status: {state}")
        return
    info = {"name": conf.get("hostname", ""), "status": state, "type": "lxc", "vmid": vmid,
            "cpus": conf.get("cores", "1"), "maxmem": int(conf.get("memory", "512")) << 20}
    if state == "running":
        pid = lab.init_pid(vmid)
        info["pid"] = pid or ""
    for k in sorted(info):
        print(f"{k}: {info[k]}")


def cmd_config(lab: Lab, args: list[str]) -> None:
    conf = lab.read_conf(args[0])
    plain = sorted((kv for kv in conf if not kv[0].startswith("lxc.")), key=lambda kv: kv[0])
    for k, v in plain + [kv for kv in conf if kv[0].startswith("lxc.")]:
        print(f"{k}: {v}")


def cmd_exec(lab: Lab, args: list[str]) -> None:
    vmid = args[0]
    lab.read_conf(vmid)
    cmd = args[2:] if len(args) > 1 and args[1] == "--" else args[1:]
    if lab.state(vmid) != "running":
        raise PctError(f"container '{vmid}' not running!")
    os.execvp("lxc-attach", ["lxc-attach", "-P", str(lab.lxcpath), "-n", vmid, "--", *cmd])


def cmd_start(lab: Lab, args: list[str]) -> None:
    vmid = args[0]
    lab.read_conf(vmid)
    lock = lab.lock(vmid)
    try:
        if lab.state(vmid) == "running":
            raise PctError(f"CT {vmid} already running")
        hook_phase(lab, vmid, "pre-start", fatal=True)
        (lab.lxcpath / vmid / "config").write_text(lab.lxc_config(vmid))
        res = subprocess.run(["lxc-start", "-P", str(lab.lxcpath), "-n", vmid,
                              "-l", "INFO", "-o", str(lab.lxcpath / vmid / "start.log")],
                             check=False)
        if res.returncode != 0:
            raise PctError(f"startup for container '{vmid}' failed")
        hook_phase(lab, vmid, "post-start", fatal=False)
    finally:
        os.close(lock)


def _stop(lab: Lab, vmid: str, lxc_args: list[str]) -> None:
    lab.read_conf(vmid)
    lock = lab.lock(vmid)
    try:
        if lab.state(vmid) != "running":
            raise PctError(f"CT {vmid} not running")
        hook_phase(lab, vmid, "pre-stop", fatal=False)
        subprocess.run(["lxc-stop", "-P", str(lab.lxcpath), "-n", vmid, *lxc_args], check=False)
    finally:
        os.close(lock)


def cmd_stop(lab: Lab, args: list[str]) -> None:
    _stop(lab, args[0], ["--kill"])


def cmd_shutdown(lab: Lab, args: list[str]) -> None:
    timeout = "60"
    if "--timeout" in args:
        timeout = args[args.index("--timeout") + 1]
    _stop(lab, args[0], ["--timeout", timeout])


def cmd_set(lab: Lab, args: list[str]) -> None:
    vmid = args[0]
    conf = lab.read_conf(vmid)
    lock = lab.lock(vmid)
    try:
        held = dict(conf).get("lock")
        if held:  # PVE::AbstractConfig::check_lock
            raise PctError(f"CT is locked ({held})")
        if "--hookscript" in args:
            volid = args[args.index("--hookscript") + 1]
            path = lab.resolve_volume(volid)
            if not path.is_file():
                raise PctError(f"volume '{volid}' does not exist")
            if not os.access(path, os.X_OK):
                raise PctError(f"script '{volid}' is not executable")
            conf = [kv for kv in conf if kv[0] != "hookscript"] + [("hookscript", volid)]
        if "--delete" in args:
            keys = args[args.index("--delete") + 1].split(",")
            conf = [kv for kv in conf if kv[0] not in keys]
        lab.write_conf(vmid, conf)
    finally:
        os.close(lock)


def poststop(lab: Lab) -> None:
    """Called by LXC (lxc.hook.post-stop) like lxc-pve-poststop-hook: output only to a log."""
    vmid = os.environ.get("LXC_NAME", "")
    if not vmid:
        return
    code, out = run_hook(lab, vmid, "post-stop", capture=True)
    log = lab.root / "log"
    log.mkdir(exist_ok=True)
    with open(log / f"poststop-{vmid}.log", "a") as fh:
        fh.write(f"exit {code}\n{out}")


def autodev(lab: Lab) -> None:
    """Like pve-container's devN: handling: mknod in the container's /dev, same numbers."""
    vmid = os.environ.get("LXC_NAME", "")
    rootfs = os.environ.get("LXC_ROOTFS_MOUNT", "")
    spec = lab.lxcpath / vmid / "devnodes"
    for line in spec.read_text().splitlines():
        ct_path, host_path = line.split()
        st = os.stat(host_path)
        target = Path(rootfs) / ct_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, 0o666 | 0o020000, st.st_rdev)


COMMANDS = {
    "list": cmd_list, "status": cmd_status, "config": cmd_config, "exec": cmd_exec,
    "start": cmd_start, "stop": cmd_stop, "shutdown": cmd_shutdown, "set": cmd_set,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--lab":
        print("usage: pct.py --lab DIR <command> ...", file=sys.stderr)
        return 255
    lab = Lab(Path(argv[1]))
    rest = argv[2:]
    try:
        if rest and rest[0] == "_poststop":
            poststop(lab)
            return 0
        if rest and rest[0] == "_autodev":
            autodev(lab)
            return 0
        if not rest or rest[0] not in COMMANDS:
            print(f"ERROR: unknown command 'pct {' '.join(rest)}'", file=sys.stderr)
            return 255
        if rest[0] != "list" and (len(rest) < 2 or not rest[1].isdigit()):
            print("400 not enough arguments\npct " + rest[0] + " <vmid>", file=sys.stderr)
            return 255
        COMMANDS[rest[0]](lab, rest[1:])
        return 0
    except PctError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
