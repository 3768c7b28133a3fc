"""proxmox/pveconf: container configs read as Proxmox writes them (GPU lines, fuzzed), which
containers may use GPUs, VMIDs, and where a VMID lives in /etc/pve."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean.errors import ExitCode, PvecleanError
from pveclean.proxmox import gpugrant, pveconf


# ---- parse_config -------------------------------------------------------------------------
def test_sections_after_the_current_config_are_skipped() -> None:
    text = ("hostname: web\ndev0: /dev/nvidia0\n"
            "[snap1]\ndev1: /dev/nvidia1\nhostname: old\n"
            "[pve:pending]\ndev2: /dev/nvidia2\n")
    cfg = pveconf.parse_config(text, 129)
    assert cfg.lines == [("hostname", "web"), ("dev0", "/dev/nvidia0")]
    assert cfg.gpu_paths() == ["/dev/nvidia0"]


def test_pending_section_first_hides_nothing_before_it() -> None:
    cfg = pveconf.parse_config("memory: 512\n[pve:pending]\nmemory: 1024\n", 100)
    assert cfg.get("memory") == "512"


def test_raw_lxc_keys_with_colon_and_equals() -> None:
    text = ("lxc.cgroup2.devices.allow = c 195:* rwm\n"
            "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
            "lxc.cap.drop =\n"
            "lxc.apparmor.profile=unconfined\n")
    cfg = pveconf.parse_config(text, 100)
    assert cfg.lines == [
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"),
        ("lxc.cap.drop", ""),
        ("lxc.apparmor.profile", "unconfined"),
    ]


def test_comments_and_blank_lines_are_skipped() -> None:
    text = "# a comment: with a colon\n\n   \n\t\nhostname:   web   \n#dev0: /dev/nvidia0\n"
    cfg = pveconf.parse_config(text, 100)
    assert cfg.lines == [("hostname", "web")] and cfg.rejected == []


def test_an_indented_line_is_not_applied() -> None:
    """parse_pct_config reads a key from the first column only: Proxmox warns "unable to
    parse config" and applies nothing, so an indented devN gives no device."""
    cfg = pveconf.parse_config("  dev0: /dev/nvidia0\n\tlxc.cgroup2.devices.allow: a\n", 100)
    assert cfg.lines == [] and cfg.gpu_lines() == []
    assert [r.split(":")[0] for r in cfg.rejected] == ["line 1", "line 2"]


def test_value_keeps_its_own_colons() -> None:
    cfg = pveconf.parse_config("hookscript: local:snippets/pveclean-hook\n", 100)
    assert cfg.hookscript == "local:snippets/pveclean-hook"


@pytest.mark.parametrize(("line", "why"), [
    ("Weird Key: value", "unable to parse"),
    ("no separator here", "unable to parse"),
    ("dev0:", "unable to parse"),  # a key needs a value
    ("DEV0: /dev/nvidia0", "unable to parse"),  # keys are lower case
    ("gpu0: /dev/nvidia0", "unknown setting 'gpu0'"),
    ("dev256: /dev/nvidia0", "unknown setting 'dev256'"),  # dev0..dev255
    ("dev01: /dev/nvidia0", "unknown setting 'dev01'"),
    ("lxc.rootfs.path: /x", "auto generated"),
    ("lxc.made.up: 1", "unable to parse config"),
    ("delete: dev0", "only allowed in [pve:pending]"),
    ("[not a section", "unable to parse"),
])
def test_a_line_proxmox_rejects_is_reported_not_used(line: str, why: str) -> None:
    cfg = pveconf.parse_config(f"hostname: a\n{line}\n", 100)
    assert cfg.lines == [("hostname", "a")]
    assert len(cfg.rejected) == 1 and cfg.rejected[0].startswith("line 2: ")
    assert why in cfg.rejected[0]


