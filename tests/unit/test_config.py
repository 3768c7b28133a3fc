"""Config, parsers and redaction: exact behaviour, and fuzzing (no crash, a clear error)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pveclean import errors
from pveclean.core import config
from pveclean.core.report import Redactor
from pveclean.errors import PvecleanError
from pveclean.host import cgroupfs, configfile, devnodes, procfs
from pveclean.proxmox import probe, pveconf

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_equals_builtin_defaults() -> None:
    shipped = config.parse((REPO / "config/pveclean.yaml").read_text(), "shipped")
    assert shipped.as_dict() == config.Config().as_dict()


def test_every_key_in_the_shipped_config_is_commented() -> None:
    lines = (REPO / "config/pveclean.yaml").read_text().splitlines()
    keys = 0
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#", "-")):
            keys += 1
            j = i - 1  # walk up over the keys of the same group to its comment
            while j >= 0 and lines[j] and not lines[j].startswith("#"):
                j -= 1
            assert j >= 0 and lines[j].startswith("#"), f"key without a comment: {line}"
    assert keys == len(config.Config().as_dict())


@pytest.mark.parametrize(("text", "needle"), [
    ("grace_secnds: 3\n", "line 1: unknown key 'grace_secnds' (did you mean 'grace_seconds'?)"),
    ("devices:\n  - /dev/nvidia*\ngrace_seconds: soon\n", "line 3: 'grace_seconds' must be"),
    ("protect: nvidia-persistenced\n", "line 1: 'protect' must be a list"),
    ("phases:\n  pre-stop: maybe\n", "line 1: 'phases' must be"),
    ("deadline_seconds: 0\n", "'deadline_seconds' must be a number > 0"),
    ("pre_start_policy: abort\n", "'pre_start_policy' must be 'warn' or 'refuse'"),
    ("probe: yes please\n", "'probe' must be true or false"),
    ("redact: ['(']\n", "not a valid regex"),
    ("a: [\n", "line"),
    ("- just\n- a list\n", "top level must be a mapping"),
    ("grace_seconds: 1\ngrace_seconds: 2\n", "line 2: key 'grace_seconds' given twice"),
])
def test_config_errors_name_key_and_line(text: str, needle: str) -> None:
    with pytest.raises(errors.ConfigError) as exc:
        config.parse(text, "cfg.yaml")
    assert needle in str(exc.value) and str(exc.value).startswith("cfg.yaml")
    assert "\n" not in str(exc.value)


def test_config_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("grace_seconds: 1\n")
    b.write_text("grace_seconds: 2\n")
    for p in (a, b):
        p.chmod(0o644)
    monkeypatch.setenv("PVECLEAN_CONFIG", str(b))
    assert configfile.load(a).grace_seconds == 1.0
    assert configfile.load().grace_seconds == 2.0
    monkeypatch.delenv("PVECLEAN_CONFIG")
    monkeypatch.setattr(configfile, "DEFAULT_PATH", tmp_path / "missing.yaml")
    assert configfile.load() == config.Config()
    with pytest.raises(errors.ConfigError, match="does not exist"):
        configfile.load(tmp_path / "nope.yaml")


def test_config_check_command(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("grace_seconds: 4\n")
    cfg.chmod(0o644)
    exe = [sys.executable, "-m", "pveclean"]
    r = subprocess.run([*exe, "config", "check", str(cfg)], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0 and "config OK" in r.stderr
    assert yaml.safe_load(r.stdout)["grace_seconds"] == 4.0
    cfg.write_text("grace_seconds: 4\nfoo: 1\n")
    r = subprocess.run([*exe, "config", "check", str(cfg)], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 2
    assert r.stderr.strip() == f"pveclean: {cfg} line 2: unknown key 'foo'"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_config_parser_never_crashes(text: str) -> None:
    try:
        config.parse(text, "fuzz")
    except errors.ConfigError as exc:
        assert str(exc).startswith("fuzz")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(list(config.Config().as_dict())),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                 st.text(max_size=10), st.lists(st.text(max_size=5)))))
def test_config_values_of_any_type(values: dict[str, object]) -> None:
    try:
        cfg = config.parse(yaml.safe_dump(values), "fuzz")
    except errors.ConfigError:
        return
    assert isinstance(cfg.grace_seconds, float) and isinstance(cfg.devices, list)


def test_probe_output_parsing() -> None:
    out = ("fd 12 /dev/nvidia0\nfd 12 /dev/nvidiactl\nmap 12 /dev/nvidia-uvm\n"
           "garbage line\nfd x /dev/nvidia1\nmap 40 /dev/nvidia-uvm\nend\n")
    res = probe.parse_probe(out)
    assert res.complete and res.bad_lines == 2
    assert res.holders == {12: ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm (mmap)"],
                           40: ["/dev/nvidia-uvm (mmap)"]}
    assert not probe.parse_probe("fd 1 /dev/nvidia0\n").complete  # cut short


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_probe_parser_never_crashes(text: str) -> None:
    res = probe.parse_probe(text)
    assert all(isinstance(k, int) for k in res.holders)


def test_probe_script_runs_in_plain_sh(tmp_path: Path) -> None:
    """The probe itself, run here by /bin/sh: it finds this test's own open GPU-like node."""
    node = tmp_path / "nvidia7"
    os.mknod(node, 0o600 | 0o020000, os.makedev(1, 7)) if os.geteuid() == 0 else node.touch()
    with open(node, "rb") as fh:
        r = subprocess.run(
            ["/bin/sh", "-c", probe.PROBE_SCRIPT, "probe", str(tmp_path) + "/nvidia*"],
            capture_output=True, text=True, check=True, timeout=60)
        res = probe.parse_probe(r.stdout)
        assert res.complete
        assert str(node) in res.holders.get(os.getpid(), []), r.stdout[-500:]
        del fh


