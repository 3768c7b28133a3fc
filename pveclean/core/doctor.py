"""`pveclean doctor`'s checks, pure: why a GPU container will not see its GPU.

Each check reads typed facts gathered elsewhere (the container's config lines with their
numbers: proxmox/doctorconf.py; the host's nodes, majors and driver version:
host/hostfacts.py and host/nvmlfacts.py; the container's NVIDIA userspace, read from the host
side: host/ctfiles.py) and says one Finding per problem: what is wrong, the evidence, and the
exact command or config line that fixes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from pveclean.core.pci import PciAddress

Json = dict[str, object]  # one object of the --json document

NVIDIA_MAJOR = 195
# Linux's dynamic character majors (fs/char_dev.c): where nvidia-uvm's and nvidia-caps' land
DYNAMIC_LOW, DYNAMIC_HIGH = (234, 254), (384, 511)
HOST = "host"  # the id of a finding about the host itself
SYMPTOM = {"libnvidia-ml.so": "nvidia-smi: \"Failed to initialize NVML: Driver/library version "
                              "mismatch\"",
           "libcuda.so": "CUDA: error 803, \"system has unsupported display driver / cuda "
                         "driver combination\""}


class Check(StrEnum):
    LIBRARY_VERSION = "library_version"  # the container's libnvidia-ml/libcuda vs the host's
    DRIVER_VERSION = "driver_version"  # the host's kernel module vs NVML's library
    STALE_MAJOR = "stale_major"  # an allow rule for a major no driver has (any more)
    MISSING_NODE = "missing_node"  # a bound node the host does not have
    BIND_WITHOUT_ALLOW = "bind_without_allow"  # a node bound that the devices cgroup denies
    ALLOW_WITHOUT_BIND = "allow_without_bind"  # NVIDIA majors allowed, no node bound
    DUPLICATE_NODE = "duplicate_node"  # two lines put a node at the same container path
    VM_CONFLICT = "vm_conflict"  # a GPU granted to the container and passed to a VM
    PERSISTENCE_OFF = "persistence_off"  # every NVML init in the container takes seconds
    NOT_A_DEVICE = "not_a_device"  # a node bound from a path that is no device (or all /dev)
    UNJUDGED = "could_not_judge"  # what the container holds could not be read safely


class BindVia(StrEnum):
    MOUNT = "lxc.mount.entry"
    DEV = "devN"


@dataclass(frozen=True)
class ConfLine:
    """One effective config line and its number in the file."""

    n: int
    key: str
    value: str

    def shown(self) -> str:
        return f"line {self.n}: {self.key}: {self.value}"


@dataclass(frozen=True)
class NodeBind:
    """A line that puts an NVIDIA node (or what claims to be one) into the container."""

    line: ConfLine
    source: str  # the host path
    target: str  # the container path
    via: BindVia
    host_node: str | None  # the source as a name under the host's /dev ("nvidia-uvm"), or None
    whole_dev: bool = False  # the host's whole /dev
    optional: bool = False  # a mount entry with `optional`: a missing source is skipped
    name: str = ""  # the target's last component ("nvidia0")


@dataclass(frozen=True)
class AllowRule:
    """A devices cgroup rule that may allow an NVIDIA node."""

    line: ConfLine
    kind: str  # "a", "c", "b"
    major: int | None  # None: '*'
    minor: int | None  # None: '*'

    def covers(self, major: int, minor: int) -> bool:
        return (self.kind in ("a", "c") and self.major in (None, major)
                and self.minor in (None, minor))


@dataclass(frozen=True)
class CtGrantConf:
    """What a container's config says of NVIDIA nodes, line by line."""

    vmid: int
    binds: tuple[NodeBind, ...] = ()
    allows: tuple[AllowRule, ...] = ()
    allow_all: bool = False  # 'a' or 'c *:* rwm'
    every_gpu: bool = False  # LXC's nvidia hook or the whole /dev
    minors: frozenset[int] | None = frozenset()  # host GPUs granted; None: every one
    rootfs: str | None = None  # the config's rootfs: value

    @property
    def grants(self) -> bool:
        return bool(self.binds) or self.every_gpu