def test_the_last_occurrence_of_a_key_wins_raw_lxc_keys_all_count() -> None:
    text = ("mp1: a\ndev0: /dev/dri/card0\nlxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind\n"
            "mp1: b\nlxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind\ndev0: /dev/nvidia2\n")
    cfg = pveconf.parse_config(text, 100)
    assert cfg.get("mp1") == "b" and cfg.get("mp2") is None and cfg.hookscript is None
    assert cfg.lines == [("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind"), ("mp1", "b"),
                         ("lxc.mount.entry", "/dev/nvidia1 dev/nvidia1 none bind"),
                         ("dev0", "/dev/nvidia2")]
    assert cfg.gpu().minors == {0, 1, 2}


def test_a_bracket_line_that_is_no_section_does_not_end_the_config() -> None:
    cfg = pveconf.parse_config("[x y]\ndev0: /dev/nvidia0\n[Snap_1]\ndev1: /dev/nvidia1\n", 100)
    assert cfg.gpu_paths() == ["/dev/nvidia0"]


def test_the_pending_section_is_kept_apart() -> None:
    text = "dev0: /dev/nvidia0\n[PVE:pending]\ndev1: /dev/nvidia1\ndelete: dev0\n[snap]\nx: 1\n"
    cfg = pveconf.parse_config(text, 100)
    assert cfg.lines == [("dev0", "/dev/nvidia0")]
    assert cfg.pending == [("dev1", "/dev/nvidia1"), ("delete", "dev0")]


def test_the_vmid_is_kept() -> None:
    assert pveconf.parse_config("", 4242).vmid == 4242


# ---- dev_path -----------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "path"), [
    ("/dev/nvidia0", "/dev/nvidia0"),
    ("/dev/nvidia0,gid=44", "/dev/nvidia0"),
    ("mode=0666,path=/dev/nvidia-uvm", "/dev/nvidia-uvm"),
    ("gid=44, path=/dev/nvidia1 ,uid=0", "/dev/nvidia1"),
    ("/dev/dri/card0,path=/dev/nvidia2", "/dev/nvidia2"),  # path= wins over the bare value
    ("deny-write=1,uid=0", ""),
    ("", ""),
    (" /dev/nvidiactl , mode=0660", "/dev/nvidiactl"),
])
def test_dev_path(value: str, path: str) -> None:
    assert gpugrant.dev_path(value) == path


# ---- is_gpu_line --------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "value", "majors", "gpu"), [
    ("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file", (), True),
    ("lxc.mount.entry", "/dev/nvidia-caps dev/nvidia-caps none bind,create=dir", (), True),
    ("lxc.mount.entry", "/dev/dri dev/dri none bind,optional,create=dir", (), False),
    ("lxc.mount.entry", "/usr/lib/nvidia usr/lib/nvidia none bind", (), False),
    ("lxc.mount.entry", "", (), False),
    ("dev0", "/dev/nvidia0,gid=44", (), True),
    ("dev12", "path=/dev/nvidia-uvm,mode=0666", (), True),
    ("dev1", "/dev/dri/renderD128", (), False),
    ("dev1000", "/dev/nvidia0", (), False),  # devN has at most 3 digits
    ("lxc.cgroup2.devices.allow", "c 195:* rwm", (), True),
    ("lxc.cgroup.devices.allow", "c 195:0 rw", (), True),
    ("lxc.cgroup2.devices.allow", "c 508:* rwm", (), False),
    ("lxc.cgroup2.devices.allow", "c 508:* rwm", (508,), True),
    ("lxc.cgroup2.devices.allow", "c 226:* rwm", (508,), False),
    ("lxc.cgroup2.devices.allow", "b 195:* rwm", (), False),  # a block device
    ("lxc.cgroup2.devices.allow", "c *:* rwm", (), False),  # may_use_gpus, not a GPU line
    ("lxc.cgroup2.devices.allow", "a", (), False),
    ("hostname", "nvidia", (), False),
])
def test_is_gpu_line(key: str, value: str, majors: tuple[int, ...], gpu: bool) -> None:
    assert pveconf.is_gpu_line(key, value, frozenset(majors)) is gpu