def test_stat_and_status_parsing() -> None:
    stat = "123 (we ird) name)) S 1 123 123 0 -1 4194560 " + " ".join(["0"] * 12) + " 98765 0"
    assert procfs.parse_stat(stat) == ("S", 1, 98765)
    assert procfs.parse_stat("garbage") is None
    st = procfs.parse_status("Name:\tpython3\nNSpid:\t4242\t17\t2\nUid:\t0\t0\t0\t0\n")
    assert st["NSpid"] == "4242\t17\t2" and st["Name"] == "python3"


def test_status_parsing_of_the_needed_keys_matches_the_whole_parse() -> None:
    for pid in ("self", "1"):
        text = Path(f"/proc/{pid}/status").read_text()
        whole = procfs.parse_status(text)
        assert procfs.parse_status(text, procfs.STATUS_KEYS) == {
            k: whole[k] for k in procfs.STATUS_KEYS}
    assert procfs.read_status(os.getpid()) == procfs.read_status(os.getpid())
    st = procfs.read_status(os.getpid())
    assert st is not None and st.nspid[0] == os.getpid() and st.uid == os.getuid()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_proc_parsers_never_crash(text: str) -> None:
    procfs.parse_stat(text)
    procfs.parse_status(text)


def test_nvidia_majors_from_proc_devices(tmp_path: Path) -> None:
    f = tmp_path / "devices"
    f.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n"
                 "508 nvidia-uvm\n509 nvidia-caps\n10 misc\n\nBlock devices:\n 259 nvidia-x\n")
    assert devnodes.nvidia_majors(str(f)) == frozenset({195, 508, 509})


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


def test_redaction_defaults() -> None:
    r = Redactor(config.DEFAULT_REDACT)
    line = ("python3 serve --hf-token hf_1 --db-password=pw2 --api-key k3 OPENAI_API_KEY=k4 "
            "HF_TOKEN=t5 https://u:p6@host/x --model llama")
    out = r.text(line)
    for secret in ("hf_1", "pw2", "k3", "k4", "t5", "p6"):
        assert secret not in out
    assert out.endswith("--model llama") and "https://u:***@host/x" in out


def test_cgroup2_root_from_mounts(tmp_path: Path) -> None:
    m = tmp_path / "mounts"
    m.write_text("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n"
                 "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert cgroupfs.cgroup2_root(str(m)) == "/sys/fs/cgroup/unified"
    m.write_text("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    assert cgroupfs.cgroup2_root(str(m)) == "/sys/fs/cgroup"
    m.write_text("proc /proc proc rw 0 0\n")
    with pytest.raises(PvecleanError, match="no cgroup v2"):
        cgroupfs.cgroup2_root(str(m))


def test_wheel_install_ships_the_hookscript(tmp_path: Path) -> None:
    """A non-editable install (the README's way onto a host) carries the hookscript where
    `pveclean install` looks for it: <prefix>/share/pveclean/hookscripts/."""
    from pveclean.proxmox import hookscript

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin/pip"), "install", "-q", "--no-deps", str(REPO)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    prefix = subprocess.run([str(venv / "bin/python"), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    shipped = Path(prefix) / "share/pveclean/hookscripts/pveclean-hook"
    assert shipped.read_text() == (REPO / "hookscripts/pveclean-hook").read_text()
    assert shipped.stat().st_mode & 0o111
    rel = [t.relative_to(sys.prefix) for t in hookscript.TEMPLATES if t.is_relative_to(sys.prefix)]
    assert Path("share/pveclean/hookscripts/pveclean-hook") in rel


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "NaN"])
def test_grace_must_be_finite(value: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pveclean", "ct", "1", "--grace", value],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--grace" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("key", ["grace_seconds", "deadline_seconds", "lock_wait_seconds",
                                 "max_report_age_days"])
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN"])
def test_config_numbers_must_be_finite(key: str, value: str) -> None:
    with pytest.raises(errors.ConfigError, match=key):
        config.parse(f"{key}: {value}\n", "cfg.yaml")
