#!/usr/bin/env python3
"""A `pct` stand-in over lxc-*, for the lab. Stdlib only.

It does what Proxmox's pct does for the subcommands pveclean uses, with pct's output
formats and errors (see shared/docs/proxmox-facts.md). Each behaviour names the Proxmox
function it mirrors (pve-container, pve-guest-common, pve-common, pve-storage):
- config lives in <lab>/etc/pve/lxc/<vmid>.conf; `start` turns it into an LXC config
  as pve-container does (classic lxc.* lines verbatim, devN: as nodes made in the
  container's /dev with the same device number);
- hook phases run as PVE::GuestHelpers::exec_hookscript runs them: `[script, vmid, phase]`
  through PVE::Tools::run_command (no shell, LC_ALL=C, the rest of the environment
  INHERITED, PATH forced by the CLI, stdin a pipe closed at once); the script path is
  resolved on every run (check_hookscript, content-dirs honoured); pre-start is fatal,
  post-start and pre-stop only warn, post-stop runs from LXC's post-stop hook
  (src/lxc-pve-poststop-hook) with its output going only to a debug log;
- the config lock (PVE::AbstractConfig::lock_config -> PVE::Tools::lock_file_full: flock,
  10 s, `trying to acquire lock...` / ` OK` on stderr when contended) is held during
  start/stop and their hooks, in post-stop only when the stop came through vm_stop;
- every start goes through the unit pve-container@<vmid>.service (`_unit`, a small runner
  standing in for systemd): drop-ins' ExecStartPre=, `lxc-start -F`, the stop wrapper,
  ExecStopPost=, and the restart after a reboot from inside the guest.
Usage: pct.py --lab DIR <subcommand> ...
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

# PVE::CLIHandler::run_cli_handler: the pct/pvesh CLIs force this PATH.
CLI_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
# systemd's default PATH for units (pve-container@.service sets no Environment=).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOOK_ENV = {"PATH": CLI_PATH, "LC_ALL": "C"}  # what run_command adds (kept for old callers)
NODE = "labnode"
UNIT = "pve-container@{vmid}.service"


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
        self.devdir = root / "dev"
        self.unitdir = root / "etc/systemd/system"
        self.rundir = root / "run/pve-lab"

    def conf_path(self, vmid: str) -> Path:
        return self.confdir / f"{vmid}.conf"

    def read_sections(self, vmid: str) -> dict[str, list[tuple[str, str]]]:
        """PVE::LXC::Config::parse_pct_config: the main section under "", then `[name]`
        snapshot sections and `[pve:pending]`; raw lxc keys as `lxc.k: v` or `lxc.k = v`."""
        path = self.conf_path(vmid)
        if not path.exists():
            raise PctError(
                f"Configuration file 'nodes/{NODE}/lxc/{vmid}.conf' does not exist", 255
            )
        sections: dict[str, list[tuple[str, str]]] = {"": []}
        cur = sections[""]
        for raw in path.read_text().splitlines():
            if raw.startswith("["):
                cur = sections.setdefault(raw.strip()[1:-1], [])
                continue
            if not raw.strip() or raw.startswith("#"):
                continue
            head = raw.split(":", 1)[0]
            if raw.startswith("lxc.") and "=" in head:  # `lxc.key = value`
                k, _, v = raw.partition("=")
            else:
                k, _, v = raw.partition(":")
            cur.append((k.strip(), v.strip()))
        return sections

    def read_conf(self, vmid: str) -> list[tuple[str, str]]:
        """The current config (what load_config gives; pending changes not applied)."""
        return self.read_sections(vmid)[""]

    def write_conf(self, vmid: str, lines: list[tuple[str, str]]) -> None:
        """PVE::LXC::Config::write_pct_config: the main section rewritten with `:`; the
        sections after it ([snapshot], [pve:pending]) kept."""
        path = self.conf_path(vmid)
        rest = ""
        if path.exists():
            text = path.read_text()
            at = text.find("\n[")
            rest = text[at:] if at >= 0 else ""
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(f"{k}: {v}\n" for k, v in lines) + rest)
        os.replace(tmp, path)

    def lock_file(self, vmid: str) -> Path:
        """PVE::LXC::Config::config_file_lock (in the lab's lock dir)."""
        return self.lockdir / f"pve-config-{vmid}.lock"

    def lock_shown(self, vmid: str) -> str:
        """The lock file's path as Proxmox's messages name it."""
        return f"/run/lock/lxc/pve-config-{vmid}.lock"

    def lock(self, vmid: str, timeout: float = 10.0) -> int:
        """PVE::AbstractConfig::lock_config -> PVE::Tools::lock_file_full($file, 10, ...):
        try a non-blocking flock; if contended, print `trying to acquire lock...` on
        stderr, wait (alarm: 10 s), then print ` OK` and go on, or die `got timeout`."""
        self.lockdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file(vmid), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        sys.stderr.write("trying to acquire lock...\n")
        sys.stderr.flush()
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                sys.stderr.write(" OK\n")
                sys.stderr.flush()
                return fd
            except BlockingIOError:
                if time.monotonic() >= end:
                    os.close(fd)
                    raise PctError(
                        f"can't lock file '{self.lock_shown(vmid)}' - got timeout") from None
                time.sleep(0.05)

    def storage_cfg(self) -> dict[str, dict[str, str]]:
        """PVE::Storage::config (the lab's <lab>/etc/pve/storage.cfg; dir storages)."""
        out: dict[str, dict[str, str]] = {}
        cur: dict[str, str] | None = None
        path = self.root / "etc/pve/storage.cfg"
        for line in path.read_text().splitlines() if path.exists() else []:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0] not in " \t":
                kind, _, sid = line.partition(":")
                cur = out[sid.strip()] = {"type": kind.strip()}
            elif cur is not None:
                key, _, value = line.strip().partition(" ")
                cur[key] = value.strip()
        return out

    def snippets_dir(self, storage: str) -> Path | None:
        """PVE::Storage::Plugin::get_subdir($scfg, 'snippets'): `<path>/snippets`, unless
        the storage sets `content-dirs snippets=<subdir>` (PVE >= 7.3)."""
        scfg = self.storage_cfg().get(storage)
        if scfg is None or not scfg.get("path"):
            return None
        subdir = "snippets"
        for item in scfg.get("content-dirs", "").split(","):
            vtype, _, sub = item.partition("=")
            if vtype.strip() == "snippets" and sub.strip():
                subdir = sub.strip()
        return Path(scfg["path"]) / subdir

    def state(self, vmid: str) -> str:
        """PVE::LXC::check_running: is the container's monitor up (here: lxc-info)."""
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
        """PVE::Storage::path for a snippets volume (parse_volname + get_subdir); resolved
        again on every use, as PVE::GuestHelpers::check_hookscript does."""
        storage, _, rest = volid.partition(":")
        sdir = self.snippets_dir(storage)
        if sdir is None or not rest.startswith("snippets/"):
            raise PctError(f"unable to parse volume ID '{volid}'")
        return sdir / rest.removeprefix("snippets/")

    def hookscript(self, vmid: str) -> Path | None:
        vol = dict(self.read_conf(vmid)).get("hookscript")
        return self.resolve_volume(vol) if vol else None

    def lxc_config(self, vmid: str) -> str:
        """The LXC config PVE::LXC::update_lxc_config would write for this .conf (lab
        subset; the lab's own cgroup and hook paths)."""
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
            "lxc.console.path = none",
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
                # PVE::LXC::Config::parse_device: `path` is the default key, any position
                opts = [o for o in v.split(",") if o]
                src = next((o[5:] for o in opts if o.startswith("path=")),
                           next((o for o in opts if "=" not in o), ""))
                devnodes.append(src)
        if devnodes:
            (ct / "devnodes").write_text(
                "".join(f"{p} {self.devdir / p.removeprefix('/dev/')}\n" for p in devnodes)
            )
            lines.append(f"lxc.hook.autodev = {self.root}/bin/pct-autodev")
        return "\n".join(lines) + "\n"


