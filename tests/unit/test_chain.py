"""Chained hookscripts: run without a timeout or owner check, resolved on every run, one line
when bad."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pveclean.core import config
from pveclean.proxmox import chain


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
