"""proxmox/pveapi: the API's answers read into pveclean's records, and every failure one line,
without a server (a stand-in for proxmoxer's resource object) and against fakepve through
proxmoxer's https backend on loopback; the api section of the config."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proxmoxer.core import ResourceException

from pveclean import errors
from pveclean.commands.cli import run_app
from pveclean.core import config
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import configfile
from pveclean.proxmox import pveapi, snippets
from tests.helpers import GPU_LXC, Cluster, write_config


# ---- config_from_api ----------------------------------------------------------------------
def test_config_from_api_reads_keys_and_raw_lxc_pairs() -> None:
    data = {"hostname": "web", "memory": 512, "digest": "abc",
            "dev0": "/dev/nvidia0,gid=44",
            "lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"],
                    ["lxc.mount.entry", "/dev/nvidia1 dev/nvidia1 none bind"],
                    ["lxc.bad"], "not a pair"]}
    cfg = pveapi.config_from_api(129, data)
    assert cfg.vmid == 129
    assert cfg.lines == [
        ("dev0", "/dev/nvidia0,gid=44"), ("hostname", "web"), ("memory", "512"),
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.mount.entry", "/dev/nvidia1 dev/nvidia1 none bind"),
    ]
    assert cfg.gpu_paths() == ["/dev/nvidia0", "/dev/nvidia1"]


def test_config_from_api_takes_tuples_and_no_lxc() -> None:
    assert pveapi.config_from_api(1, {"lxc": [("lxc.a", 1)]}).lines == [("lxc.a", "1")]
    assert pveapi.config_from_api(1, {"lxc": None}).lines == []
    assert pveapi.config_from_api(1, {}).lines == []


def test_the_api_and_the_file_give_the_same_gpu_lines() -> None:
    from pveclean.proxmox import pveconf

    text = ("dev0: /dev/nvidia0\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
            "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind\n")
    api = pveapi.config_from_api(100, {"dev0": "/dev/nvidia0", "lxc": [
        ["lxc.cgroup2.devices.allow", "c 195:* rwm"],
        ["lxc.mount.entry", "/dev/nvidia-uvm dev/nvidia-uvm none bind"]]})
    assert api.gpu_lines() == pveconf.parse_config(text, 100).gpu_lines()


# ---- content_dirs and the snippets directory ---------------------------------------------
@pytest.mark.parametrize(("value", "dirs"), [
    ("snippets=hooks,iso=isos", (("snippets", "hooks"), ("iso", "isos"))),
    (" snippets = /my/hooks/ ", (("snippets", "my/hooks"),)),
    ("snippets=,iso=/", ()),
    ("garbage", ()),
    ("", ()),
    (None, ()),
    ({"snippets": "/hooks/", "iso": ""}, (("snippets", "hooks"),)),
])
def test_content_dirs(value: Any, dirs: tuple[tuple[str, str], ...]) -> None:
    assert snippets.content_dirs(value) == dirs


def test_snippets_dir() -> None:
    def storage(path: str | None, dirs: tuple[tuple[str, str], ...] = ()) -> pveapi.Storage:
        return pveapi.Storage("s", "dir", path, ["snippets"], False, dirs)

    assert storage("/var/lib/vz").snippets_dir == Path("/var/lib/vz/snippets")
    assert storage("/srv", (("iso", "isos"), ("snippets", "hooks"))).snippets_dir == \
        Path("/srv/hooks")
    assert storage(None).snippets_dir is None
    assert storage("").snippets_dir is None


# ---- lock chatter and the node name ------------------------------------------------------
@pytest.mark.parametrize(("text", "only"), [
    ("trying to acquire lock...\n OK\n", True),
    ("trying to acquire cfs lock...\nOK\n", True),
    ("  trying to acquire lock...  \n\n", True),
    ("", False),
    ("\n\n", False),
    ("trying to acquire lock...\ncan't lock file '/run/lock/lxc/pve-config-101.lock'\n", False),
    ("OK, but something else\n", False),
])
def test_lock_chatter_only(text: str, only: bool) -> None:
    assert pveapi.lock_chatter_only(text) is only


def test_nodename_is_the_short_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.uname()
    fake = os.uname_result((real.sysname, "pve1.example.com", real.release, real.version,
                            real.machine))
    monkeypatch.setattr(os, "uname", lambda: fake)
    assert pveapi.nodename() == "pve1"


# ---- Api over a stand-in resource --------------------------------------------------------
class Prox:
    """proxmoxer's `prox(path).get(**args)`, answering from a function of (method, path)."""

    def __init__(self, answer: Callable[[str, str, dict[str, Any]], Any]) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, path: str) -> Any:
        prox = self

        class Resource:
            def __getattr__(self, method: str) -> Callable[..., Any]:
                def call(**args: Any) -> Any:
                    prox.calls.append((method, path, args))
                    return prox.answer(method, path, args)
                return call

        return Resource()


