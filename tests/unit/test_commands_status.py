"""`pveclean status` across a cluster through fakepve: kinds, offline nodes, API failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from pveclean.commands.cli import run_app
from pveclean.commands.status import collect
from pveclean.host import configfile
from pveclean.proxmox import pveapi
from tests.helpers import HOOK, Cluster


def test_cluster_status_kinds_and_missing_snippet_warnings(cluster: Cluster) -> None:
    pve = cluster.pve
    pve.storages["local"]["content"] += ",snippets"
    pve.ct(101).config["hookscript"] = HOOK
    pve.ct(102).config["hookscript"] = "shared:snippets/theirs.pl"
    chained = cluster.tmp / "state/chain"
    chained.mkdir(parents=True)
    (chained / "101").write_text("local:snippets/old.sh\n/var/lib/vz/snippets/old.sh\n")
    cfg = configfile.load(cluster.config)
    data = collect(pveapi.connect(cfg), cfg, with_holders=False).as_dict()
    ct = {e["vmid"]: e for e in data["containers"]}  # type: ignore[attr-defined]
    assert (ct[101]["hook"], ct[101]["chained"]) == ("chained", "local:snippets/old.sh")
    assert ct[102]["hook"] == "other" and ct[201]["hook"] == "none"
    assert ct[201]["gpu"] and ct[201]["node"] == "pve2" and "last_report" not in ct[201]
    # the snippet is on neither node's 'local' (not shared); 'shared' is never checked
    assert data["warnings"] == [
        f"CT 101: hookscript {HOOK} is missing on node {n}; storage 'local' is not shared, so "
        f"a start there aborts: run pveclean install on {n} or use a shared storage"
        for n in ("pve1", "pve2")]
    pve.store_file("local", "pveclean-hook", 100, content="snippets")
    assert collect(pveapi.connect(cfg), cfg, with_holders=False).warnings == ()
    pve.storages["local"]["nodes"] = "pve1"  # not on pve2: a start there cannot find it
    (warning,) = collect(pveapi.connect(cfg), cfg, with_holders=False).warnings
    assert warning.startswith(f"CT 101: hookscript {HOOK} is missing on node pve2 (")


def test_cluster_status_with_an_offline_node(cluster: Cluster,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cluster.pve.set_node_offline("pve2")
    assert run_app(["status", "-c", str(cluster.config)]) == 0
    out = capsys.readouterr().out
    assert "nodes: pve1 (online), pve2 (OFFLINE)" in out
    assert "  error: node pve2 is offline" in out
    # CT 101 runs on this node per the API but has no config file here: said, not fatal
    assert f"does not exist on this node (no {Path(cluster.tmp) / 'lxc/101.conf'})" in out


def test_status_when_the_api_fails(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.pve.fail("GET", "/cluster/resources", 500, "cluster not ready - no quorum?")
    assert run_app(["status", "--json", "-c", str(cluster.config)]) == 3
    err = capsys.readouterr().err
    assert err == "pveclean: GET /cluster/resources: cluster not ready - no quorum?\n"