@dataclass(frozen=True)
class HostNode:
    name: str  # relative to /dev: "nvidia0", "nvidia-caps/nvidia-cap1"
    major: int
    minor: int


@dataclass(frozen=True)
class HostGpu:
    index: int
    minor: int | None
    pci: PciAddress | None
    persistence: bool | None  # None: NVML did not say


@dataclass(frozen=True)
class VmRef:
    vmid: int
    name: str
    pci: PciAddress


@dataclass(frozen=True)
class HostFacts:
    module_version: str | None  # /proc/driver/nvidia/version's
    module_file: str
    nvml_version: str | None  # nvmlSystemGetDriverVersion
    nodes: tuple[HostNode, ...] = ()
    char_majors: frozenset[int] = frozenset()  # /proc/devices' character majors
    gpus: tuple[HostGpu, ...] = ()
    vms: tuple[VmRef, ...] = ()
    nvml_error: str | None = None

    @property
    def version(self) -> str | None:
        """The version the container's userspace must have: the loaded module's."""
        return self.module_version or self.nvml_version

    def node(self, name: str | None) -> HostNode | None:
        return next((n for n in self.nodes if n.name == name), None)


@dataclass(frozen=True)
class LibFile:
    path: str  # in the container
    library: str  # "libnvidia-ml.so", "libcuda.so"
    version: str


@dataclass(frozen=True)
class Userspace:
    """The container's NVIDIA libraries as read from the host side; `unjudged`: entries that
    could not be judged safely (said, never followed); `why_not`: nothing was read."""

    libs: tuple[LibFile, ...] = ()
    unjudged: tuple[str, ...] = ()
    why_not: str | None = None


@dataclass(frozen=True)
class Finding:
    guest: str  # the container's VMID, "host"
    check: Check
    what: str
    evidence: str
    fix: str
    vm: int | None = None  # the VM a GPU is also passed to

    def as_dict(self) -> Json:
        d: Json = {"id": self.guest, "check": str(self.check), "what": self.what,
                   "evidence": self.evidence, "fix": self.fix}
        if self.vm is not None:
            d["vm"] = self.vm
        return d