def task_title(vmid: str, kind: str) -> str:
    """PVE::RESTEnvironment::fork_worker names its worker `task <UPID>` ($0); PVE::UPID
    encodes node, pid, pstart, start time, type, id and user."""
    return (f"task UPID:{NODE}:{os.getpid():08X}:{0:08X}:{int(time.time()):08X}:"
            f"{kind}:{vmid}:root@pam:")


# The worker that runs the hook: a process whose argv[0] is the task's title.
WORKER = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


def run_hook(lab: Lab, vmid: str, phase: str, capture: bool = False,
             task: str | None = None) -> tuple[int, str]:
    """PVE::GuestHelpers::exec_hookscript: check_hookscript (resolve the volume now; -f, -x;
    no owner or mode check), then PVE::Tools::run_command([$script, $vmid, $phase]): no
    shell, no timeout, LC_ALL=C, the rest of the caller's environment inherited. `task`: the
    fork_worker type the phase runs in (the script is then that worker's child)."""
    script = lab.hookscript(vmid)
    if script is None:
        return 0, ""
    if not script.is_file():
        raise PctError(f"hookscript error for {vmid} on {phase}: script "
                       f"'{dict(lab.read_conf(vmid))['hookscript']}' does not exist")
    if not os.access(script, os.X_OK):
        raise PctError(f"hookscript error for {vmid} on {phase}: script "
                       f"'{dict(lab.read_conf(vmid))['hookscript']}' is not executable")
    r, w = os.pipe()
    os.close(w)  # stdin: a pipe closed at once, as PVE::Tools::run_command does
    env = dict(os.environ)
    env["LC_ALL"] = "C"  # PVE::Tools::run_command (PVE::Cmd: local $ENV{LC_ALL} = 'C')
    argv = [str(script), vmid, phase]
    if task is not None:
        argv = [task_title(vmid, task), "-c", WORKER, *argv]
    try:
        proc = subprocess.run(
            argv, executable=sys.executable if task is not None else None,
            stdin=r, env=env, check=False,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            text=True,
        )
    finally:
        os.close(r)
    return proc.returncode, proc.stdout or ""


