"""`pveclean install` without a lab: cluster installs through the API stand-in, the stamp, the
config file, and what install refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pveclean.commands.cli import run_app
from pveclean.errors import PvecleanError
from tests.helpers import HOOK, Cluster


def test_install_refuses_a_config_or_binary_others_can_change(tmp_path: Path) -> None:
    from pveclean.errors import PvecleanError
    from pveclean.proxmox.hookscript import trusted

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    cfg = shared / "x.yaml"
    cfg.write_text("grace_seconds: 1\n")
    cfg.chmod(0o644)
    exe = tmp_path / "pveclean"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    with pytest.raises(PvecleanError, match="writable by group or others") as e:
        trusted(str(exe), str(cfg))
    assert e.value.exit_code == 2
    exe.chmod(0o775)
    with pytest.raises(PvecleanError, match="pveclean command"):
        trusted(str(exe), None)
    exe.chmod(0o755)
    trusted(str(exe), None)


# ---- across a cluster: fakepve over https ------------------------------------------------
def test_cluster_install_only_where_the_storage_reaches(cluster: Cluster,
                                                        capsys: pytest.CaptureFixture[str],
                                                        ) -> None:
    pve = cluster.pve
    rc = run_app(["install", "201", "--enable-snippets", "-c", str(cluster.config)])
    err = capsys.readouterr().err
    assert rc == 2 and "CT 201 is on node pve2 and storage 'local' is not shared" in err
    assert "hookscript" not in pve.ct(201).config

    rc = run_app(["install", "--all-gpu", "--enable-snippets", "-c", str(cluster.config)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "note: CT 201 on node pve2 skipped: storage 'local' is not shared" in out
    assert pve.ct(101).config["hookscript"] == HOOK
    assert "hookscript" not in pve.ct(102).config  # no GPU
    assert "snippets" in pve.storages["local"]["content"]
    assert (cluster.local / "snippets/pveclean-hook").is_file()

    rc = run_app(["install", "201", "--storage", "shared", "-c", str(cluster.config)])
    assert rc == 0, capsys.readouterr()
    assert pve.ct(201).config["hookscript"] == "shared:snippets/pveclean-hook"
    assert os.access(cluster.shared / "snippets/pveclean-hook", os.X_OK)


def test_cluster_chain_needs_the_containers_node(cluster: Cluster,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cluster.pve.ct(201).config["hookscript"] = "shared:snippets/theirs.pl"
    rc = run_app(["install", "201", "--storage", "shared", "--chain", "-c", str(cluster.config)])
    assert rc == 2
    assert "CT 201 is on node pve2: --chain records its hookscript" in capsys.readouterr().err
    assert cluster.pve.ct(201).config["hookscript"] == "shared:snippets/theirs.pl"


def test_cluster_locked_container_fails_cleanly(cluster: Cluster,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    asyncio.run(cluster.pve.hold_config_lock(101, None))  # a task holds the config lock
    rc = run_app(["install", "101", "--enable-snippets", "-c", str(cluster.config)])
    err = capsys.readouterr().err
    assert rc == 3
    assert "CT 101: PUT /nodes/pve1/lxc/101/config: can't lock file" in err
    assert "hookscript" not in cluster.pve.ct(101).config


def test_stamp_and_config_file(tmp_path: Path) -> None:
    from pveclean.core import config
    from pveclean.host import configfile
    from pveclean.proxmox.hookscript import TEMPLATES, config_file, stamp

    text = TEMPLATES[0].read_text()
    out = stamp(text, "/opt/pveclean/bin/pveclean", "/srv/pc.yaml")
    assert 'PVECLEAN_BIN="/opt/pveclean/bin/pveclean"' in out
    assert 'PVECLEAN_CONFIG_FILE="/srv/pc.yaml"' in out
    assert 'PVECLEAN_CONFIG_FILE=""' in stamp(text, "/usr/sbin/pveclean", None)
    with pytest.raises(PvecleanError, match="cannot go into a shell script"):
        stamp(text, '/tmp/x"; rm -rf /; "', None)
    assert config_file(config.Config()) is None
    assert config_file(config.parse("", str(configfile.DEFAULT_PATH))) is None
    assert config_file(config.parse("", str(tmp_path / "c.yaml"))) == str(tmp_path / "c.yaml")