# ---- gpu_lines / gpu_paths / may_use_gpus --------------------------------------------------
def test_gpu_lines_are_written_back_as_key_colon_value() -> None:
    cfg = pveconf.parse_config("lxc.cgroup2.devices.allow = c 195:* rwm\nhostname: x\n", 100)
    assert cfg.gpu_lines() == ["lxc.cgroup2.devices.allow: c 195:* rwm"]


def test_gpu_paths_from_mount_entries_are_the_containers_paths() -> None:
    text = ("lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind\n"
            "lxc.mount.entry: /dev/nvidia1 /dev/nvidia1 none bind\n"  # absolute target
            "lxc.mount.entry: /dev/nvidia-uvm gpu/uvm none bind\n"  # renamed target
            "lxc.mount.entry: /dev/nvidiactl\n"  # no target: not a path
            "lxc.mount.entry: /dev/dri dev/dri none bind\n"
            "dev0: path=/dev/nvidia-caps/nvidia-cap1,mode=0600\n"
            "dev1: /dev/dri/card0\n")
    cfg = pveconf.parse_config(text, 100)
    assert cfg.gpu_paths() == ["/dev/nvidia0", "/dev/nvidia1", "/gpu/uvm",
                               "/dev/nvidia-caps/nvidia-cap1"]


@pytest.mark.parametrize(("text", "majors", "may"), [
    ("lxc.cgroup2.devices.allow: c 509:* rwm\n", (509,), True),
    ("lxc.cgroup2.devices.allow: c 509:* rwm\n", (), False),
    ("lxc.cgroup.devices.allow: a\n", (), True),  # cgroup v1 key too
    ("lxc.cgroup2.devices.allow: b *:* rwm\n", (), True),
    ("lxc.cgroup2.devices.allow: * *:* rwm\n", (), True),
    ("lxc.cgroup2.devices.allow: c *:0 rwm\n", (), True),  # 195:0 is /dev/nvidia0
    ("lxc.cgroup2.devices.deny: a\n", (), False),
    ("lxc.cgroup2.devices.allow: abc\n", (), False),
    ("[snap]\nlxc.cgroup2.devices.allow: a\n", (), False),
])
def test_may_use_gpus(text: str, majors: tuple[int, ...], may: bool) -> None:
    assert pveconf.may_use_gpus(pveconf.parse_config(text, 100), frozenset(majors)) is may


# ---- parse_vmid ---------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "vmid"), [
    ("100", 100), (" 129 ", 129), ("999999999", 999_999_999), ("129\n", 129)])
def test_valid_vmids(text: str, vmid: int) -> None:
    assert pveconf.parse_vmid(text) == vmid


@pytest.mark.parametrize("bad", ["²", "١٢٣", "１２３", "+129", "12.0", "0", "00", "0x81", "—"])
def test_vmids_that_int_would_accept_or_that_look_numeric_are_refused(bad: str) -> None:
    with pytest.raises(PvecleanError) as exc:
        pveconf.parse_vmid(bad)
    assert exc.value.exit_code == ExitCode.USAGE
    assert "invalid VMID" in str(exc.value)


def test_out_of_range_vmid_names_the_range() -> None:
    with pytest.raises(PvecleanError, match=r"must be 100\.\.999999999"):
        pveconf.parse_vmid("99")


# ---- where a VMID lives: a fake /etc/pve ---------------------------------------------------
def _pve(tmp_path: Path, here: str = "pve1") -> Path:
    """/etc/pve with nodes/<node>/{lxc,qemu-server} and lxc, qemu-server links to `here`'s."""
    pve = tmp_path / "etc/pve"
    for node in ("pve1", "pve2"):
        for sub in ("lxc", "qemu-server"):
            (pve / "nodes" / node / sub).mkdir(parents=True)
    (pve / "lxc").symlink_to(pve / "nodes" / here / "lxc")
    (pve / "qemu-server").symlink_to(pve / "nodes" / here / "qemu-server")
    return pve