def hook_phase(lab: Lab, vmid: str, phase: str, fatal: bool, task: str | None = None) -> None:
    """exec_hookscript's error handling: `hookscript error for <vmid> on <phase>: ...`,
    fatal ($stop_on_error) only for pre-start, a warning otherwise."""
    try:
        code, _ = run_hook(lab, vmid, phase, task=task)
    except PctError as exc:
        if fatal:
            raise
        print(str(exc), file=sys.stderr)
        return
    if code != 0:
        script = lab.hookscript(vmid)
        msg = (f"hookscript error for {vmid} on {phase}: command '{script} {vmid} {phase}' "
               f"failed: exit code {code}")
        if fatal:
            raise PctError(msg)
        print(msg, file=sys.stderr)


def cmd_list(lab: Lab, _args: list[str]) -> None:
    """PVE::CLI::pct list: `VMID Status Lock Name` columns, nothing without containers."""
    vmids = sorted((p.stem for p in lab.confdir.glob("*.conf")), key=int)
    if not vmids:
        return
    print(f"{'VMID':<10} {'Status':<10} {'Lock':<12} {'Name':<20}")
    for vmid in vmids:
        conf = dict(lab.read_conf(vmid))
        print(f"{vmid:<10} {lab.state(vmid):<10} {conf.get('lock', ''):<12} "
              f"{conf.get('hostname', ''):<20}")


def cmd_status(lab: Lab, args: list[str]) -> None:
    """PVE::CLI::pct status (PVE::LXC::vmstatus): `status: <state>`; --verbose adds sorted
    `key: value` lines."""
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
    """PVE::CLI::pct config: sorted `key: value` lines, raw lxc.* lines last."""
    conf = lab.read_conf(args[0])
    plain = sorted((kv for kv in conf if not kv[0].startswith("lxc.")), key=lambda kv: kv[0])
    for k, v in plain + [kv for kv in conf if kv[0].startswith("lxc.")]:
        print(f"{k}: {v}")


def cmd_exec(lab: Lab, args: list[str]) -> None:
    """PVE::CLI::pct exec: load_config, check_running, clean_environment, then
    `lxc-attach -n <vmid> --keep-env -- <cmd>` (PVE 8 default: the caller's environment,
    whose PATH the CLI forced to /sbin:/bin:/usr/sbin:/usr/bin, goes into the container)."""
    vmid = args[0]
    lab.read_conf(vmid)
    cmd = args[2:] if len(args) > 1 and args[1] == "--" else args[1:]
    if lab.state(vmid) != "running":
        raise PctError(f"container '{vmid}' not running!")
    for var in ("SSL_CERT_FILE", "SSL_CERT_DIR"):  # clean_environment
        os.environ.pop(var, None)
    os.execvp("lxc-attach", ["lxc-attach", "-P", str(lab.lxcpath), "-n", vmid, "--keep-env",
                             "--", *cmd])


