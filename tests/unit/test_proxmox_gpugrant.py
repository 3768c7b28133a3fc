"""proxmox/gpugrant: what a config's lines grant of NVIDIA GPUs, read as LXC applies them
(devices.allow rules as device_cgroup_rule_parse reads them, mount entries' host sources,
the whole /dev, LXC's nvidia hook)."""

from __future__ import annotations

import pytest

from pveclean.proxmox import gpugrant, pveconf


@pytest.mark.parametrize(("value", "rule"), [
    ("a", ("a", None, True)),
    ("c 195:* rwm", ("c", 195, True)),
    ("c 195:0 rw", ("c", 195, False)),
    ("c 195:* rwm # Die 195 anpassen", ("c", 195, True)),  # three access chars, then ignored
    ("c 195:* r", ("c", 195, True)),
    ("c 195:* ", ("c", 195, True)),  # no access characters: LXC reads none
    ("a *:* rwm", ("a", None, True)),
    ("b 195:* rwm", ("b", 195, True)),
    ("c *:0 m", ("c", None, False)),
    ("c 195:* rw # comment", None),  # fewer than three, then not the end: EINVAL
    ("c  195:* rwm", None),  # two blanks: LXC reads one, then wants '*' or a digit
    ("c 195 rwm", None),
    ("* *:* rwm", None),
    ("a ", None),  # only exactly "a" is the global rule
    ("x 195:* rwm", None),
    ("", None),
])
def test_allow_rules_are_read_as_lxc_reads_them(value: str, rule: object) -> None:
    assert gpugrant.allow_rule(value) == rule


def _grant(text: str) -> gpugrant.GpuGrant:
    return pveconf.parse_config(text, 100).gpu()


def test_minors_come_from_the_host_source_wherever_the_node_lands() -> None:
    g = _grant("lxc.mount.entry: /dev/nvidia1 nvidia1 none bind,optional,create=file\n"
               "lxc.mount.entry: /dev/nvidia2 /dev/gpu none bind\n"
               "dev0: /dev/nvidia3,gid=44\n"
               "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind\n")
    assert g.minors == {1, 2, 3}
    assert g.nodes == {"/nvidia1", "/dev/gpu", "/dev/nvidia3", "/dev/nvidiactl"}
    assert len(g.lines) == 4


def test_a_node_kept_outside_dev_is_known_by_its_name() -> None:
    g = _grant("lxc.mount.entry: /srv/gpu/nvidia2 dev/nvidia2 none bind,create=file\n"
               "lxc.mount.entry: /srv/gpu/nvidiactl dev/nvidiactl none bind,create=file\n")
    assert g.minors == {2} and g.nodes == {"/dev/nvidia2", "/dev/nvidiactl"}


@pytest.mark.parametrize("line", [
    "lxc.mount.entry: /usr/lib/x86_64-linux-gnu/nvidia usr/lib/x86_64-linux-gnu/nvidia none bind",
    "lxc.mount.entry: /usr/bin/nvidia-smi usr/bin/nvidia-smi none bind,create=file",
    "dev0: /usr/bin/nvidia-smi",
    "lxc.mount.entry: /dev/dri dev/dri none bind,create=dir",
    "lxc.hook.mount: /usr/local/bin/my-nvidia-setup",
    "lxc.hook.pre-start: /usr/share/lxc/hooks/nvidia",  # the nvidia hook works as a mount hook
    "lxc.environment: NVIDIA_VISIBLE_DEVICES=all",
])
def test_libraries_binaries_and_other_nodes_grant_nothing(line: str) -> None:
    g = _grant(line + "\n")
    assert not g.any and g.nodes == set() and g.minors == set()


@pytest.mark.parametrize("line", [
    "lxc.mount.entry: /dev dev none bind,rw,create=dir 0 0",
    "lxc.mount.entry: /dev/ mnt/hostdev none rbind",
    "lxc.hook.mount: /usr/share/lxc/hooks/nvidia",
])
def test_the_whole_dev_and_the_nvidia_hook_grant_every_gpu(line: str) -> None:
    g = _grant("dev0: /dev/nvidia0\n" + line + "\n")
    assert g.any and g.nodes is None and g.minors is None
    assert g.lines == ("dev0: /dev/nvidia0", line)


def test_allow_rules_grant_by_major_and_allow_all_is_apart() -> None:
    g = _grant("lxc.cgroup2.devices.allow: c 195:* rwm # nvidia\n"
               "lxc.cgroup2.devices.allow: c 509:* rwm\n"
               "lxc.cgroup2.devices.allow: c 226:* rwm\n")
    assert g.lines == ("lxc.cgroup2.devices.allow: c 195:* rwm # nvidia",)
    assert pveconf.parse_config("lxc.cgroup2.devices.allow: c 509:* rwm\n", 100).gpu(
        frozenset({509})).any
    by_path = _grant("lxc.cgroup2.devices.allow: /dev/nvidia-uvm rwm\n")  # LXC stat()s it
    assert by_path.lines == ("lxc.cgroup2.devices.allow: /dev/nvidia-uvm rwm",)
    everything = _grant("lxc.cgroup2.devices.allow: a\n")
    assert everything.allow_all and not everything.any


def test_a_mount_entry_without_target_is_said_but_lands_nowhere() -> None:
    g = _grant("lxc.mount.entry: /dev/nvidia0\n")
    assert g.lines == ("lxc.mount.entry: /dev/nvidia0",) and g.nodes == set()


def test_a_vm_config_keeps_its_keys_and_the_last_occurrence() -> None:
    text = ("name: gpu-vm\nhostpci0: 0000:01:00.0,pcie=1\nhostpci0: 0000:02:00.0\n"
            "cpu-model: host\n[PENDING]\nhostpci1: 0000:03:00.0\n")
    cfg = pveconf.parse_vm_config(text, 200)
    assert cfg.get("name") == "gpu-vm" and cfg.get("hostpci0") == "0000:02:00.0"
    assert cfg.get("cpu-model") == "host" and cfg.get("hostpci1") is None