def test_a_local_vm_is_found_without_a_node(tmp_path: Path) -> None:
    pve = _pve(tmp_path)
    (pve / "nodes/pve1/qemu-server/200.conf").write_text("name: vm\n")
    assert pveconf.elsewhere(str(pve / "lxc"), 200) == ("vm", "")
    msg, code = pveconf.not_here(str(pve / "lxc"), 200)
    assert code == ExitCode.USAGE
    assert msg.startswith("VMID 200 is a virtual machine (QEMU), not a container")
    assert "qm stop 200" in msg


def test_a_vm_on_another_node_is_named_with_its_node(tmp_path: Path) -> None:
    pve = _pve(tmp_path)
    (pve / "nodes/pve2/qemu-server/201.conf").write_text("")
    assert pveconf.elsewhere(str(pve / "lxc"), 201) == ("vm", "pve2")
    msg, code = pveconf.not_here(str(pve / "lxc"), 201)
    assert code == ExitCode.USAGE and "(QEMU) on node pve2" in msg


def test_a_container_on_another_node_says_where_to_run(tmp_path: Path) -> None:
    pve = _pve(tmp_path)
    (pve / "nodes/pve2/lxc/300.conf").write_text("hostname: x\n")
    assert pveconf.elsewhere(str(pve / "lxc"), 300) == ("ct", "pve2")
    assert pveconf.not_here(str(pve / "lxc"), 300) == (
        "CT 300 is on node pve2: run 'pveclean ct 300' there", ExitCode.ACCESS)


def test_this_nodes_own_directory_is_not_elsewhere(tmp_path: Path) -> None:
    """nodes/pve1/lxc is /etc/pve/lxc through the link: a config there is not another node's."""
    pve = _pve(tmp_path)
    (pve / "nodes/pve1/lxc/301.conf").write_text("")
    assert pveconf.elsewhere(str(pve / "lxc"), 301) is None


def test_an_unknown_vmid_does_not_exist_on_this_node(tmp_path: Path) -> None:
    pve = _pve(tmp_path)
    msg, code = pveconf.not_here(str(pve / "lxc"), 999)
    assert code == ExitCode.ACCESS
    assert msg == f"CT 999 does not exist on this node (no {pve / 'lxc' / '999.conf'})"


def test_without_a_nodes_directory_nothing_is_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "pve/lxc").mkdir(parents=True)
    assert pveconf.elsewhere(str(tmp_path / "pve/lxc"), 100) is None


def test_read_config_of_another_nodes_container_raises_with_its_exit_code(
        tmp_path: Path) -> None:
    pve = _pve(tmp_path)
    (pve / "nodes/pve2/lxc/300.conf").write_text("")
    with pytest.raises(PvecleanError, match="is on node pve2") as exc:
        pveconf.read_config(str(pve / "lxc"), 300)
    assert exc.value.exit_code == ExitCode.ACCESS


def test_read_config_through_the_symlinked_directory(tmp_path: Path) -> None:
    pve = _pve(tmp_path)
    (pve / "nodes/pve1/lxc/129.conf").write_text("dev0: /dev/nvidia0\n[snap]\ndev1: x\n")
    cfg = pveconf.read_config(str(pve / "lxc"), 129)
    assert cfg.vmid == 129 and cfg.lines == [("dev0", "/dev/nvidia0")]


def test_read_config_undecodable_bytes_are_replaced(tmp_path: Path) -> None:
    (tmp_path / "100.conf").write_bytes(b"hostname: caf\xe9\n")
    assert pveconf.read_config(str(tmp_path), 100).get("hostname") == "caf\ufffd"


def test_w_read_config_returns_the_reason_and_code(tmp_path: Path) -> None:
    got = pveconf.w_read_config(str(tmp_path), 100)
    assert isinstance(got, tuple) and got[1] == ExitCode.ACCESS and "does not exist" in got[0]
    (tmp_path / "100.conf").write_text("hostname: a\n")
    ok = pveconf.w_read_config(str(tmp_path), 100)
    assert isinstance(ok, pveconf.CtConfig) and ok.get("hostname") == "a"