@dataclass(frozen=True)
class Diagnosis:
    findings: tuple[Finding, ...] = ()
    looked: tuple[str, ...] = ()  # the guests looked at
    warnings: tuple[str, ...] = ()

    def counts(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for f in self.findings:
            out[f.guest, str(f.check)] = out.get((f.guest, str(f.check)), 0) + 1
        return out

    def as_dict(self) -> Json:
        return {"looked": list(self.looked), "findings": [f.as_dict() for f in self.findings],
                "warnings": list(self.warnings)}


# ---- the host ---------------------------------------------------------------------------------
def host_findings(host: HostFacts) -> list[Finding]:
    """The host's module and NVML disagree: every NVML client fails (a driver upgraded and
    not reloaded)."""
    if host.module_version and host.nvml_version and host.module_version != host.nvml_version:
        return [Finding(HOST, Check.DRIVER_VERSION,
                        "the loaded kernel module is not the NVIDIA library's version",
                        f"{host.module_file}: {host.module_version}; NVML: {host.nvml_version}",
                        "reboot the host (or unload and reload the nvidia modules) so that the "
                        f"{host.nvml_version} module is loaded")]
    return []


# ---- one container ----------------------------------------------------------------------------
def library_findings(ct: str, host: HostFacts, user: Userspace) -> list[Finding]:
    out = [Finding(ct, Check.UNJUDGED, "a file in the container's library directories could "
                   "not be judged", why, "check it by hand; pveclean neither follows nor reads it")
           for why in user.unjudged]
    want = host.version
    if want is None:
        return out
    bad = [lib for lib in user.libs if lib.version != want]
    if any(lib.version == want for lib in user.libs if lib.library == "libnvidia-ml.so"):
        # the right one is there too: an old copy left over is no mismatch of NVML's
        bad = [lib for lib in bad if lib.library != "libnvidia-ml.so"]
    for lib in bad:
        out.append(Finding(ct, Check.LIBRARY_VERSION,
                           f"the container's {lib.library} is not the host driver's version "
                           f"({SYMPTOM.get(lib.library, 'its calls fail')})",
                           f"{lib.path}: {lib.version}; host: {want} ({host.module_file})",
                           f"install the {want} userspace in the container, without its "
                           f"kernel module: sh NVIDIA-Linux-x86_64-{want}.run --no-kernel-module"))
    return out


def _allowed(conf: CtGrantConf, node: HostNode) -> bool:
    return conf.allow_all or any(r.covers(node.major, node.minor) for r in conf.allows)


def _missing(conf: CtGrantConf, host: HostFacts, b: NodeBind) -> list[Finding]:
    if b.host_node is None or host.node(b.host_node) is not None:
        return []
    fix = ("nvidia-modprobe -u -c=0 (it creates /dev/nvidia-uvm and -uvm-tools; run it at "
           "boot, before the container starts)" if b.host_node in ("nvidia-uvm", "nvidia-uvm-tools")
           else f"remove line {b.line.n} or load the driver that makes /dev/{b.host_node}")
    skipped = ("the container starts without it (optional)" if b.optional
               else "the container does not start")
    return [Finding(str(conf.vmid), Check.MISSING_NODE,
                    f"/dev/{b.host_node} does not exist on the host: {skipped}",
                    b.line.shown(), fix)]


def _denied(conf: CtGrantConf, host: HostFacts) -> dict[int, list[NodeBind]]:
    """Major -> the mount entries whose node the devices cgroup denies (a devN node is
    allowed by Proxmox itself)."""
    out: dict[int, list[NodeBind]] = {}
    for b in conf.binds:
        n = host.node(b.host_node)
        if b.via is BindVia.MOUNT and n is not None and n.major >= 0 and not _allowed(conf, n):
            out.setdefault(n.major, []).append(b)
    return out


def _stale(conf: CtGrantConf, host: HostFacts) -> list[AllowRule]:
    """Rules for a dynamic major (where nvidia-uvm and nvidia-caps land) that no character
    driver has now."""
    return [r for r in conf.allows if r.major is not None and r.major not in host.char_majors
            and (DYNAMIC_LOW[0] <= r.major <= DYNAMIC_LOW[1]
                 or DYNAMIC_HIGH[0] <= r.major <= DYNAMIC_HIGH[1])]


def _majors(conf: CtGrantConf, host: HostFacts) -> list[Finding]:
    """A denied node beside a rule for a major no driver has: the major moved (one finding
    per stale rule, with the line that replaces it); a denied node otherwise: one finding per
    major, with the line to add."""
    ct = str(conf.vmid)
    denied = _denied(conf, host)
    stale = _stale(conf, host)
    if stale and denied:
        right = "; ".join(f"{stale[0].line.key}: c {m}:* rwm" for m in sorted(denied))
        names = ", ".join(f"/dev/{b.host_node} is {m}" for m, bs in sorted(denied.items())
                          for b in bs)
        return [Finding(ct, Check.STALE_MAJOR,
                        f"the rule allows major {r.major}, which no driver on this host has: "
                        f"the node it was for moved ({names})", r.line.shown(),
                        f"replace line {r.line.n} with: {right}") for r in stale]
    return [Finding(ct, Check.BIND_WITHOUT_ALLOW,
                    f"{', '.join(b.target for b in bs)} bound but the devices cgroup denies "
                    f"major {m}", "; ".join(b.line.shown() for b in bs),
                    f"add the line: lxc.cgroup2.devices.allow: c {m}:* rwm")
            for m, bs in sorted(denied.items())]


def _duplicates(conf: CtGrantConf) -> list[Finding]:
    seen: dict[str, NodeBind] = {}
    out = []
    for b in conf.binds:
        first = seen.setdefault(b.target, b)
        if first is not b:
            out.append(Finding(str(conf.vmid), Check.DUPLICATE_NODE,
                               f"{b.target} is put in the container twice ({first.via} and "
                               f"{b.via})", f"{first.line.shown()} and {b.line.shown()}",
                               f"remove line {b.line.n}"))
    return out


def _not_devices(conf: CtGrantConf) -> list[Finding]:
    out = []
    for b in conf.binds:
        if b.whole_dev:
            out.append(Finding(str(conf.vmid), Check.NOT_A_DEVICE,
                               "the host's whole /dev is bound: every host device, not a GPU",
                               b.line.shown(), "bind each node instead: lxc.mount.entry: "
                               "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"))
        elif b.host_node is None:
            out.append(Finding(str(conf.vmid), Check.NOT_A_DEVICE,
                               f"{b.target} is bound from {b.source}, which is not a device node",
                               b.line.shown(), f"bind the node: lxc.mount.entry: /dev/"
                               f"{b.name} dev/{b.name} none bind,optional,create=file"))
    return out


def _allow_without_bind(conf: CtGrantConf, host: HostFacts) -> list[Finding]:
    majors = {NVIDIA_MAJOR} | {n.major for n in host.nodes}
    rules = [r for r in conf.allows if r.major in majors]
    if conf.grants or not rules:
        return []
    return [Finding(str(conf.vmid), Check.ALLOW_WITHOUT_BIND,
                    "NVIDIA devices are allowed but no node is bound: the container has no "
                    "/dev/nvidia*", "; ".join(r.line.shown() for r in rules),
                    "add the nodes: lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none "
                    "bind,optional,create=file (and nvidiactl, nvidia-uvm)")]


def _granted(conf: CtGrantConf, host: HostFacts) -> list[HostGpu]:
    if conf.every_gpu or conf.minors is None:
        return list(host.gpus)
    return [g for g in host.gpus if g.minor is not None and g.minor in conf.minors]


def _vm_conflicts(conf: CtGrantConf, host: HostFacts) -> list[Finding]:
    out = []
    for g in _granted(conf, host):
        for vm in host.vms:
            if g.pci is not None and vm.pci.covers(g.pci):
                out.append(Finding(str(conf.vmid), Check.VM_CONFLICT,
                                   f"GPU {g.index} ({g.pci}) is granted to this container and "
                                   f"passed through to VM {vm.vmid} {vm.name}".rstrip(),
                                   f"/dev/nvidia{g.minor}; VM {vm.vmid}'s hostpci names {vm.pci}",
                                   f"give the container another GPU or remove the VM's hostpci "
                                   f"line (qm set {vm.vmid} --delete hostpciN)", vm.vmid))
    return out


def _persistence(conf: CtGrantConf, host: HostFacts) -> list[Finding]:
    return [Finding(str(conf.vmid), Check.PERSISTENCE_OFF,
                    f"GPU {g.index} has persistence mode off: every NVML init in the container "
                    "takes seconds", f"NVML: GPU {g.index} persistence mode Disabled",
                    "systemctl enable --now nvidia-persistenced (or nvidia-smi -i "
                    f"{g.index} -pm 1)")
            for g in _granted(conf, host) if g.persistence is False]


def ct_findings(conf: CtGrantConf, host: HostFacts, user: Userspace | None) -> list[Finding]:
    """Every finding of one container that grants NVIDIA nodes (or allows them)."""
    ct = str(conf.vmid)
    out = [f for b in conf.binds for f in _missing(conf, host, b)]
    out += _majors(conf, host)
    out += _allow_without_bind(conf, host)
    out += _duplicates(conf)
    out += _not_devices(conf)
    out += _vm_conflicts(conf, host)
    out += _persistence(conf, host)
    if user is not None and conf.grants:
        out += library_findings(ct, host, user)
    return out


def prestart_warnings(findings: Iterable[Finding]) -> list[str]:
    """What pre-start says of a container about to start: a library version, a stale major,
    a missing node (one line each)."""
    said = (Check.LIBRARY_VERSION, Check.STALE_MAJOR, Check.MISSING_NODE,
            Check.BIND_WITHOUT_ALLOW)
    return [f"{f.what} ({f.evidence}); fix: {f.fix}" for f in findings if f.check in said]
