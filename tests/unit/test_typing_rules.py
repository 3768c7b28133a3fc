"""Typed all the way (issue 36), checked from pveclean's AST by `make lint`, beside the layers.

1. `dict[str, Any]` (also `Dict`, `Mapping`, `MutableMapping` of `[str, Any]`) only at the
   serialisation edge and in config loading, at most DICT_ANY_CAP in all; a renderer never
   takes one as a parameter.
2. No `.startswith(` `.removeprefix(` `.removesuffix(` `.split(` `.partition(` (nor their `r`
   twins) on text pveclean made itself: only the parsers of outside text (kernel, argv, config
   files, Proxmox's files and API, NVML) named in TEXT_PARSERS take text apart.
3. No function over MAX_FUNCTION_LINES lines, none with more than MAX_PARAMETERS parameters
   (self/cls aside; typer's commands in commands/cli.py aside: each option is a parameter).
4. `Any` in pveclean/ at most ANY_CAP times.

Every limit is in the tables below. The DEBT_* tables are today's breaches, each by its place
("module:function"), while the refactor lands: delete an entry when its place is fixed (a test
below says which entries are paid); add none, unless a place in debt only moved or was
renamed. The scan is tests/typing_counts.py; `python -m tests.typing_counts` prints the counts.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Mapping

import pytest

from tests.typing_counts import Scan, scan_pveclean, scan_source

# ====== THE LIMITS ================================================================================

# --- rule 1: where `dict[str, Any]` may be written, and how often -------------------------------
# Any def of these names is the serialisation edge, wherever it is.
DICT_ANY_EDGE_FUNCTIONS = frozenset({"as_dict", "from_dict", "to_yaml", "to_json"})
# and these places: "module" (all of it) or "module:Class" / "module:function" (and what is
# inside it)
DICT_ANY_EDGE: dict[str, str] = {
    "core.config": "config loading: the YAML file's mapping, validated key by key",
    "host.configfile": "config loading: finding and reading the file",
    "host.reportfiles": "the report files: YAML written, read back by its one from_dict",
    "proxmox.pveapi:config_from_api": "the Proxmox API's JSON answer for a guest config",
}
DICT_ANY_CAP = 15  # occurrences outside the debt places, in all
# modules that render (text, metrics, log lines, the VM guard's decision) from typed records
RENDERERS = ("commands.render", "commands.gpuview", "commands.dryview", "host.notify",
             "core.metrics", "core.metrics_gpus", "core.vmguard")

# --- rule 2: who may take text apart (module:function, a one-line reason each) -------------------
TEXT_PARSERS: dict[str, str] = {
    "commands.conventions:complete_vmids": "shell completion: the partial word, /etc/pve names",
    "commands.conventions:complete_from": "shell completion: the user's partial word",
    "commands.status:_Snippets.warnings": "a Proxmox volume id (storage:volname)",
    "commands.unit:from_argv": "systemd's argv (--config=PATH)",
    "core.config:<module>": "config file values: a path must be absolute",
    "core.config:_api_ok": "config file values: a path must be absolute",
    "commands.reset:parse_gpu": "argv: the GPU as the user names it",
    "commands.xidhook:minor_to_pci": "the driver's /proc/driver/nvidia/gpus/*/information",
    "host.nvmlfacts:driver_gpus": "the driver's /proc/driver/nvidia/gpus/*/information",
    "host.procfs:driver_gpus_info": "the driver's /proc/driver/nvidia/gpus/*/information",
    "core.xid:parse_line": "the NVIDIA driver's Xid line in the kernel log",
    "core.xid:parse_record": "a /dev/kmsg record (the kernel's format)",
    "host.kmsg:_split": "/dev/kmsg records and their continuation lines",
    "core.discovery:protected_name": "the kernel's exe link and its ' (deleted)' suffix",
    "core.gpumap:full_name": "the kernel's comm (cut at 15 bytes) against argv[0]",
    "core.records:DeviceUse.word": "a GPU node's path as the kernel names it (an fd's link, "
                                   "maps, a ring's fdinfo): its first word for a table",
    "core.records:DeviceUse.short": "that word with the kernel's /dev/nvidia name cut off",
    "core.exposition:Family.__post_init__": "exposition format: label names with __ are reserved",
    "core.exposition:parse": "the textfile on disk (node_exporter's), read to carry counters over",
    "core.pci:PciAddress.parse": "a PCI address as hostpci, sysfs, NVML or qemu-server write it",
    "core.vmdevices:node_name": "uname's node name (PVE::INotify::nodename)",
    "core.vmdevices:_props": "a VM config's hostpciN property string",
    "core.vmdevices:parse_hostpci": "a VM config's hostpciN value",
    "core.vmdevices:parse_mappings": "mapping/pci.cfg",
    "core.cgpaths:in_tree": "cgroup paths from /proc: the one test of /lxc/<vmid>",
    "core.units:unit_type": "systemd unit names read from a guest's cgroups",
    "core.units:unit_of": "a guest's cgroup path (systemd's slices and units)",
    "core.units:unit_cgroup": "a guest's cgroup path (systemd's slices and units)",
    "core.units:refusal": "systemd unit names read from a guest's cgroups",
    "host.cgroupfs:parse_mounts": "/proc's mount table",
    "host.cgroupfs:parse_cgroups": "/proc/PID/cgroup",
    "host.cgroupfs:_mount_of": "mount options from /proc's mount table",
    "host.cgroupfs:frozen": "the controllers of a /proc/PID/cgroup line",
    "host.devnodes:safe_fs": "file system type names from mountinfo (fuse.*)",
    "host.devnodes:_FdTable._failed": "a /proc/PID/fd link's text",
    "host.devnodes:_judge_maps": "/proc/PID/maps lines",
    "host.devnodes:nvidia_majors": "/proc/devices",
    "host.fstext:lines": "kernel text read in chunks, cut into lines",
    "host.fstext:parse_mount": "a /proc/PID/mountinfo line",
    "host.fstext:parse_mapping": "a /proc/PID/maps line",
    "host.fstext:parse_fdinfo": "/proc/PID/fdinfo",
    "host.fstext:uring_files": "io_uring's fdinfo (UserFiles)",
    "host.fstext:uring_polls": "io_uring's fdinfo (PollList)",
    "host.freezer_v1:_freezer_path": "/proc/PID/cgroup's v1 controller list (kernel)",
    "host.nvml:pci_id": "NVML's PCI bus id",
    "host.nvml:_describe": "nvidia-ml-py's NVMLError_* class names",
    "host.procfs:parse_stat": "/proc/PID/stat",
    "host.procfs:stat_fields": "/proc/PID/stat (the fields after comm)",
    "host.procfs:parse_status": "/proc/PID/status",
    "host.procfs:exit_look": "/proc/PID/stat (utime, stime) and status (VmRSS, Threads)",
    "host.procfs:status_identity": "/proc/PID/status fields (Uid, NSpid)",
    "host.procfs:parse_cmdline": "/proc/PID/cmdline",
    "host.reportfiles:list_reports": "report file names on disk: the module that names them",
    "host.reportfiles:latest": "report file names on disk: the module that names them",
    "core.reportread:source_of": "a report file on disk (older versions' too): its one reader",
    "host.reportfiles:prune_others": "report file names on disk: the module that names them",
    "host.uring:_judge": "a registered file's path from io_uring's fdinfo",
    "host.uring:_on_host": "a mount's root from mountinfo, below a host mount's root",
    "proxmox.chain:read_record": "the chain record file on disk (its one reader)",
    "proxmox.dropin:installed": "systemd drop-in directory names (pve-container@VMID)",
    "proxmox.gpugrant:dev_path": "a guest config's devN: value",
    "proxmox.gpugrant:_is_nvidia_source": "a device path from a guest config",
    "proxmox.gpugrant:grant": "a guest config's lxc.* values (cgroup rules, mounts, hooks)",
    "proxmox.gpugrant:node_paths": "a guest config's lxc.mount.entry value",
    "proxmox.hookscript:trusted": "a hookscript's #! line",
    "proxmox.hookscript:is_pveclean": "a hookscript volume id from a guest config",
    "proxmox.passthrough:_pci_ids": "a PCI mapping's id list (mapping/pci.cfg)",
    "proxmox.passthrough:hostpci_ids": "a VM config's hostpciN value",
    "proxmox.passthrough:vfio_gpus": "sysfs PCI class text",
    "proxmox.vmtake:reservations": "qemu-server's pci-id-reservations file",
    "proxmox.pct:PctReader._read": "pct exec's output, read in chunks",
    "proxmox.probe:parse_probe": "the in-container probe's output (the guest's text)",
    "proxmox.pveapi:nodename": "uname's node name",
    "proxmox.pveapi:Api._explain": "proxmoxer's error text and the API path it failed on",
    "proxmox.pveapi:Api.storage": "the API's storage content list",
    "proxmox.pveconf:_words": "word lists of Proxmox's config schema",
    "proxmox.pveconf:_known_key": "/etc/pve guest config keys",
    "proxmox.pveconf:_lxc_key_problem": "/etc/pve guest config lxc.* keys",
    "proxmox.pveconf:parse_vmid": "a VMID as given (argv, config, API)",
    "proxmox.pveconf:parse_config": "/etc/pve/lxc/<vmid>.conf",
    "proxmox.pveconf:parse_vm_config": "/etc/pve/qemu-server/<vmid>.conf",
    "proxmox.snippets:parse_volid": "a Proxmox volume id",
    "proxmox.snippets:content_dirs": "storage.cfg's content-dirs",
    "proxmox.snippets:storage_options": "/etc/pve/storage.cfg",
    "proxmox.tasks:parse_upid": "a Proxmox task UPID",
    "proxmox.tasks:running_task": "a task worker's /proc cmdline",
    "host.ctfiles:_Look._entries": "file names in a container's library directory",
    "host.hostfacts:char_majors": "/proc/devices",
    "host.hostfacts:_name": "a device path the config's devices globs found",
    "proxmox.doctorconf:numbered": "/etc/pve/lxc/<vmid>.conf, its lines numbered",
    "proxmox.doctorconf:_host_node": "a device path from a guest config",
    "proxmox.doctorconf:_mount": "a guest config's lxc.mount.entry value",
    "proxmox.ctrootfs:storage_section": "/etc/pve/storage.cfg",
    "proxmox.ctrootfs:volid_of": "a guest config's rootfs value",
    "proxmox.ctrootfs:rootfs_dir": "a Proxmox volume id (storage:volname)",
}

# --- rule 3 -----------------------------------------------------------------------------------
MAX_FUNCTION_LINES = 60  # from the def line to the last, docstring included
MAX_PARAMETERS = 7  # self/cls aside; *args and **kwargs count one each

# --- rule 4 ------------------------------------------------------------------------------------
# after issue 36: nvidia-ml-py's and ctypes' untyped values, config and API loading, pickles
ANY_CAP = 43

# ====== DEBT: today's breaches, by place; delete an entry when its place is fixed ================

# rule 1: `dict[str, Any]` outside the edge (place: occurrences there)
DEBT_DICT_ANY: dict[str, int] = {
}
# rule 1: the edge itself over DICT_ANY_CAP (issue 36 brought it to 5, under the cap)
DEBT_DICT_ANY_OVER_CAP = 0
# rule 1: renderers' `dict[str, Any]` parameters (place: how many of its parameters)
DEBT_RENDERER_PARAMS: dict[str, int] = {
}
# rule 2: text pveclean made, taken apart again (place: calls there)
DEBT_TEXT_CALLS: dict[str, int] = {
}
# rule 3: functions over MAX_FUNCTION_LINES (place: its lines today, the most it may have)
DEBT_LONG_FUNCTIONS: dict[str, int] = {
}
# rule 3: functions over MAX_PARAMETERS (place: its parameters today)
DEBT_WIDE_FUNCTIONS: dict[str, int] = {
}

# ====== THE CHECKS ================================================================================

RULES = "tests/unit/test_typing_rules.py"


def _is_edge(module: str, place: str) -> bool:
    if DICT_ANY_EDGE_FUNCTIONS.intersection(place.split(".")):  # such a def, or one inside it
        return True
    key = f"{module}:{place}"
    return any(module == e or key == e or key.startswith(e + ".") for e in DICT_ANY_EDGE)


def _over(found: Counter[str], allowed: Mapping[str, int]) -> list[str]:
    return sorted(k for k, n in found.items() if n > allowed.get(k, 0))


def _beyond_debt(scan: Scan, debt: Mapping[str, int]) -> int:
    """The `dict[str, Any]` occurrences that no debt entry covers (the edge's, and new ones)."""
    outside = Counter(s.key for s in scan.dict_any if not _is_edge(s.module, s.place))
    return len(scan.dict_any) - sum(min(n, debt.get(k, 0)) for k, n in outside.items())


def dict_any_breaches(scan: Scan, debt: Mapping[str, int] = DEBT_DICT_ANY,
                      cap: int = DICT_ANY_CAP + DEBT_DICT_ANY_OVER_CAP) -> list[str]:
    """Rule 1: each `dict[str, Any]` outside the edge and its debt, and the edge over its cap."""
    outside = [s for s in scan.dict_any if not _is_edge(s.module, s.place)]
    over = set(_over(Counter(s.key for s in outside), debt))
    out = [f"{s.where}: dict[str, Any] in {s.key}, outside the serialisation edge; type it (a "
           f"record, an enum), or if this is the edge, name it in DICT_ANY_EDGE of {RULES}"
           for s in outside if s.key in over]
    counted = _beyond_debt(scan, debt)
    if counted > cap:
        out.append(f"{counted} dict[str, Any] outside the debt places: at most {cap} "
                   f"(DICT_ANY_CAP in {RULES})")
    return out


def renderer_breaches(scan: Scan, debt: Mapping[str, int] = DEBT_RENDERER_PARAMS) -> list[str]:
    """Rule 1: a renderer's parameter annotated with a `dict[str, Any]`."""
    params = [s for s in scan.dict_any_params if s.module in RENDERERS]
    over = set(_over(Counter(s.key for s in params), debt))
    return [f"{s.where}: renderer {s.key} takes {s.what!r} as a dict[str, Any]; a renderer "
            "takes the typed record (as_dict() is for files, JSON and log lines)"
            for s in params if s.key in over]


def text_breaches(scan: Scan, debt: Mapping[str, int] = DEBT_TEXT_CALLS) -> list[str]:
    """Rule 2: a call that takes text apart outside TEXT_PARSERS (and its debt)."""
    calls = [s for s in scan.text_calls if s.key not in TEXT_PARSERS]
    over = set(_over(Counter(s.key for s in calls), debt))
    return [f"{s.where}: .{s.what}( in {s.key}: pveclean does not parse text it made (carry a "
            f"typed value instead); if this parses outside text (kernel, argv, a config file, "
            f"Proxmox), add '{s.key}' with a one-line reason to TEXT_PARSERS in {RULES}"
            for s in calls if s.key in over]


def long_breaches(scan: Scan, debt: Mapping[str, int] = DEBT_LONG_FUNCTIONS) -> list[str]:
    """Rule 3: functions over MAX_FUNCTION_LINES (or over their debt's lines)."""
    return [f"{f.site.where}: {f.site.key} has {f.lines} lines (at most {MAX_FUNCTION_LINES})"
            for f in scan.functions
            if f.lines > max(MAX_FUNCTION_LINES, debt.get(f.site.key, 0))]


def wide_breaches(scan: Scan, debt: Mapping[str, int] = DEBT_WIDE_FUNCTIONS) -> list[str]:
    """Rule 3: functions with more than MAX_PARAMETERS parameters (typer's commands aside)."""
    return [f"{f.site.where}: {f.site.key} takes {f.params} parameters (at most "
            f"{MAX_PARAMETERS}: gather them in a record)"
            for f in scan.functions if not f.is_command
            and f.params > max(MAX_PARAMETERS, debt.get(f.site.key, 0))]


@pytest.fixture(scope="module")
def scan() -> Scan:
    return scan_pveclean()


def _settle(breaches: list[str]) -> None:
    assert not breaches, "\n".join(breaches)


def test_dict_any_only_at_the_serialisation_edge_and_in_config_loading(scan: Scan) -> None:
    _settle(dict_any_breaches(scan))


def test_renderers_take_no_dict_any(scan: Scan) -> None:
    _settle(renderer_breaches(scan))


def test_only_the_parsers_of_outside_text_take_text_apart(scan: Scan) -> None:
    _settle(text_breaches(scan))


def test_no_function_over_60_lines(scan: Scan) -> None:
    _settle(long_breaches(scan))


def test_no_function_with_more_than_7_parameters(scan: Scan) -> None:
    _settle(wide_breaches(scan))


def test_any_is_counted_and_capped(scan: Scan) -> None:
    n = len(scan.any_uses)
    assert n <= ANY_CAP, f"Any is used {n} times in pveclean/: at most {ANY_CAP} (ANY_CAP)"


def test_every_debt_entry_is_a_breach_still(scan: Scan) -> None:
    """As the refactor lands, the paid entries go: the debt only ever shrinks."""
    outside = Counter(s.key for s in scan.dict_any if not _is_edge(s.module, s.place))
    renderer = Counter(s.key for s in scan.dict_any_params if s.module in RENDERERS)
    text = Counter(s.key for s in scan.text_calls if s.key not in TEXT_PARSERS)
    lines = {f.site.key: f.lines for f in scan.functions if f.lines > MAX_FUNCTION_LINES}
    wide = {f.site.key: f.params for f in scan.functions
            if f.params > MAX_PARAMETERS and not f.is_command}
    edge = _beyond_debt(scan, DEBT_DICT_ANY)
    paid = [f"{table}[{key!r}] is {was}, the code has {now}: "
            + ("delete it" if not now else f"lower it to {now}")
            for table, found, debt in (("DEBT_DICT_ANY", outside, DEBT_DICT_ANY),
                                       ("DEBT_RENDERER_PARAMS", renderer, DEBT_RENDERER_PARAMS),
                                       ("DEBT_TEXT_CALLS", text, DEBT_TEXT_CALLS),
                                       ("DEBT_WIDE_FUNCTIONS", wide, DEBT_WIDE_FUNCTIONS))
            for key, was in debt.items() if (now := found.get(key, 0)) < was]
    paid += [f"DEBT_LONG_FUNCTIONS[{key!r}]: no longer over {MAX_FUNCTION_LINES} (delete it)"
             for key in DEBT_LONG_FUNCTIONS if key not in lines]
    if DEBT_DICT_ANY_OVER_CAP and edge < DICT_ANY_CAP + DEBT_DICT_ANY_OVER_CAP:
        paid.append(f"DEBT_DICT_ANY_OVER_CAP is {DEBT_DICT_ANY_OVER_CAP}, {edge} dict[str, Any] "
                    f"outside the debt places now: lower it to {max(0, edge - DICT_ANY_CAP)}")
    assert not paid, f"debt paid: update {RULES}\n" + "\n".join(paid)


def test_every_allowed_place_exists(scan: Scan) -> None:
    """An allow-list entry for a place that is gone is a hole for whatever takes its name."""
    modules = {p.partition(":")[0] for p in scan.places}
    gone = [f"TEXT_PARSERS[{k!r}]" for k in TEXT_PARSERS if k not in scan.places]
    gone += [f"DICT_ANY_EDGE[{k!r}]" for k in DICT_ANY_EDGE
             if k not in scan.places and k not in modules]
    gone += [f"RENDERERS: {m!r}" for m in RENDERERS if m not in modules]
    assert not gone, f"no such place in pveclean/: update {RULES}\n" + "\n".join(gone)


# ====== SELF-TESTS: each check fails on a new breach ============================================


def _scan(module: str, source: str) -> Scan:
    return scan_source(module, textwrap.dedent(source))


@pytest.mark.parametrize("annotation", ["dict[str, Any]", "Mapping[str, Any]",
                                        "typing.Dict[str, typing.Any]", "'dict[str, Any]'",
                                        "list[dict[str, Any]] | None"])
def test_the_renderer_check_fails_on_a_dict_any_parameter(annotation: str) -> None:
    typed = _scan("commands.render", """
        def render_gpu_line(gpu: Gpu, width: int = 80) -> str:
            return ""
    """)
    assert renderer_breaches(typed) == []
    untyped = _scan("commands.render", f"""
        def render_gpu_line(gpu: Gpu, extra: {annotation}) -> str:
            return ""
    """)
    [breach] = renderer_breaches(untyped)
    assert "pveclean/commands/render.py:2" in breach and "'extra'" in breach
    # and so does the whole of rule 1: a renderer is no edge
    assert dict_any_breaches(untyped)


def test_a_renderer_in_debt_may_not_take_one_more() -> None:
    untyped = _scan("commands.render", """
        def render_run(rep: dict[str, Any], more: dict[str, Any]) -> str:
            return ""
    """)
    assert len(renderer_breaches(untyped)) == 2  # debt allows one, both are named
    assert renderer_breaches(untyped, {"commands.render:render_run": 2}) == []


def test_the_edge_may_hold_dict_any_and_is_capped() -> None:
    edge = _scan("core.report", """
        class Report:
            def as_dict(self) -> dict[str, Any]:
                d: dict[str, Any] = {}
                return d
        def build(rep: dict[str, Any]) -> None:
            pass
    """)
    [breach] = dict_any_breaches(edge)
    assert "core.report:build" in breach
    assert dict_any_breaches(edge, {"core.report:build": 1}, cap=2) == []
    assert "at most 1" in dict_any_breaches(edge, {"core.report:build": 1}, cap=1)[0]


def test_the_text_check_fails_outside_the_parsers() -> None:
    made = _scan("host.pidfds", """
        import os
        def outcome(signals: list[str]) -> bool:
            os.path.split("/a/b")  # a module's function, not a text method
            return any(s.startswith("SIGKILL") for s in signals)
    """)
    [breach] = text_breaches(made, {})
    assert "pveclean/host/pidfds.py:5: .startswith( in host.pidfds:outcome" in breach
    assert "TEXT_PARSERS" in breach
    parser = _scan("host.procfs", """
        def parse_stat(text: str) -> list[str]:
            return text.split()
    """)
    assert text_breaches(parser, {}) == []


def test_the_size_checks_fail_on_a_long_or_wide_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long = _scan("core.policy", f"def step() -> None:\n{body}\n")
    assert long.functions[0].lines == MAX_FUNCTION_LINES + 1
    assert "core.policy:step has 61 lines" in long_breaches(long, {})[0]
    assert long_breaches(long, {"core.policy:step": 61}) == []
    wide = _scan("commands.cli", """
        class Run:
            def go(self, a, b, c, d, e, f, g) -> None: ...
            def stop(self, a, b, c, d, e, f, g, *, h) -> None: ...
        @command()
        def ct(a, b, c, d, e, f, g, h) -> None: ...
        def helper(a, b, c, d, e, f, g, *rest) -> None: ...
    """)
    assert [b.split(": ")[1] for b in wide_breaches(wide, {})] == [
        "commands.cli:Run.stop takes 8 parameters (at most 7",
        "commands.cli:helper takes 8 parameters (at most 7"]
