"""proxmox/chain: the record of a container's previous hookscript, its path as Proxmox resolves it
from storage.cfg on every run (the recorded path when storage.cfg is unreadable), and running
it as Proxmox would: no timeout, no owner check, one line when it is bad."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pveclean.core import config
from pveclean.core.config import Config
from pveclean.proxmox import chain


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    pve = tmp_path / "etc/pve"
    (pve / "lxc").mkdir(parents=True)
    return Config(pve_config_dir=str(pve / "lxc"), state_dir=str(tmp_path / "state"))


def _storage(cfg: Config, text: str) -> None:
    (Path(cfg.pve_config_dir).parent / "storage.cfg").write_text(text)


def _script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(mode)
    return path


# ---- the record ---------------------------------------------------------------------------
def test_record_round_trip_and_its_modes(cfg: Config) -> None:
    chain.write_record(cfg, 129, "local:snippets/theirs.sh", "/var/lib/vz/snippets/theirs.sh")
    p = chain.record_path(cfg, 129)
    assert p == Path(cfg.state_dir) / "chain" / "129"
    assert p.read_text() == "local:snippets/theirs.sh\n/var/lib/vz/snippets/theirs.sh\n"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert not p.with_suffix(".tmp").exists()
    assert chain.read_record(cfg, 129) == ("local:snippets/theirs.sh",
                                          "/var/lib/vz/snippets/theirs.sh")
    assert chain.read_record(cfg, 130) is None


def test_write_record_replaces_the_earlier_one(cfg: Config) -> None:
    chain.write_record(cfg, 129, "a:snippets/one", "/one")
    chain.write_record(cfg, 129, "b:snippets/two", "/two")
    assert chain.read_record(cfg, 129) == ("b:snippets/two", "/two")


@pytest.mark.parametrize("text", [
    "local:snippets/x\nrelative/path\n",  # the path must be absolute
    "local:snippets/x\n",
    "local:snippets/x\n/a\n/b\n",
    "",
])
def test_a_malformed_record_is_no_record(cfg: Config, text: str) -> None:
    p = chain.record_path(cfg, 129)
    p.parent.mkdir(parents=True)
    p.write_text(text)
    assert chain.read_record(cfg, 129) is None


def test_a_record_that_is_not_text_is_no_record(cfg: Config) -> None:
    p = chain.record_path(cfg, 129)
    p.parent.mkdir(parents=True)
    p.write_bytes(b"local:snippets/\xff\n/x\n")
    assert chain.read_record(cfg, 129) is None


def test_remove_record_twice(cfg: Config) -> None:
    chain.write_record(cfg, 129, "a:snippets/x", "/x")
    chain.remove_record(cfg, 129)
    chain.remove_record(cfg, 129)
    assert chain.read_record(cfg, 129) is None


# ---- resolve: PVE::Storage::path for a snippet --------------------------------------------
STORAGE = """\
# comment: dir: local
dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup,snippets

dir: hooks
\tpath /srv/hooks/
\tcontent snippets
\tcontent-dirs iso=isos, snippets=/my/hooks/

lvmthin: local-lvm
\tthinpool data
\tvgname pve

nfs: shared
    path /mnt/pve/shared
    content snippets
    content-dirs snippets=