def unit_state(lab: Lab, vmid: str) -> str:
    try:
        return (lab.rundir / f"unit-{vmid}.state").read_text().strip()
    except OSError:
        return "inactive"


def systemctl_start(lab: Lab, vmid: str, timeout: float = 30.0,
                    base: str = "pve-container") -> None:
    """`systemctl start <base>@<vmid>` (PVE::LXC::vm_start: pve-container-debug@ for
    `--debug` or `debug: 1`), then wait for the container as monitor_start does. The lab's
    systemd is the `_unit` runner, detached."""
    lab.rundir.mkdir(parents=True, exist_ok=True)
    (lab.rundir / f"unit-{vmid}.state").write_text("activating\n")
    log = open(lab.lxcpath / vmid / "unit.log", "ab")  # noqa: SIM115 (the child keeps it)
    env = {"PATH": SYSTEMD_PATH}  # a unit gets systemd's environment, not the caller's
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--lab",
                             str(lab.root), "_unit", vmid, base], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, env=env, start_new_session=True)
    log.close()
    (lab.rundir / f"unit-{vmid}.pid").write_text(f"{proc.pid}\n")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if lab.state(vmid) == "running":
            return
        if proc.poll() is not None or unit_state(lab, vmid) == "failed":
            break
        time.sleep(0.02)
    raise PctError(f"startup for container '{vmid}' failed")


def cmd_start(lab: Lab, args: list[str]) -> None:
    """PVE::LXC::vm_start under lock_config: pre-start hook (fatal), update_lxc_config,
    `systemctl start pve-container@<vmid>` (pve-container-debug@ with `--debug` or `debug: 1`
    in the config), post-start hook (a warning only)."""
    vmid = args[0]
    debug = "--debug" in args or dict(lab.read_conf(vmid)).get("debug") in ("1", "yes", "on")
    lock = lab.lock(vmid)
    try:
        _start(lab, vmid, debug, "vzstart")
    finally:
        os.close(lock)


def _start(lab: Lab, vmid: str, debug: bool, task: str) -> None:
    """vm_start's part under the caller's config lock."""
    if lab.state(vmid) == "running":
        raise PctError(f"CT {vmid} already running")
    hook_phase(lab, vmid, "pre-start", fatal=True, task=task)
    (lab.lxcpath / vmid / "config").write_text(lab.lxc_config(vmid))
    stderr_file(lab, vmid).unlink(missing_ok=True)  # systemd does not truncate log files
    try:
        systemctl_start(lab, vmid, base="pve-container-debug" if debug else "pve-container")
    except PctError:
        with contextlib.suppress(OSError):  # vm_start: print_ct_stderr_log
            sys.stderr.write(stderr_file(lab, vmid).read_text(errors="replace"))
        raise
    hook_phase(lab, vmid, "post-start", fatal=False, task=task)


def wait_monitor_gone(lab: Lab, vmid: str, timeout: float = 30.0) -> None:
    """PVE::LXC::vm_stop reads the command socket until the monitor closes it, i.e. until
    LXC's post-stop hook has run. The lab watches the monitor's cgroup empty out."""
    procs = cgroup2_root() / "lxc.monitor" / vmid / "cgroup.procs"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if not procs.read_text().split():
                return
        except OSError:
            return
        time.sleep(0.02)


def _stop(lab: Lab, vmid: str, lxc_args: list[str], task: str,
          timeout: float | None = None, locked: bool = False) -> None:
    """PVE::LXC::vm_stop under lock_config, in a `task` worker: pre-stop hook, lxc-stop (with
    --kill; or --timeout T, and --nokill unless the caller kills after the timeout), then
    wait for the monitor to exit, so post-stop runs while the lock is still held. An lxc-stop
    that fails (the guest did not shut down in time, --nokill): "container did not stop".
    `locked`: the caller holds the config lock (vm_reboot)."""
    lab.read_conf(vmid)
    lock = None if locked else lab.lock(vmid)
    try:
        if lab.state(vmid) != "running":
            raise PctError(f"CT {vmid} not running")
        hook_phase(lab, vmid, "pre-stop", fatal=False, task=task)
        done = subprocess.run(["lxc-stop", "-P", str(lab.lxcpath), "-n", vmid, *lxc_args],
                              check=False, timeout=None if timeout is None else timeout + 5)
        if done.returncode != 0 and "--nokill" in lxc_args:
            raise PctError("container did not stop")
        wait_monitor_gone(lab, vmid)
    finally:
        if lock is not None:
            os.close(lock)


