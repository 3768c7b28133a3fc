"""Node membership comes from /cluster/status, not from pvestatd's /nodes status: with
pvestatd hung (a dead NFS storage) the node stays a member, install works and status warns."""

from __future__ import annotations

import json
import time

from tests.harness.lxclab import Lab
from tests.helpers import conf, pveclean


def hang_pvestatd(lab: Lab, minutes: float = 6.0) -> None:
    """pvestatd's last round was `minutes` ago and no new one comes (its rounds stop)."""
    run = lab.root / "run"
    run.mkdir(exist_ok=True)
    (run / "pvestatd.hung").write_text("")
    (run / "pvestatd.json").write_text(json.dumps({"time": time.time() - minutes * 60,
                                                   "status": {}}))


def test_a_hung_pvestatd_does_not_make_the_node_offline(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, start=False)
    hang_pvestatd(host)
    res = pveclean(host, "install", str(vmid), "--enable-snippets")
    assert res.returncode == 0, res.stderr
    assert conf(host, vmid)["hookscript"] == "local:snippets/pveclean-hook"
    st = pveclean(host, "status", "--json")
    assert st.returncode == 0, st.stderr
    data = json.loads(st.stdout)
    assert data["nodes"] == {"labnode": True}
    (ct,) = [c for c in data["containers"] if c["vmid"] == vmid]
    assert "error" not in ct and ct["hook"] == "pveclean"
    assert any("pvestatd has not reported for 5 minutes" in w for w in data["warnings"])


def test_a_fresh_pvestatd_gives_no_warning(host: Lab, vmid: int) -> None:
    host.create_ct(vmid, start=False)
    data = json.loads(pveclean(host, "status", "--json").stdout)
    assert not any("pvestatd" in w for w in data["warnings"])