def test_read_config_of_a_directory_is_an_access_error(tmp_path: Path) -> None:
    (tmp_path / "100.conf").mkdir()
    with pytest.raises(PvecleanError, match="cannot read") as exc:
        pveconf.read_config(str(tmp_path), 100)
    assert exc.value.exit_code == ExitCode.ACCESS


def test_list_vmids_sorted_numeric_configs_only(tmp_path: Path) -> None:
    pve = _pve(tmp_path)
    lxc = pve / "nodes/pve1/lxc"
    for name in ("1000.conf", "129.conf", "200.conf", "abc.conf", "129.conf.tmp", "12a.conf"):
        (lxc / name).write_text("")
    (pve / "nodes/pve2/lxc/300.conf").write_text("")  # another node's
    assert pveconf.list_vmids(str(pve / "lxc")) == [129, 200, 1000]


def test_list_vmids_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert pveconf.list_vmids(str(tmp_path / "nope")) == []


def test_container_config_gpu_lines() -> None:
    text = (
        "arch: amd64\nhookscript: local:snippets/pveclean-hook\n"
        "dev0: /dev/nvidia0,gid=44\ndev1: path=/dev/nvidia-uvm,mode=0666\n"
        "dev2: /dev/dri/card0\n"
        "lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 508:* rwm\n"
        "lxc.cgroup2.devices.allow: c 226:* rwm\n"
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file\n"
        "[snap1]\ndev9: /dev/nvidia9\n"
    )
    cfg = pveconf.parse_config(text, 129)
    assert cfg.hookscript == "local:snippets/pveclean-hook"
    assert cfg.gpu_lines(frozenset({508})) == [
        "dev0: /dev/nvidia0,gid=44", "dev1: path=/dev/nvidia-uvm,mode=0666",
        "lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 508:* rwm",
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
    ]
    assert cfg.gpu_paths() == ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia1"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_container_config_parser_never_crashes(text: str) -> None:
    cfg = pveconf.parse_config(text, 100)
    cfg.gpu_lines()
    cfg.gpu_paths()


@pytest.mark.parametrize("bad", ["abc", "", "99", "1000000000", "-5", "0129", "12 3", "1e3"])
def test_bad_vmids(bad: str) -> None:
    with pytest.raises(PvecleanError) as exc:
        pveconf.parse_vmid(bad)
    assert exc.value.exit_code == 2


def _conf(text: str) -> pveconf.CtConfig:
    return pveconf.parse_config(text, 129)


@pytest.mark.parametrize(("text", "may"), [
    ("dev0: /dev/nvidia0,gid=44\n", True),
    ("lxc.cgroup2.devices.allow: c 195:* rwm\n", True),
    ("lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n", True),
    ("lxc.cgroup2.devices.allow: a\n", True),  # every device: it may open GPU nodes
    ("lxc.cgroup2.devices.allow: c *:* rwm\n", True),
    ("lxc.cgroup2.devices.allow: c 10:200 rwm\nhostname: web\n", False),
    ("hostname: web\nmemory: 512\n", False),
])
def test_which_containers_need_a_scan(text: str, may: bool) -> None:
    assert pveconf.may_use_gpus(_conf(text), frozenset()) is may


def test_unapplied_lines_become_at_most_ten_warnings_and_a_count() -> None:
    text = "".join(f"  dev{i}: /dev/nvidia{i}\n" for i in range(12))
    said = pveconf.parse_config(text, 100).unapplied()
    assert len(said) == 11 and said[-1] == "... and 2 more such config lines"
    assert said[0].startswith("CT 100 config line 1: unable to parse: ")
    assert pveconf.parse_config("dev0: /dev/nvidia0\n", 100).unapplied() == []