"""


@pytest.mark.parametrize(("volid", "path"), [
    ("local:snippets/theirs.sh", "/var/lib/vz/snippets/theirs.sh"),
    ("hooks:snippets/theirs.sh", "/srv/hooks/my/hooks/theirs.sh"),
    ("shared:snippets/x", "/mnt/pve/shared/snippets/x"),  # an empty subdir is the default
    ("local-lvm:snippets/x", None),  # no path
    ("nowhere:snippets/x", None),
    ("local:iso/x.iso", None),  # not a snippet
    ("local:snippets/", None),
    ("local:snippets/a/b", None),
    (":snippets/x", None),
    ("local", None),
])
def test_resolve(cfg: Config, volid: str, path: str | None) -> None:
    _storage(cfg, STORAGE)
    got = chain.resolve(cfg, volid)
    assert (str(got) if got else None) == path


def test_resolve_without_storage_cfg(cfg: Config) -> None:
    assert chain.resolve(cfg, "local:snippets/x") is None


def test_storage_cfg_is_found_above_the_configs(tmp_path: Path) -> None:
    deep = Config(pve_config_dir=str(tmp_path / "lab/pve/nodes/n1/lxc"))
    assert chain._storage_cfg_path(deep) == tmp_path / "lab/pve/storage.cfg"
    assert chain._storage_cfg_path(Config(pve_config_dir=str(tmp_path / "x/lxc"))) == \
        Path("/etc/pve/storage.cfg")


# ---- run_chained --------------------------------------------------------------------------
def test_no_record_runs_nothing(cfg: Config, capfd: pytest.CaptureFixture[str]) -> None:
    assert chain.run_chained(129, "pre-start", cfg) == 0
    assert capfd.readouterr().out == ""


def test_the_script_gets_vmid_and_phase_and_its_exit_code_counts(
        cfg: Config, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    vz = tmp_path / "vz"
    _storage(cfg, f"dir: local\n\tpath {vz}\n\tcontent snippets\n")
    _script(vz / "snippets/theirs.sh", 'echo "ran $1 $2"; exit 4')
    chain.write_record(cfg, 129, "local:snippets/theirs.sh", "/elsewhere/theirs.sh")
    assert chain.run_chained(129, "post-stop", cfg) == 4
    out = capfd.readouterr().out
    assert out.splitlines() == ["ran 129 post-stop",
                                "pveclean: CT 129 post-stop: chained hookscript "
                                "local:snippets/theirs.sh exited 4"]


def test_a_successful_script_prints_only_its_own_output(
        cfg: Config, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path / "s.sh", "echo fine")
    chain.write_record(cfg, 129, "gone:snippets/s.sh", str(script))  # unresolvable: recorded
    assert chain.run_chained(129, "pre-start", cfg) == 0
    assert capfd.readouterr().out == "fine\n"


@pytest.mark.parametrize(("phase", "code"), [
    ("pre-start", 1), ("post-start", 0), ("pre-stop", 0), ("post-stop", 0)])
def test_a_missing_script_fails_only_pre_start(cfg: Config, tmp_path: Path, phase: str,
                                               code: int, capfd: pytest.CaptureFixture[str]
                                               ) -> None:
    chain.write_record(cfg, 129, "local:snippets/gone.sh", str(tmp_path / "gone.sh"))
    assert chain.run_chained(129, phase, cfg) == code
    assert capfd.readouterr().out == (
        f"pveclean: CT 129 {phase}: chained hookscript local:snippets/gone.sh "
        f"({tmp_path / 'gone.sh'}) does not exist\n")


def test_a_directory_is_not_a_script(cfg: Config, tmp_path: Path,
                                     capfd: pytest.CaptureFixture[str]) -> None:
    chain.write_record(cfg, 129, "local:snippets/d", str(tmp_path))
    assert chain.run_chained(129, "pre-start", cfg) == 1
    assert "does not exist" in capfd.readouterr().out


def test_a_script_without_x_is_not_run(cfg: Config, tmp_path: Path,
                                       capfd: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    script = _script(tmp_path / "s.sh", f"touch {marker}", mode=0o644)
    chain.write_record(cfg, 129, "local:snippets/s.sh", str(script))
    assert chain.run_chained(129, "pre-start", cfg) == 1
    assert chain.run_chained(129, "pre-stop", cfg) == 0
    assert not marker.exists()
    assert capfd.readouterr().out.count("is not executable\n") == 2


def test_a_script_whose_interpreter_is_missing_is_one_line(
        cfg: Config, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "s.sh"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    chain.write_record(cfg, 129, "local:snippets/s.sh", str(script))
    assert chain.run_chained(129, "pre-start", cfg) == 1
    out = capfd.readouterr()
    assert out.out.startswith("pveclean: CT 129 pre-start: chained hookscript")
    assert "cannot run" in out.out and out.out.count("\n") == 1 and "Traceback" not in out.err


def test_chained_script_has_no_timeout_and_no_owner_check(
        chained: tuple[config.Config, Path], tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    cfg, script = chained
    out = tmp_path / "out"
    script.write_text(f"#!/bin/sh\nsleep 1.5\necho \"$1 $2\" > {out}\nexit 7\n")
    script.chmod(0o777)  # group/others may write: Proxmox runs it all the same
    os.chown(script, 1234, 1234)  # not root's (NFS root_squash)
    assert chain.run_chained(100, "pre-start", cfg) == 7  # not killed after 1 s
    assert out.read_text() == "100 pre-start\n"
    assert "exited 7" in capfd.readouterr().out


def test_chained_path_resolved_on_every_run(chained: tuple[config.Config, Path],
                                            tmp_path: Path) -> None:
    cfg, script = chained
    script.write_text("#!/bin/sh\nexit 0\n")  # where it was at install time
    script.chmod(0o755)
    moved = tmp_path / "vz/hooks/theirs.sh"
    moved.parent.mkdir()
    moved.write_text("#!/bin/sh\nexit 5\n")
    moved.chmod(0o755)
    storage = Path(cfg.pve_config_dir).parent / "storage.cfg"
    storage.write_text(storage.read_text() + "\tcontent-dirs snippets=hooks\n")
    assert chain.run_chained(100, "pre-start", cfg) == 5  # from where Proxmox looks now


@pytest.mark.parametrize("kind", ["missing", "not-executable", "eio"])
def test_bad_chained_script_is_one_line(chained: tuple[config.Config, Path], kind: str,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    cfg, script = chained
    if kind == "not-executable":
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o644)
    elif kind == "eio":
        script.write_text("#!/nonexistent/interpreter\n")  # exec fails with an OSError
        script.chmod(0o755)
    assert chain.run_chained(100, "pre-start", cfg) == 1
    assert chain.run_chained(100, "post-stop", cfg) == 0
    out = capfd.readouterr()
    lines = out.out.splitlines()
    assert len(lines) == 2 and all(ln.startswith("pveclean: CT 100 ") for ln in lines)
    assert "Traceback" not in out.out + out.err


def test_unreadable_storage_cfg_falls_back_to_the_recorded_path(
        chained: tuple[config.Config, Path]) -> None:
    cfg, script = chained
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    (Path(cfg.pve_config_dir).parent / "storage.cfg").unlink()
    assert chain.run_chained(100, "pre-start", cfg) == 3