def cmd_stop(lab: Lab, args: list[str]) -> None:
    """PVE::API2::LXC::Status vm_stop: a vzstop task, vm_stop($vmid, 1)."""
    _stop(lab, args[0], ["--kill"], "vzstop")


def cmd_shutdown(lab: Lab, args: list[str]) -> None:
    """PVE::API2::LXC::Status vm_shutdown: a vzshutdown task, vm_stop($vmid, 0, $timeout,
    $forceStop): `lxc-stop --timeout T --nokill` unless --forceStop."""
    timeout = "60"
    if "--timeout" in args:
        timeout = args[args.index("--timeout") + 1]
    force = "--forceStop" in args and args[args.index("--forceStop") + 1] in ("1", "true")
    _stop(lab, args[0], ["--timeout", timeout] + ([] if force else ["--nokill"]),
          "vzshutdown", float(timeout))


def cmd_reboot(lab: Lab, args: list[str]) -> None:
    """PVE::LXC::vm_reboot in a vzreboot task: under one lock_config, vm_stop($vmid, 0,
    $timeout, 1) (killed after the timeout), then vm_start (all four hook phases run)."""
    vmid = args[0]
    lock = lab.lock(vmid)
    try:
        _stop(lab, vmid, ["--timeout", "60"], "vzreboot", 60.0, locked=True)
        wait_unit_inactive(lab, vmid)
        _start(lab, vmid, dict(lab.read_conf(vmid)).get("debug") in ("1", "yes", "on"),
               "vzreboot")
    finally:
        os.close(lock)