def _raise(exc: BaseException) -> Callable[[str, str, dict[str, Any]], Any]:
    def answer(_m: str, _p: str, _a: dict[str, Any]) -> Any:
        raise exc
    return answer


def test_calls_go_to_the_path_without_slashes() -> None:
    prox = Prox(lambda m, p, a: {"status": "running"})
    api = pveapi.Api(prox, "here", "root@pam")
    assert api.ct_status("pve1", 129) == "running"
    api.set_hookscript("pve1", 129, "local:snippets/pveclean-hook")
    assert prox.calls == [
        ("get", "nodes/pve1/lxc/129/status/current", {}),
        ("put", "nodes/pve1/lxc/129/config", {"hookscript": "local:snippets/pveclean-hook"}),
    ]


def test_containers_are_the_lxc_resources_sorted() -> None:
    rows = [{"type": "qemu", "vmid": 50, "node": "pve1"},
            {"type": "lxc", "vmid": "201", "node": "pve2", "name": "b", "status": "stopped",
             "template": "1"},
            {"type": "lxc", "vmid": 101, "node": "pve1", "lock": "backup"}]
    api = pveapi.Api(Prox(lambda m, p, a: rows), "here", "root@pam")
    assert api.containers() == [
        pveapi.Container(101, "pve1", "", "unknown", "backup", False),
        pveapi.Container(201, "pve2", "b", "stopped", None, True)]


def test_storage_record() -> None:
    answer = {"type": "nfs", "path": "/mnt/pve/n", "content": "iso,snippets",
              "content-dirs": "snippets=hooks"}
    api = pveapi.Api(Prox(lambda m, p, a: answer), "here", "root@pam")
    st = api.storage("n")
    assert st == pveapi.Storage("n", "nfs", "/mnt/pve/n", ["iso", "snippets"], True,
                                (("snippets", "hooks"),))  # nfs is shared without the flag
    assert st.snippets_dir == Path("/mnt/pve/n/hooks")


def test_local_node_is_the_one_marked_local() -> None:
    status = [{"type": "cluster", "name": "c"}, {"type": "node", "name": "pve2", "local": 0},
              {"type": "node", "name": "pve1", "local": 1}]
    assert pveapi.Api(Prox(lambda m, p, a: status), "here", "root@pam").local_node() == "pve1"
    with pytest.raises(PvecleanError, match="names no local node"):
        pveapi.Api(Prox(lambda m, p, a: status[:2]), "here", "root@pam").local_node()


def test_a_change_that_waited_for_the_lock_succeeds() -> None:
    exc = ResourceException(500, "Internal Server Error", "trying to acquire lock...\n OK\n")
    api = pveapi.Api(Prox(_raise(exc)), "here", "root@pam")
    assert api._call("put", "/nodes/pve1/lxc/1/config", hookscript="x") is None
    with pytest.raises(PvecleanError):  # a read with only chatter is still a failure
        api._call("get", "/nodes/pve1/lxc/1/config")


@pytest.mark.parametrize(("exc", "needle"), [
    (ResourceException(595, "Errors", "no route to host"),
     "node 'pve2' is offline or unreachable (no route to host)"),
    (ResourceException(403, "Forbidden", "changing the hookscript needs root"),
     "Proxmox refused it: changing the hookscript needs root; set api.user to root@pam "
     "(now admin@pve)"),
    (ResourceException(500, "Internal", "can't lock\nfile", errors={"x": "y"}),
     "PUT /nodes/pve2/lxc/1/config: can't lock file ({'x': 'y'})"),
    (ResourceException(500, "Internal", ""), "PUT /nodes/pve2/lxc/1/config: Internal"),
    (subprocess.TimeoutExpired("pvesh", 30), "did not answer in 30 s"),
    (FileNotFoundError(2, "No such file", "pvesh"), "pvesh not found: api.backend local"),
])
def test_failures_are_one_line_access_errors(exc: BaseException, needle: str) -> None:
    api = pveapi.Api(Prox(_raise(exc)), "here", "admin@pve")
    with pytest.raises(PvecleanError) as err:
        api._call("put", "/nodes/pve2/lxc/1/config", hookscript="x")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == ExitCode.ACCESS


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


def test_membership_is_read_from_cluster_status_and_pvestatd_is_a_hint() -> None:
    """/nodes says `unknown` when pvestatd's data is 5 minutes old: membership decides."""
    answers = {
        "cluster/status": [{"type": "cluster", "name": "c"},
                           {"type": "node", "name": "pve1", "online": 1, "local": 1},
                           {"type": "node", "name": "pve2", "online": 0},
                           {"type": "node", "name": "pve3", "online": 1}],
        "nodes": [{"node": "pve1", "status": "unknown"}, {"node": "pve2", "status": "offline"},
                  {"node": "pve3", "status": "online"}],
    }
    api = pveapi.Api(Prox(lambda m, p, a: answers[p]), "here", "root@pam")
    members = api.nodes()
    assert members == {"pve1": True, "pve2": False, "pve3": True}
    assert api.stale_nodes(members) == ["pve1"]
