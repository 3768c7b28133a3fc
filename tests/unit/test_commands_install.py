"""commands/install without a lab: cluster installs through fakepve, only where the storage
reaches, and a locked container failing cleanly."""

from __future__ import annotations

import os

import pytest

from pveclean.commands.cli import run_app
from tests.helpers import HOOK, Cluster


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


def test_a_hookscript_set_after_the_plan_is_not_overwritten(cluster: Cluster) -> None:
    """The change carries the digest of the config it was planned on: Proxmox refuses it
    when another hookscript was set in between (assert_if_modified), so nothing is lost
    unchained."""
    from pveclean.commands import install
    from pveclean.commands.installplan import InstallRequest
    from pveclean.host import configfile
    from pveclean.proxmox import pveapi

    cfg = configfile.load(cluster.config)
    api = pveapi.connect(cfg)
    plan = install.plan_install(api, cfg, InstallRequest((101,), enable_snippets=True))
    assert [s.action for s in plan.steps] == ["set"] and plan.steps[0].digest
    cluster.pve.ct(101).config["hookscript"] = "local:snippets/theirs.sh"  # someone else, now
    out = install.apply_install(api, cfg, plan)
    assert out.exit_code == 3 and "detected modified configuration" in out.errors[0][0]
    assert cluster.pve.ct(101).config["hookscript"] == "local:snippets/theirs.sh"
