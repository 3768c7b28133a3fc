"""`pveclean doctor`'s checks (core/doctor.py) on configs read by proxmox/doctorconf.py and
hand-built host facts: each check finds its problem, names the line and says the fix, and
stays quiet on the config that is right."""

from __future__ import annotations

from pveclean.core import doctor
from pveclean.core.doctor import Check, HostFacts, HostGpu, HostNode, LibFile, Userspace, VmRef
from pveclean.core.pci import PciAddress
from pveclean.proxmox import doctorconf

PCI0 = PciAddress.parse("0000:01:00.0")
NODES = (HostNode("nvidia0", 195, 0), HostNode("nvidia1", 195, 1), HostNode("nvidiactl", 195, 255),
         HostNode("nvidia-uvm", 511, 0), HostNode("nvidia-uvm-tools", 511, 1))
MAJORS = frozenset({1, 5, 10, 195, 226, 511})
GOOD = """arch: amd64
hostname: gpu
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 511:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
"""


def host(**kw: object) -> HostFacts:
    base: dict[str, object] = dict(module_version="550.127.05",
                                   module_file="/proc/driver/nvidia/version",
                                   nvml_version="550.127.05", nodes=NODES, char_majors=MAJORS,
                                   gpus=(HostGpu(0, 0, PCI0, True),))
    base.update(kw)
    return HostFacts(**base)  # type: ignore[arg-type]


def checks(text: str, h: HostFacts | None = None, user: Userspace | None = None
           ) -> list[doctor.Finding]:
    return doctor.ct_findings(doctorconf.grant_conf(text, 129), h or host(), user)


def test_a_right_config_has_no_finding() -> None:
    assert checks(GOOD, user=Userspace((LibFile("/usr/lib/x/libcuda.so.550.127.05",
                                                "libcuda.so", "550.127.05"),))) == []


def test_the_line_numbers_are_the_files() -> None:
    conf = doctorconf.grant_conf("# c\n" + GOOD.replace("arch: amd64\n", "arch: amd64\n\n"), 1)
    assert [b.line.n for b in conf.binds] == [7, 8, 9]
    assert [r.line.n for r in conf.allows] == [5, 6]


def test_library_version_mismatch_names_file_versions_and_fix() -> None:
    user = Userspace((LibFile("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01",
                              "libnvidia-ml.so", "535.183.01"),))
    [f] = checks(GOOD, user=user)
    assert f.check is Check.LIBRARY_VERSION
    assert "535.183.01" in f.evidence and "550.127.05" in f.evidence
    assert "NVIDIA-Linux-x86_64-550.127.05.run --no-kernel-module" in f.fix


def test_the_module_version_wins_over_nvmls_and_a_host_mismatch_is_said() -> None:
    h = host(nvml_version="535.183.01")
    [f] = doctor.host_findings(h)
    assert f.check is Check.DRIVER_VERSION and f.guest == doctor.HOST
    user = Userspace((LibFile("/l/libcuda.so.535.183.01", "libcuda.so", "535.183.01"),))
    assert [x.check for x in checks(GOOD, h, user)] == [Check.LIBRARY_VERSION]


def test_a_stale_major_is_replaced_by_the_nodes_major() -> None:
    [f] = checks(GOOD.replace("c 511:* rwm", "c 508:* rwm"))
    assert f.check is Check.STALE_MAJOR
    assert f.evidence == "line 4: lxc.cgroup2.devices.allow: c 508:* rwm"
    assert f.fix == "replace line 4 with: lxc.cgroup2.devices.allow: c 511:* rwm"
    assert "/dev/nvidia-uvm is 511" in f.what


def test_a_bind_without_allow_says_the_line_to_add() -> None:
    [f] = checks(GOOD.replace("lxc.cgroup2.devices.allow: c 511:* rwm\n", ""))
    assert f.check is Check.BIND_WITHOUT_ALLOW
    assert f.fix == "add the line: lxc.cgroup2.devices.allow: c 511:* rwm"
    assert "line 6: lxc.mount.entry: /dev/nvidia-uvm" in f.evidence


def test_a_cgroup_v1_rule_allows_nothing_on_cgroup2() -> None:
    got = checks(GOOD.replace("lxc.cgroup2.", "lxc.cgroup."))
    assert [f.check for f in got] == [Check.BIND_WITHOUT_ALLOW] * 2


def test_allow_without_bind() -> None:
    text = "arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
    [f] = checks(text)
    assert f.check is Check.ALLOW_WITHOUT_BIND and "line 2" in f.evidence


def test_a_missing_uvm_node_says_nvidia_modprobe() -> None:
    h = host(nodes=NODES[:3])
    [f] = checks(GOOD, h)
    assert f.check is Check.MISSING_NODE and "nvidia-modprobe -u -c=0" in f.fix
    assert "optional" in f.what


def test_devn_and_mount_entry_for_the_same_node() -> None:
    [f] = checks(GOOD + "dev0: /dev/nvidia0,gid=44\n")
    assert f.check is Check.DUPLICATE_NODE and f.fix == "remove line 8"


def test_a_gpu_granted_and_passed_to_a_vm() -> None:
    h = host(vms=(VmRef(200, "win", PciAddress.parse("01:00")),))  # the whole device
    [f] = checks(GOOD, h)
    assert f.check is Check.VM_CONFLICT and f.vm == 200 and "0000:01:00.0" in f.what


def test_persistence_off_of_a_granted_gpu_only() -> None:
    h = host(gpus=(HostGpu(0, 0, PCI0, False), HostGpu(1, 1, None, False)))
    [f] = checks(GOOD, h)
    assert f.check is Check.PERSISTENCE_OFF and "nvidia-smi -i 0 -pm 1" in f.fix


def test_nodes_bound_from_what_is_no_device() -> None:
    lib = GOOD + "lxc.mount.entry: /usr/lib/x86_64-linux-gnu dev/nvidia1 none bind 0 0\n"
    [f] = checks(lib)
    assert f.check is Check.NOT_A_DEVICE and "/usr/lib/x86_64-linux-gnu" in f.what
    [g] = checks(GOOD + "lxc.mount.entry: /dev dev none bind,create=dir 0 0\n")
    assert g.check is Check.NOT_A_DEVICE and "whole /dev" in g.what


def test_unjudged_userspace_is_said_as_such() -> None:
    [f] = checks(GOOD, user=Userspace(unjudged=("/usr/lib/libcuda.so.5: a symlink",)))
    assert f.check is Check.UNJUDGED


def test_prestart_says_only_what_breaks_the_start() -> None:
    h = host(gpus=(HostGpu(0, 0, PCI0, False),))
    got = checks(GOOD.replace("c 511:* rwm", "c 508:* rwm"), h)
    assert {f.check for f in got} == {Check.STALE_MAJOR, Check.PERSISTENCE_OFF}
    [line] = doctor.prestart_warnings(got)
    assert "508" in line and "fix: replace line 4" in line
