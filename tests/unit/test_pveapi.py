"""The API adapter against fakepve, through proxmoxer's https backend on loopback."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from pveclean import errors
from pveclean.commands.cli import run_app
from pveclean.core import config
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import configfile
from pveclean.proxmox import pveapi
from tests.helpers import GPU_LXC, Cluster, write_config


def api_of(cluster: Cluster) -> pveapi.Api:
    return pveapi.connect(configfile.load(cluster.config))


def test_lists_nodes_and_containers(cluster: Cluster) -> None:
    api = api_of(cluster)
    assert api.nodes() == {"pve1": True, "pve2": True}
    assert api.local_node() == "pve1"
    cts = api.containers()
    assert [(c.vmid, c.node, c.status) for c in cts] == [
        (101, "pve1", "running"), (102, "pve1", "stopped"), (201, "pve2", "stopped")]
    assert api.ct_config("pve1", 101).gpu_lines() == ["dev0: /dev/nvidia0,gid=44",
                                                      "dev1: /dev/nvidiactl,gid=44"]
    # raw lxc.* keys come as a list of pairs and become config lines again
    assert api.ct_config("pve2", 201).gpu_lines() == [f"{k}: {v}" for k, v in GPU_LXC]
    assert api.ct_config("pve1", 102).gpu_lines() == []
    st = api.storage("local")
    assert (st.type, st.shared, st.snippets_dir) == ("dir", False, cluster.local / "snippets")
    assert api.storage("shared").shared


def test_sets_and_deletes_the_hookscript(cluster: Cluster) -> None:
    api = api_of(cluster)
    api.set_hookscript("pve2", 201, "shared:snippets/pveclean-hook")
    assert cluster.pve.ct(201).config["hookscript"] == "shared:snippets/pveclean-hook"
    assert api.ct_config("pve2", 201).hookscript == "shared:snippets/pveclean-hook"
    api.delete_hookscript("pve2", 201)
    assert "hookscript" not in cluster.pve.ct(201).config
    puts = [(m, p) for m, p, _ in cluster.pve.requests if m == "PUT"]
    assert puts == [("PUT", "/api2/json/nodes/pve2/lxc/201/config")] * 2


def test_api_token_is_refused_with_a_clear_error(cluster: Cluster,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(cluster.tmp, backend="https", host="127.0.0.1:1",
                       user="root@pam!pveclean", password_file=str(cluster.tmp / "password"))
    with pytest.raises(PvecleanError) as exc:
        pveapi.connect(configfile.load(cfg))
    assert exc.value.exit_code == ExitCode.USAGE
    assert "is an API token: Proxmox lets only root@pam set or delete hookscripts" in str(exc.value)
    assert run_app(["install", "101", "-c", str(cfg)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("pveclean: api.user 'root@pam!pveclean' is an API token")
    assert err.count("\n") == 1


def test_proxmox_refuses_other_users_the_hookscript(cluster: Cluster) -> None:
    pve = cluster.pve
    pve.users["ops@pve"] = "opspw"
    pve.grant("ops@pve", "/", "VM.Audit", "VM.Config.Options", "Sys.Audit", "Datastore.Audit")
    (cluster.tmp / "ops").write_text("opspw\n")
    cfg = write_config(cluster.tmp, backend="https", host=pve.url.removeprefix("https://"),
                       user="ops@pve", password_file=str(cluster.tmp / "ops"),
                       verify_ssl=configfile.load(cluster.config).api["verify_ssl"])
    api = pveapi.connect(configfile.load(cfg))
    assert [c.vmid for c in api.containers()] == [101, 102, 201]  # reading is allowed
    with pytest.raises(PvecleanError) as exc:
        api.set_hookscript("pve1", 101, "local:snippets/pveclean-hook")
    assert "only allowed for root@pam" in str(exc.value)
    assert "set api.user to root@pam (now ops@pve)" in str(exc.value)
    assert "hookscript" not in pve.ct(101).config


def test_locked_container(cluster: Cluster) -> None:
    api = api_of(cluster)
    cluster.pve.ct(101).lock = "backup"
    with pytest.raises(PvecleanError) as exc:
        api.set_hookscript("pve1", 101, "local:snippets/x")
    assert str(exc.value) == "PUT /nodes/pve1/lxc/101/config: CT is locked (backup)"
    assert exc.value.exit_code == ExitCode.ACCESS
    assert [c.lock for c in api.containers() if c.vmid == 101] == ["backup"]
    cluster.pve.ct(101).lock = None
    asyncio.run(cluster.pve.hold_config_lock(102, None))
    with pytest.raises(PvecleanError, match=r"pve-config-102\.lock' - got timeout"):
        api.delete_hookscript("pve1", 102)


def test_offline_node(cluster: Cluster) -> None:
    api = api_of(cluster)
    cluster.pve.set_node_offline("pve2")
    assert api.nodes() == {"pve1": True, "pve2": False}
    assert [c.status for c in api.containers() if c.node == "pve2"] == ["unknown"]
    with pytest.raises(PvecleanError) as exc:
        api.ct_config("pve2", 201)
    assert str(exc.value).startswith("node 'pve2' is offline or unreachable")


@pytest.mark.filterwarnings("ignore:Unverified HTTPS request")
def test_login_and_certificate_errors(cluster: Cluster) -> None:
    (cluster.tmp / "wrong").write_text("nope\n")
    host = cluster.pve.url.removeprefix("https://")
    for api, needle in (
        ({"password_file": str(cluster.tmp / "wrong"), "verify_ssl": False},
         "login as root@pam at https://" + host + " failed"),
        ({"password_file": str(cluster.tmp / "password"), "verify_ssl": True},
         "cannot verify the TLS certificate"),
        ({"password_file": str(cluster.tmp / "missing"), "verify_ssl": False},
         "cannot read api.password_file"),
    ):
        cfg = write_config(cluster.tmp, backend="https", host=host, **api)
        with pytest.raises(PvecleanError, match=re.escape(needle)):
            pveapi.connect(configfile.load(cfg))


def test_api_config_is_validated() -> None:
    with pytest.raises(errors.ConfigError, match="line 1: 'api' must be a mapping"):
        config.parse("api: {backend: ssh}\n", "c.yaml")
    with pytest.raises(errors.ConfigError):
        config.parse("api: {verify_ssl: maybe}\n", "c.yaml")
    cfg = config.parse("api: {backend: https, host: pve1}\n", "c.yaml")
    assert cfg.api == {**config.DEFAULT_API, "backend": "https", "host": "pve1"}


def test_local_backend_without_pvesh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    api = pveapi.connect(configfile.load(write_config(tmp_path, backend="local")))
    with pytest.raises(PvecleanError, match=r"pvesh not found: api\.backend local runs pvesh"):
        api.nodes()


def test_https_this_node_is_the_local_machine(cluster: Cluster,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pveapi, "nodename", lambda: "pve2")
    api = pveapi.connect(configfile.load(cluster.config))
    assert api.local_node() == "pve2"  # not pve1, the node api.host is