def wait_unit_inactive(lab: Lab, vmid: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while unit_state(lab, vmid) not in ("inactive", "failed") and time.monotonic() < end:
        time.sleep(0.02)


def config_digest(lab: Lab, vmid: str) -> str:
    """PVE::LXC::Config::parse_pct_config: the digest is sha1_hex of the raw file."""
    return hashlib.sha1(lab.conf_path(vmid).read_bytes()).hexdigest()


def cmd_set(lab: Lab, args: list[str], digest: str | None = None) -> None:
    """PVE::API2::LXC::Config update_vm: under lock_config, load the config,
    PVE::AbstractConfig::assert_if_modified (a `digest` that is not the file's: "detected
    modified configuration"), check_lock, then for `hookscript`
    PVE::GuestHelpers::check_hookscript (snippets type, -f, -x) and write the config
    (PVE::LXC::Config::write_pct_config)."""
    vmid = args[0]
    lab.read_conf(vmid)  # the config must exist before the lock is taken
    lock = lab.lock(vmid)
    try:
        conf = lab.read_conf(vmid)  # read again under the lock: it may have changed
        if digest and digest != config_digest(lab, vmid):
            raise PctError("detected modified configuration - file changed by other user? "
                           "Try again.")
        held = dict(conf).get("lock")
        if held:  # PVE::AbstractConfig::check_lock
            raise PctError(f"CT is locked ({held})")
        if "--hookscript" in args:
            volid = args[args.index("--hookscript") + 1]
            if not volid.partition(":")[2].startswith("snippets/"):
                raise PctError(f"'{volid}' is not in the snippets directory")
            path = lab.resolve_volume(volid)
            if not path.is_file():
                raise PctError(f"script '{volid}' does not exist")
            if not os.access(path, os.X_OK):
                raise PctError(f"script '{volid}' is not executable")
            conf = [kv for kv in conf if kv[0] != "hookscript"] + [("hookscript", volid)]
        if "--delete" in args:
            keys = args[args.index("--delete") + 1].split(",")
            conf = [kv for kv in conf if kv[0] not in keys]
        lab.write_conf(vmid, conf)
    finally:
        os.close(lock)


def apply_pending(lab: Lab, vmid: str) -> None:
    """lxc-pve-poststop-hook: PVE::LXC::Config::vmconfig_apply_pending before the hookscript's
    post-stop (and before the reboot check): [pve:pending] values replace the current ones,
    its `delete` list removes keys, and the section goes."""
    sections = lab.read_sections(vmid)
    pending = sections.get("pve:pending")
    if not pending:
        return
    current = list(sections[""])  # raw lxc.* keys may repeat
    for k, v in pending:
        if k == "delete":
            continue
        at = [i for i, (key, _) in enumerate(current) if key == k and not k.startswith("lxc.")]
        if at:
            current[at[0]] = (k, v)
        else:
            current.append((k, v))
    gone = {k.strip().lstrip("!") for k in dict(pending).get("delete", "").split(",")}
    text = "".join(f"{k}: {v}\n" for k, v in current if k not in gone)
    for name, lines in sections.items():  # snapshots stay
        if name not in ("", "pve:pending"):
            text += f"\n[{name}]\n" + "".join(f"{k}: {v}\n" for k, v in lines)
    lab.conf_path(vmid).write_text(text)


def poststop(lab: Lab) -> None:
    """LXC's post-stop hook, like src/lxc-pve-poststop-hook: output only to a log. With
    LXC_TARGET=reboot (a reboot from inside the guest) it writes /var/lib/lxc/<vmid>/reboot
    and exits 1 BEFORE exec_hookscript: no post-stop phase; the unit's stop wrapper then
    restarts the unit."""
    vmid = os.environ.get("LXC_NAME", "")
    if not vmid or not lab.conf_path(vmid).exists():
        return
    apply_pending(lab, vmid)
    log = lab.root / "log"
    log.mkdir(exist_ok=True)
    if os.environ.get("LXC_TARGET") == "reboot":
        (lab.lxcpath / vmid / "reboot").write_text("")
        with open(log / f"poststop-{vmid}.log", "a") as fh:
            fh.write("reboot: restart requested, no hookscript\n")
        sys.exit(1)
    code, out = run_hook(lab, vmid, "post-stop", capture=True)
    with open(log / f"poststop-{vmid}.log", "a") as fh:
        fh.write(f"exit {code}\n{out}")


DEFAULT_START_TIMEOUT = 90.0  # systemd's DefaultTimeoutStartSec; the unit sets none
UNIT_STOP_TIMEOUT = 120.0  # src/pve-container@.service: TimeoutStopSec=120s


def _seconds(value: str) -> float:
    """A systemd time span as the drop-ins here write it: `90s`, `90`, `1.5s`, `2min`."""
    v = value.strip()
    if v.endswith("min"):
        return float(v[:-3]) * 60
    return float(v.rstrip("s"))


def dropin_commands(lab: Lab, vmid: str, base: str = "pve-container") -> dict[str, list[str]]:
    """ExecStartPre=/ExecStopPost= (and TimeoutStartSec=/TimeoutStopSec=, as a one-item list)
    of the unit's drop-ins, as systemd reads them: <base>@.service.d/ then
    <base>@<vmid>.service.d/, `*.conf` by name (a same-named file in the instance directory
    wins); an empty assignment clears the list."""
    files: dict[str, Path] = {}
    for d in (lab.unitdir / f"{base}@.service.d", lab.unitdir / f"{base}@{vmid}.service.d"):
        if d.is_dir():
            for f in d.glob("*.conf"):
                files[f.name] = f
    out: dict[str, list[str]] = {"ExecStartPre": [], "ExecStopPost": [],
                                 "TimeoutStartSec": [], "TimeoutStopSec": []}
    for name in sorted(files):
        for line in files[name].read_text().splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and key in out:
                if key.startswith("Timeout"):
                    out[key] = [value.strip()]
                elif value.strip():
                    out[key].append(value.strip().replace("%i", vmid).replace("%%", "%")
                                   .replace("$$", "$"))  # systemd.service: "$$" is "$"
                else:
                    out[key].clear()
    return out


def stderr_file(lab: Lab, vmid: str) -> Path:
    """The unit's StandardError=file:/run/pve/ct-%i.stderr."""
    return lab.root / "run/pve" / f"ct-{vmid}.stderr"


def default_start_timeout(lab: Lab) -> float:
    """systemd's DefaultTimeoutStartSec= (/etc/systemd/system.conf; 90 s unless set)."""
    with contextlib.suppress(OSError, ValueError):
        for line in (lab.root / "etc/systemd/system.conf").read_text().splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and key == "DefaultTimeoutStartSec":
                return _seconds(value)
    return DEFAULT_START_TIMEOUT


def unit_cgroup(vmid: str, base: str = "pve-container") -> Path:
    """The unit's own cgroup, where systemd runs every Exec*= line (a lab slice stands in for
    system.slice, which belongs to this host's own systemd)."""
    return cgroup2_root() / "pveclean-lab.slice" / f"{base}@{vmid}.service"


def _join_cgroup(cg: Path) -> None:
    """In the forked child, before exec: as systemd's exec_child puts it in the unit's cgroup."""
    (cg / "cgroup.procs").write_text("0")


def _cgroup_pids(cg: Path) -> list[int]:
    try:
        return [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def final_sigkill(cg: Path, timeout: float) -> bool:
    """After the last ExecStopPost= line: service_enter_signal(SERVICE_FINAL_SIGTERM) with
    KillMode=mixed signals only the main process (lxc-start, gone by now), so the unit goes on
    to SERVICE_FINAL_SIGKILL: unit_kill_context SIGKILLs every process left in the unit's
    cgroup (cg_kill_recursive) and, on the unified hierarchy, waits for the cgroup to empty,
    up to TimeoutStopSec= (service_dispatch_timer: "Processes still around after final
    SIGKILL. Entering failed mode."). Returns False for that failure. An emptied cgroup is
    removed, as systemd does."""
    t0 = time.monotonic()
    end = t0 + timeout
    left = _cgroup_pids(cg)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while left and time.monotonic() < end:
        time.sleep(0.02)
        left = _cgroup_pids(cg)
    if left:
        print(f"unit: Processes still around after final SIGKILL ({left}). Entering failed "
              f"mode. ({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
        return False
    print(f"unit: cgroup empty after final SIGKILL ({time.monotonic() - t0:.1f} s)",
          file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        cg.rmdir()
    return True


def run_unit_command(cmd: str, env: dict[str, str], lab: Lab, vmid: str,
                     timeout: float, cgroup: Path | None = None) -> bool:
    """One Exec*= line as systemd runs it: stdout to null and stderr to the unit's
    StandardError= file, which systemd opens without truncating it, each opener writing from
    its start (service.c's exec context: O_WRONLY|O_CREAT, no O_APPEND, no O_TRUNC); killed
    when it passes `timeout` (TimeoutStartSec= for ExecStartPre=, TimeoutStopSec= for
    ExecStopPost=: SIGTERM, then SIGKILL), which fails the line. A `-` prefix makes a failure
    count as success (systemd.service). With `cgroup`, the line runs in that cgroup (the
    unit's)."""
    ignore = cmd.startswith("-")
    argv = shlex.split(cmd.lstrip("-@+!:"))
    err = stderr_file(lab, vmid)
    err.parent.mkdir(parents=True, exist_ok=True)
    efd = os.open(err, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        join = None if cgroup is None else (lambda: _join_cgroup(cgroup))
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=efd, env=env, start_new_session=True, preexec_fn=join)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = -1
            print(f"unit: {cmd}: timed out after {timeout:g} s", file=sys.stderr)
    except OSError as exc:
        print(f"unit: {argv[0]}: {exc.strerror}", file=sys.stderr)
        rc = 203  # systemd's EXEC status
    finally:
        os.close(efd)
    print(f"unit: {cmd} -> {rc}", file=sys.stderr, flush=True)
    return rc == 0 or ignore


def unit(lab: Lab, vmid: str, base: str = "pve-container") -> int:
    """pve-container@<vmid>.service (src/pve-container@.service, Type=simple) as systemd
    runs it: ExecStartPre=, ExecStart=/usr/bin/lxc-start -F -n %i; when it exits,
    ExecStop=/usr/share/lxc/pve-container-stop-wrapper %i (with EXIT_CODE=exited), then
    ExecStopPost=. The wrapper restarts the unit when the post-stop hook left the reboot
    file; the restart goes straight to the unit's start again (no vm_start, no hooks). Every
    Exec*= line runs in the unit's cgroup, and after the last ExecStopPost= what is left there
    is SIGKILLed and waited for (final_sigkill): a process that outlives it fails the unit."""
    env = {"PATH": SYSTEMD_PATH, "INVOCATION_ID": os.urandom(16).hex()}
    state = lab.rundir / f"unit-{vmid}.state"
    cg = unit_cgroup(vmid, base)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while lab.conf_path(vmid).exists():
        cg.mkdir(parents=True, exist_ok=True)  # removed by final_sigkill once empty
        cmds = dropin_commands(lab, vmid, base)
        start_t = (_seconds(cmds["TimeoutStartSec"][0]) if cmds["TimeoutStartSec"]
                   else default_start_timeout(lab))
        stop_t = _seconds((cmds["TimeoutStopSec"] or [str(UNIT_STOP_TIMEOUT)])[0])
        state.write_text("activating\n")
        if not all(run_unit_command(c, env, lab, vmid, start_t, cg)
                   for c in cmds["ExecStartPre"]):
            state.write_text("failed\n")
            for c in cmds["ExecStopPost"]:
                run_unit_command(c, {**env, "SERVICE_RESULT": "exit-code"}, lab, vmid, stop_t,
                                 cg)
            final_sigkill(cg, stop_t)
            return 1
        state.write_text("active\n")
        cleanup_cgroups(vmid)
        res = subprocess.run(
            ["lxc-start", "-F", "-P", str(lab.lxcpath), "-n", vmid, "-l", "INFO",
             "-o", str(lab.lxcpath / vmid / "start.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, check=False)
        state.write_text("deactivating\n")
        stop_env = {**env, "SERVICE_RESULT": "success" if res.returncode == 0 else "exit-code",
                    "EXIT_CODE": "exited", "EXIT_STATUS": str(res.returncode)}
        restart = stop_wrapper(lab, vmid, stop_env)
        for c in dropin_commands(lab, vmid, base)["ExecStopPost"]:
            run_unit_command(c, stop_env, lab, vmid, stop_t, cg)
        if not final_sigkill(cg, stop_t):
            state.write_text("failed\n")
            return 1
        if not restart:
            break
        (lab.lxcpath / vmid / "restarts").open("a").write("restart\n")
    state.write_text("inactive\n")
    return 0


def cgroup2_root() -> Path:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    return Path("/sys/fs/cgroup")


def cleanup_cgroups(vmid: str) -> None:
    """lxc-pve-prestart-hook's PVE::LXC::cleanup_cgroups: empty leftover lxc/<vmid> and
    lxc.monitor/<vmid> trees are removed, deepest first; one with a process stays (and the
    start then fails creating the container's cgroup)."""
    root = cgroup2_root()
    for top in (root / "lxc" / vmid, root / "lxc.monitor" / vmid):
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*dirs, top]:
            with contextlib.suppress(OSError):
                d.rmdir()


def stop_wrapper(lab: Lab, vmid: str, env: dict[str, str]) -> bool:
    """src/pve-container-stop-wrapper: if /var/lib/lxc/<vmid>/reboot exists, unlink it and
    `systemctl --no-block restart` the unit (returns True); with EXIT_CODE=exited just exit."""
    try:
        (lab.lxcpath / vmid / "reboot").unlink()
        return True
    except FileNotFoundError:
        return False


def autodev(lab: Lab) -> None:
    """src/lxc-pve-autodev-hook for devN: lines: the node made in the container's /dev with
    the host node's device number (Proxmox bind-mounts it from /var/lib/lxc/<vmid>/passthrough)."""
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
    "reboot": cmd_reboot,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--lab":
        print("usage: pct.py --lab DIR <command> ...", file=sys.stderr)
        return 255
    lab = Lab(Path(argv[1]))
    rest = argv[2:]
    try:
        if rest and rest[0] == "_unit":
            return unit(lab, rest[1], *rest[2:3])
        if rest and rest[0] == "_poststop":
            poststop(lab)
            return 0
        if rest and rest[0] == "_autodev":
            autodev(lab)
            return 0
        os.environ["PATH"] = CLI_PATH  # PVE::CLIHandler::run_cli_handler forces it
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
