"""The lab: real LXC containers laid out as Proxmox lays them out, fake GPU nodes that are real
character devices, static holder programs, a fake NVML and a `pct` stand-in.

Everything lives under one temporary root and is torn down by `Lab.destroy()`. Nothing is
installed into system paths. It refuses to run on a real Proxmox host.
Used by the tests, `make demo` and `make bench`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .fakenvml import FakeNvml
from .holder import build_programs

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD = HERE / "build"
PCT_PY = HERE / "pct.py"

# GPU node name -> candidate device numbers: real drivers whose nodes open without hardware
# and that nothing on a normal host keeps open (a number some process holds is skipped, so
# labs running at once take different ones: each needs five). nvidia-uvm gets /dev/zero's
# number because that driver supports a private mmap, so "holds only a mapping" can be tested.
GPU_NODES = ["nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"]
CANDIDATES = [(1, 7), (10, 229), (10, 237), (10, 234), (10, 200), (10, 232), (10, 236),
              (1, 8), (1, 9), (10, 257), (10, 258), (10, 256), (203, 0), (203, 1), (1, 11)]
MAPPABLE = (1, 5)

ALL_APPLETS = None  # None = every applet busybox has
MINIMAL_APPLETS = ["sh", "ls", "cat", "echo", "sleep", "true", "false", "mkdir", "test", "["]


class LabUnavailable(Exception):
    """The lab cannot run here; the message says why (used as a skip reason)."""


PROXMOX_MARKERS = ("etc/pve", "usr/bin/pveversion", "usr/share/perl5/PVE")


def is_proxmox_host(root: Path = Path("/")) -> bool:
    return any((root / p).exists() for p in PROXMOX_MARKERS)


def lab_unavailable_reason() -> str | None:
    if is_proxmox_host():
        return "this is a real Proxmox VE host: the lab refuses to run here"
    if os.geteuid() != 0:
        return "the lab needs root (real LXC containers, mknod, cgroups)"
    for tool in ("lxc-start", "lxc-attach", "lxc-stop", "lxc-info"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install lxc; `make test` does it as root)"
    if not Path("/bin/busybox").exists():
        return "/bin/busybox not found (apt-get install busybox-static)"
    return None


def cgroup2_root() -> Path:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    raise LabUnavailable("no cgroup v2 mount")


def cgroup_hierarchies() -> list[Path]:
    roots = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] in ("cgroup", "cgroup2"):
            roots.append(Path(parts[1]))
    return roots


def v1_freezer_root() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2] == "cgroup" and "freezer" in parts[3].split(","):
            return Path(parts[1])
    return None


def _held_rdevs() -> set[int]:
    """Device numbers some process on this host has open right now."""
    held: set[int] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    if stat.S_ISCHR(st.st_mode):
                        held.add(st.st_rdev)
    return held


@dataclass
class Workload:
    """Processes started by one holder command (parent, children, respawns)."""

    vmid: int | None
    tag: str
    ready_file: Path
    popen: subprocess.Popen[bytes] | None = None

    def host_pids(self, lab: Lab) -> list[int]:
        # The whole --ready argument, NUL-terminated: "ready-host-1" alone also matches
        # ready-host-10 and another lab's ready-host-1 on the same host.
        arg = str(self.ready_file) if self.vmid is None else f"/tmp/ready-{self.tag}"
        needle = b"\0" + arg.encode() + b"\0"
        pids = []
        for pid in lab.all_pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if needle in cmd and not cmd.startswith(b"lxc-attach"):
                pids.append(pid)
        return sorted(pids)


@dataclass
class Lab:
    root: Path
    nodes: dict[str, Path] = field(default_factory=dict)
    nvml: FakeNvml | None = None
    holder_bin: Path | None = None
    programs: dict[str, Path] = field(default_factory=dict)  # holder/*.c, in every container
    containers: list[int] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    v1_freezers: list[Path] = field(default_factory=list)
    _counter: int = 0

    # ---- set-up -------------------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, gpus: int = 4) -> Lab:
        reason = lab_unavailable_reason()
        if reason:
            raise LabUnavailable(reason)
        root.mkdir(parents=True, exist_ok=True)
        lab = cls(root)
        try:
            lab._set_up(gpus)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)  # a half-built lab leaves nothing behind
            raise
        return lab

    def _set_up(self, gpus: int) -> None:
        root = self.root
        for d in ("lxc", "etc/pve/lxc", "dev", "bin", "var/lib/vz/snippets", "reports", "log"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "etc/pve/storage.cfg").write_text(
            "dir: local\n\tpath " + str(root / "var/lib/vz") + "\n\tcontent iso,vztmpl,backup\n"
        )
        BUILD.mkdir(exist_ok=True)
        self.programs = build_programs(BUILD)
        self.holder_bin = self.programs["holder"]
        nvml_dir = root / "nvml"
        self.nvml = FakeNvml(nvml_dir)
        shutil.copy2(FakeNvml(BUILD / "nvml").build(), self.nvml.lib_path)
        for i in range(gpus):
            self.nvml.add_gpu(i, total_mib=81559, reserved_mib=512)
        self._make_nodes()
        self._write_bin()
        self.write_config()

    def _make_nodes(self) -> None:
        held = _held_rdevs()
        plain = [n for n in GPU_NODES if n != "nvidia-uvm"]
        candidates = [c for c in CANDIDATES if os.makedev(*c) not in held]
        for name in [*plain, "nvidia-uvm"]:
            pool = [MAPPABLE] if name == "nvidia-uvm" else candidates
            while pool:
                major, minor = pool.pop(0)
                path = self.root / "dev" / name
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                os.chmod(path, 0o666)
                try:
                    os.close(os.open(path, os.O_RDWR))
                except OSError:
                    continue  # no driver behind this number here: try the next one
                self.nodes[name] = path
                break
            else:
                raise LabUnavailable(f"no unused, openable character device number left for "
                                     f"the fake {name} (another lab running?)")

    def _write_bin(self) -> None:
        py = sys.executable
        scripts = {
            "pct": f'#!/bin/sh\nexec "{py}" "{PCT_PY}" --lab "{self.root}" "$@"\n',
            "pct-poststop": f'#!/bin/sh\nexec "{py}" "{PCT_PY}" --lab "{self.root}" _poststop\n',
            "pct-autodev": f'#!/bin/sh\nexec "{py}" "{PCT_PY}" --lab "{self.root}" _autodev\n',
        }
        for name, text in scripts.items():
            p = self.root / "bin" / name
            p.write_text(text)
            p.chmod(0o755)

    def set_pct_latency(self, seconds: float) -> None:
        """Model Proxmox's pct, a Perl program that compiles the PVE module stack on every
        call (about 0.5 s): `pct` sleeps this long before it does anything."""
        py = sys.executable
        pause = f"sleep {seconds:.3f}\n" if seconds > 0 else ""
        self.pct_path.write_text(f'#!/bin/sh\n{pause}exec "{py}" "{PCT_PY}" --lab "{self.root}" '
                                 '"$@"\n')
        self.pct_path.chmod(0o755)

    @property
    def pct_path(self) -> Path:
        return self.root / "bin" / "pct"

    @property
    def config_path(self) -> Path:
        return self.root / "pveclean.yaml"

    @property
    def report_dir(self) -> Path:
        return self.root / "reports"

    @property
    def snippets(self) -> Path:
        return self.root / "var/lib/vz/snippets"

    def write_config(self, **overrides: object) -> Path:
        import yaml

        assert self.nvml is not None
        cfg: dict[str, object] = {
            "devices": [str(self.root / "dev" / "nvidia*")],
            "report_dir": str(self.report_dir),
            "state_dir": str(self.root / "state"),
            "grace_seconds": 2,
            "deadline_seconds": 10,
            "pct_command": str(self.pct_path),
            "pve_config_dir": str(self.root / "etc/pve/lxc"),
            "nvml_library": str(self.nvml.lib_path),
            "syslog": False,
        }
        cfg.update(overrides)
        self.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.config_path.chmod(0o644)
        return self.config_path

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PVECLEAN_CONFIG"] = str(self.config_path)
        return env

    # ---- containers ---------------------------------------------------------------------
    def create_ct(
        self,
        vmid: int,
        gpus: tuple[int, ...] = (0, 1, 2, 3),
        style: str = "classic",
        applets: list[str] | None = ALL_APPLETS,
        start: bool = True,
        extra: list[tuple[str, str]] | None = None,
    ) -> int:
        if cgroup2_root().joinpath("lxc", str(vmid)).exists():
            raise LabUnavailable(f"cgroup lxc/{vmid} already exists on this host")
        ct = self.root / "lxc" / str(vmid)
        rootfs = ct / "rootfs"
        for d in ("bin", "sbin", "etc", "proc", "sys", "dev", "tmp", "opt/lab/bin", "root"):
            (rootfs / d).mkdir(parents=True, exist_ok=True)
        shutil.copy2("/bin/busybox", rootfs / "bin/busybox")
        names = applets
        if names is None:
            out = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True,
                                 check=True).stdout
            names = out.split()
        for applet in names:
            if applet != "busybox":
                with contextlib.suppress(FileExistsError):
                    (rootfs / "bin" / applet).symlink_to("busybox")
        with contextlib.suppress(FileExistsError):
            (rootfs / "sbin/init").symlink_to("/bin/busybox")
        (rootfs / "etc/inittab").write_text("::sysinit:/bin/true\n")
        (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (rootfs / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")
        for name, binary in self.programs.items():  # /opt/lab/bin/holder, and each attack's
            shutil.copy2(binary, rootfs / "opt/lab/bin" / name)
        conf: list[tuple[str, str]] = [
            ("arch", "amd64"),
            ("hostname", f"lab{vmid}"),
            ("memory", "512"),
            ("ostype", "unmanaged"),
            ("rootfs", f"local:{vmid}/rootfs"),
        ]
        node_names = [f"nvidia{g}" for g in gpus] + (["nvidiactl", "nvidia-uvm"] if gpus else [])
        if style == "classic":
            majors = sorted({os.major(os.stat(self.nodes[n]).st_rdev) for n in node_names})
            conf += [("lxc.cgroup2.devices.allow", f"c {m}:* rwm") for m in majors]
            conf += [
                ("lxc.mount.entry", f"/dev/{n} dev/{n} none bind,optional,create=file")
                for n in node_names
            ]
        elif style == "dev":
            conf += [(f"dev{i}", f"/dev/{n},gid=44") for i, n in enumerate(node_names)]
        else:
            raise ValueError(style)
        conf += extra or []
        (self.root / "etc/pve/lxc" / f"{vmid}.conf").write_text(
            "".join(f"{k}: {v}\n" for k, v in conf)
        )
        self.containers.append(vmid)
        if start:
            self.pct("start", str(vmid))
        return vmid

    def pct(self, *args: str, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([str(self.pct_path), *args], capture_output=True, text=True,
                             check=False, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise RuntimeError(f"pct {' '.join(args)} failed ({res.returncode}): {res.stderr}")
        return res

    def rootfs(self, vmid: int) -> Path:
        return self.root / "lxc" / str(vmid) / "rootfs"

    def cgroup(self, vmid: int) -> Path:
        return cgroup2_root() / "lxc" / str(vmid)

    def init_pid(self, vmid: int) -> int | None:
        res = subprocess.run(["lxc-info", "-P", str(self.root / "lxc"), "-n", str(vmid), "-p",
                              "-H"], capture_output=True, text=True, check=False)
        return int(res.stdout) if res.stdout.strip().isdigit() else None

    def tree_pids(self, vmid: int) -> list[int]:
        pids = []
        for dirpath, _d, _f in os.walk(self.cgroup(vmid)):
            with contextlib.suppress(OSError):
                pids += [int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()]
        return sorted(pids)

    @staticmethod
    def all_pids() -> list[int]:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]

    # ---- workloads ----------------------------------------------------------------------
    def _holder_args(self, tag: str, hold: list[str], maps: list[str], ignore_term: bool,
                     children: int, respawn: int, pidns: bool, term_delay_ms: int,
                     ready: str) -> list[str]:
        args: list[str] = []
        for h in hold:
            args += ["--hold", h]
        for m in maps:
            args += ["--map", m]
        if ignore_term:
            args.append("--ignore-term")
        if children:
            args += ["--children", str(children)]
        if respawn:
            args += ["--respawn", str(respawn)]
        if pidns:
            args.append("--pidns")
        if term_delay_ms:
            args += ["--term-delay", str(term_delay_ms)]
        return [*args, "--ready", ready, "--exit-after", "900"]

    def ct_holder(self, vmid: int, name: str, kind: str = "") -> tuple[str, str]:
        """A fresh workload tag, the holder program linked as `name` in the container's
        /opt/lab/bin, and the ready file it will write (as the container sees it)."""
        self._counter += 1
        tag = f"{vmid}-{kind}{self._counter}"
        link = self.rootfs(vmid) / "opt/lab/bin" / name
        if not link.exists():
            link.symlink_to("holder")
        return tag, f"/tmp/ready-{tag}"

    def run_in_ct(
        self,
        vmid: int,
        name: str,
        hold: list[str] = (),  # type: ignore[assignment]
        maps: list[str] = (),  # type: ignore[assignment]
        ignore_term: bool = False,
        children: int = 0,
        respawn: int = 0,
        pidns: bool = False,
        term_delay_ms: int = 0,
        cgroup: str | None = None,
        gpu_mib: dict[int, int] | None = None,
        extra_args: list[str] = (),  # type: ignore[assignment]
        wait: int = 1,
    ) -> Workload:
        """Start a holder as `name` inside the container, detached (its parent exits, init
        adopts it), optionally moved to another cgroup below ns/, with NVML memory."""
        tag, ready = self.ct_holder(vmid, name)
        argv = [f"/opt/lab/bin/{name}", *self._holder_args(
            tag, list(hold), list(maps), ignore_term, children, respawn, pidns, term_delay_ms,
            ready), "--", *extra_args]
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        self.pct("exec", str(vmid), "--", "/bin/sh", "-c",
                 f"{quoted} </dev/null >/dev/null 2>&1 &")
        w = Workload(vmid, tag, self.rootfs(vmid) / ready.lstrip("/"))
        self.workloads.append(w)
        self._wait_ready(w, wait)
        pids = w.host_pids(self)
        if cgroup:
            target = self.cgroup(vmid) / "ns" / cgroup
            target.mkdir(parents=True, exist_ok=True)
            for pid in pids:
                with contextlib.suppress(OSError):
                    (target / "cgroup.procs").write_text(str(pid))
        if gpu_mib:
            self.set_gpu_memory(w, gpu_mib)
        return w

    def run_program(self, vmid: int, program: str, args: list[str], wait: int = 1
                    ) -> Workload:
        """Start one of the attack programs of holder/ (/opt/lab/bin/<program>) inside the
        container, detached, with `args` and `--ready`; it writes its ready line itself."""
        self._counter += 1
        tag = f"{vmid}-{program}{self._counter}"
        ready = f"/tmp/ready-{tag}"
        argv = [f"/opt/lab/bin/{program}", *args, "--ready", ready]
        quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
        self.pct("exec", str(vmid), "--", "/bin/sh", "-c",
                 f"{quoted} </dev/null >/dev/null 2>&1 &")
        w = Workload(vmid, tag, self.rootfs(vmid) / ready.lstrip("/"))
        self.workloads.append(w)
        self._wait_ready(w, wait)
        return w

    def run_on_host(self, name: str, hold: list[str], gpu_mib: dict[int, int] | None = None,
                    pidns: bool = False, cgroup: Path | None = None,
                    ignore_term: bool = False) -> Workload:
        """A holder outside every container (the host's own GPU user)."""
        self._counter += 1
        tag = f"host-{self.root.name}-{self._counter}"  # unique across labs running at once
        bindir = self.root / "hostbin"
        bindir.mkdir(exist_ok=True)
        link = bindir / name
        if not link.exists():
            assert self.holder_bin is not None
            link.symlink_to(self.holder_bin)
        ready = self.root / f"ready-{tag}"
        argv = [str(link), *self._holder_args(tag, hold, [], ignore_term, 0, 0, pidns, 0,
                                              str(ready))]
        preexec = None
        if cgroup is not None:
            cgroup.mkdir(parents=True, exist_ok=True)
            procs = str(cgroup / "cgroup.procs")

            def move_self() -> None:
                with open(procs, "w") as fh:
                    fh.write(str(os.getpid()))

            # With pidns, only the namespaced processes move (a leftover of a container's
            # run); the host-namespace launcher stays in the host's cgroup.
            preexec = None if pidns else move_self
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=preexec)
        w = Workload(None, tag, ready, popen)
        self.workloads.append(w)
        self._wait_ready(w, 1)
        if cgroup is not None and pidns:
            for pid in w.host_pids(self):
                if pid != popen.pid:
                    (cgroup / "cgroup.procs").write_text(str(pid))
        if gpu_mib:
            self.set_gpu_memory(w, gpu_mib)
        return w

    def set_gpu_memory(self, w: Workload, gpu_mib: dict[int, int]) -> None:
        assert self.nvml is not None
        for pid in w.host_pids(self):
            st = Path(f"/proc/{pid}/status").read_text()
            nspid = next((ln.split()[1:] for ln in st.splitlines() if ln.startswith("NSpid")), [])
            if len(nspid) > 2 and nspid[-1] == "1":
                continue  # a nested namespace's init holds no memory
            for gpu, mib in gpu_mib.items():
                self.nvml.set_process(gpu, pid, mib)

    @staticmethod
    def _wait_ready(w: Workload, lines: int, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                if len(w.ready_file.read_text().splitlines()) >= lines:
                    return
            time.sleep(0.01)
        raise RuntimeError(f"holder {w.tag} did not become ready in {timeout} s")

    def alive(self, pid: int) -> bool:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return text[text.rfind(")") + 2] not in "ZX"

    def freeze(self, path: Path, frozen: bool = True) -> None:
        """cgroup v2 freezer: stops a process, but SIGKILL still ends it."""
        (path / "cgroup.freeze").write_text("1" if frozen else "0")

    def make_unkillable(self, pids: list[int]) -> Path:
        """Freeze with the cgroup v1 freezer, where even SIGKILL waits for the thaw: the
        process shows state D, as a process stuck in a GPU driver call does."""
        root = v1_freezer_root()
        if root is None:
            raise LabUnavailable("no cgroup v1 freezer on this host to make a process unkillable")
        self._counter += 1
        cg = root / f"pveclean-lab-{os.getpid()}-{self._counter}"
        cg.mkdir()
        self.v1_freezers.append(cg)
        for pid in pids:
            (cg / "cgroup.procs").write_text(str(pid))
        (cg / "freezer.state").write_text("FROZEN")
        end = time.monotonic() + 5
        while (cg / "freezer.state").read_text().strip() != "FROZEN":
            if time.monotonic() > end:
                raise RuntimeError("v1 freezer did not freeze")
            time.sleep(0.01)
        return cg

    def thaw(self, cg: Path) -> None:
        (cg / "freezer.state").write_text("THAWED")

    # ---- pveclean -----------------------------------------------------------------------
    def pveclean(self, *args: str, timeout: float = 120,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        exe = Path(sys.executable).parent / "pveclean"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "pveclean"]
        return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout,
                              env=env or self.env(), stdin=subprocess.DEVNULL, check=False)

    def install_hook(self, vmid: int, name: str = "pveclean-hook") -> str:
        """Copy the hookscript into the lab's snippets with the lab's pveclean and config,
        as `pveclean install` does on a host, and register it with the pct stand-in."""
        from pveclean.proxmox.hookscript import stamp

        exe = Path(sys.executable).parent / "pveclean"
        text = stamp((REPO / "hookscripts/pveclean-hook").read_text(), str(exe),
                     str(self.config_path))
        dest = self.snippets / name
        dest.write_text(text)
        dest.chmod(0o755)
        volid = f"local:snippets/{name}"
        self.pct("set", str(vmid), "--hookscript", volid)
        return volid

    # ---- tear-down ----------------------------------------------------------------------
    def destroy(self) -> None:
        for cg in self.v1_freezers:
            with contextlib.suppress(OSError):
                self.thaw(cg)
        for w in self.workloads:
            for pid in w.host_pids(self):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if w.popen is not None:
                with contextlib.suppress(Exception):
                    w.popen.kill()
                    w.popen.wait(5)
        for vmid in self.containers:
            cg = self.cgroup(vmid)
            with contextlib.suppress(OSError):
                self.freeze(cg, False)
            subprocess.run(["lxc-stop", "-P", str(self.root / "lxc"), "-n", str(vmid),
                            "--kill"], capture_output=True, check=False, timeout=30)
            _kill_tree(cg)
            _end_unit(self.root / "run/pve-lab" / f"unit-{vmid}.pid")
            for base in ("pve-container", "pve-container-debug"):  # the stand-in's units
                unit_cg = cgroup2_root() / "pveclean-lab.slice" / f"{base}@{vmid}.service"
                _kill_tree(unit_cg)
                _rm_cgroup(unit_cg)
            for hierarchy in cgroup_hierarchies():  # v2, and v1 ones on hybrid hosts
                _rm_cgroup(hierarchy / "lxc" / str(vmid))
                _rm_cgroup(hierarchy / "lxc.monitor" / str(vmid))
        for cg in self.v1_freezers:
            end = time.monotonic() + 5
            while time.monotonic() < end:
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
        with contextlib.suppress(OSError):  # only when no other lab has a unit in it
            (cgroup2_root() / "pveclean-lab.slice").rmdir()
        shutil.rmtree(self.root, ignore_errors=True)


def _end_unit(pidfile: Path) -> None:
    """The pct stand-in's unit runner (pve-container@<vmid>) ends once lxc-start -F does;
    give it a moment for its ExecStopPost=, then end it."""
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        return
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return
        if b"_unit" not in cmd:
            return  # the PID now belongs to something else
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _kill_tree(cg: Path) -> None:
    for _ in range(50):
        pids = []
        for dirpath, _d, _f in os.walk(cg):
            with contextlib.suppress(OSError):
                pids += [int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()]
        if not pids:
            return
        with contextlib.suppress(OSError):
            (cg / "cgroup.kill").write_text("1")
        time.sleep(0.05)


def _rm_cgroup(cg: Path) -> None:
    if not cg.exists():
        return
    for dirpath, _dirs, _files in sorted(os.walk(cg), key=lambda t: -len(t[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
