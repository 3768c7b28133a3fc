"""The Proxmox API through proxmoxer, for install, uninstall and status (never the hook path).

Backends: `local` runs `pvesh` on this host (as root; no credentials), `https` logs in as a
user with a password ticket. Only root@pam may set or delete a hookscript, and Proxmox
refuses API tokens for it, so tokens are refused here with a clear message.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pveclean.core.config import Config
from pveclean.errors import ExitCode, PvecleanError
from pveclean.proxmox import pveconf
from pveclean.proxmox.snippets import content_dirs, snippets_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


ROOT_USER = "root@pam"
TIMEOUT = 30  # seconds per call; pvesh pays a Perl start-up on every one
ALWAYS_SHARED = ("nfs", "cifs", "cephfs", "glusterfs")  # shared without a `shared` flag
# PVE::Tools::lock_file_full prints these on stderr while it waits for a contended lock; the
# call then goes on and succeeds. proxmoxer's local backend turns any stderr into a 500.
_LOCK_CHATTER = re.compile(r"^\s*(trying to acquire (cfs )?lock\.\.\.|OK)\s*$")


def lock_chatter_only(text: str) -> bool:
    """True when pvesh's stderr holds nothing but lock_file_full's waiting messages."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return bool(lines) and all(_LOCK_CHATTER.match(ln) for ln in lines)


def nodename() -> str:
    """This machine's Proxmox node name (PVE::INotify::nodename: the short host name)."""
    return os.uname().nodename.split(".", 1)[0]


@dataclass(frozen=True)
class Container:
    """A container as the API lists it."""

    vmid: int
    node: str
    name: str
    status: str  # running, stopped; unknown when its node is offline or pvestatd lags
    lock: str | None = None
    template: bool = False
    kind: str = "lxc"  # or "qemu": a VM (the API's path segment and resource type)

    @property
    def label(self) -> str:
        return guest_label(self.kind, self.vmid)


def guest_label(kind: str, vmid: int) -> str:
    """`CT 129` or `VM 200`, as Proxmox's GUI names guests."""
    return f"{'VM' if kind == 'qemu' else 'CT'} {vmid}"


@dataclass(frozen=True)
class Storage:
    """A storage as the API lists it."""

    name: str
    type: str
    path: str | None
    content: list[str]
    shared: bool

    content_dirs: tuple[tuple[str, str], ...] = ()

    @property
    def snippets_dir(self) -> Path | None:
        return snippets_dir(self.path, self.content_dirs)


def _network_errors() -> tuple[type[Exception], ...]:
    """requests' exceptions, when it is installed (only the https backend needs it)."""
    if importlib.util.find_spec("requests") is None:
        return ()
    import requests

    return (requests.RequestException,)


def _network_message(exc: Exception, where: str) -> str:
    if "SSLError" in {t.__name__ for t in type(exc).__mro__}:
        return (f"cannot verify the TLS certificate of {where}: set api.verify_ssl to the "
                "cluster's CA file (/etc/pve/pve-root-ca.pem)")
    return f"cannot reach the Proxmox API at {where}: {type(exc).__name__}"


class Api:
    """A few calls of the Proxmox API; every failure becomes a PvecleanError with one line."""

    def __init__(self, prox: Any, where: str, user: str, backend: str = "local") -> None:
        self.prox = prox
        self.where = where
        self.user = user
        self.backend = backend

    def _call(self, method: str, path: str, **args: Any) -> Any:
        from proxmoxer.core import ResourceException

        try:
            return getattr(self.prox(path.strip("/")), method)(**args)
        except ResourceException as exc:
            if (method != "get" and exc.status_code == 500
                    and lock_chatter_only(str(exc.content or ""))):
                return None  # pvesh waited for the config lock, then the change went through
            raise PvecleanError(self._explain(exc, method, path), ExitCode.ACCESS) from None
        except _network_errors() as exc:
            raise PvecleanError(_network_message(exc, self.where), ExitCode.ACCESS) from None
        except subprocess.TimeoutExpired:
            raise PvecleanError(f"pvesh {method} {path} did not answer in {TIMEOUT} s",
                                ExitCode.ACCESS) from None
        except FileNotFoundError as exc:  # the local backend on a host without pvesh
            raise PvecleanError(
                f"{exc.filename or 'pvesh'} not found: api.backend local runs pvesh on a "
                "Proxmox VE host; elsewhere use api.backend https", ExitCode.ACCESS) from None

    def _explain(self, exc: Any, method: str, path: str) -> str:
        text = " ".join(str(exc.content or exc.status_message or "").split())
        if exc.errors:
            text += f" ({exc.errors})"
        if exc.status_code == 595:
            node = path.split("/")[2] if path.startswith("/nodes/") else "?"
            return f"node '{node}' is offline or unreachable ({text})"
        if exc.status_code == 403 and "hookscript" in text:
            return (f"Proxmox refused it: {text}; set api.user to {ROOT_USER} "
                    f"(now {self.user})")
        return f"{method.upper()} {path}: {text or exc.status_code}"

    # ---- reading ------------------------------------------------------------------------
    def nodes(self) -> dict[str, bool]:
        """Node name -> online, by cluster membership (/cluster/status, from corosync through
        pmxcfs; a standalone node lists itself). Not /nodes: that says `online` only while
        pvestatd's data is under 5 minutes old (API2Tools::extract_node_stats), and a
        pvestatd hung on a dead NFS storage would make every node look offline."""
        return {str(n["name"]): bool(int(n.get("online") or 0))
                for n in self._call("get", "/cluster/status") if n.get("type") == "node"}

    def stale_nodes(self, members: dict[str, bool]) -> list[str]:
        """Member nodes online whose pvestatd has not reported for 5 minutes (/nodes says
        `unknown`): their guests' states in /cluster/resources are old. A hint only."""
        try:
            listed = self._call("get", "/nodes")
        except PvecleanError:
            return []
        return sorted(str(n.get("node")) for n in listed or ()
                      if members.get(str(n.get("node"))) and n.get("status") == "unknown")

    def local_node(self) -> str:
        """This machine's node: the one pvesh runs on (local backend); with the https
        backend the local machine's node name, not whatever node api.host is."""
        if self.backend != "local":
            return nodename()
        for item in self._call("get", "/cluster/status"):
            if item.get("type") == "node" and int(item.get("local") or 0):
                return str(item["name"])
        raise PvecleanError(f"the API at {self.where} names no local node", ExitCode.ACCESS)

    def containers(self, kind: str = "lxc") -> list[Container]:
        """The cluster's guests of `kind` (lxc: containers; qemu: VMs)."""
        out = []
        for r in self._call("get", "/cluster/resources", type="vm"):
            if r.get("type") != kind:
                continue
            out.append(Container(int(r["vmid"]), str(r["node"]), str(r.get("name") or ""),
                                 str(r.get("status") or "unknown"), r.get("lock") or None,
                                 bool(int(r.get("template") or 0)), kind))
        return sorted(out, key=lambda c: c.vmid)

    def ct_config(self, node: str, vmid: int, kind: str = "lxc", current: bool = True
                  ) -> pveconf.CtConfig:
        """The config in force (current=1): without it the API merges pending changes
        (PVE::AbstractConfig::load_current_config). A VM's (`kind` qemu) the same way;
        `current` False: pending changes merged (a VM's next start applies them before its
        pre-start: vm_start_nolock's vmconfig_apply_pending)."""
        return config_from_api(vmid, self._call("get", f"/nodes/{node}/{kind}/{vmid}/config",
                                                **({"current": 1} if current else {})))

    def ct_status(self, node: str, vmid: int) -> str:
        """Live state from the node (PVE::LXC::vmstatus); /cluster/resources lags ~10 s."""
        d = self._call("get", f"/nodes/{node}/lxc/{vmid}/status/current")
        return str((d or {}).get("status") or "unknown")

    def storage(self, name: str) -> Storage:
        d = self._call("get", f"/storage/{name}")
        kind = str(d.get("type") or "")
        content = [c for c in str(d.get("content") or "").split(",") if c]
        shared = bool(int(d.get("shared") or 0)) or kind in ALWAYS_SHARED
        return Storage(name, kind, d.get("path") or None, content, shared,
                       content_dirs(d.get("content-dirs")))

    def snippets(self, node: str, storage: str) -> set[str]:
        """Volume IDs of the snippets on this node's view of the storage."""
        items = self._call("get", f"/nodes/{node}/storage/{storage}/content", content="snippets")
        return {str(i["volid"]) for i in items if i.get("volid")}

    # ---- changing -----------------------------------------------------------------------
    def set_hookscript(self, node: str, vmid: int, volid: str, digest: str | None = None,
                       kind: str = "lxc") -> None:
        """With the `digest` of the config it was planned on, Proxmox refuses the change if
        the config changed since (PVE::AbstractConfig's assert_if_modified): a hookscript set
        in between is never overwritten unchained."""
        self._call("put", f"/nodes/{node}/{kind}/{vmid}/config", hookscript=volid,
                   **({"digest": digest} if digest else {}))

    def delete_hookscript(self, node: str, vmid: int, digest: str | None = None,
                          kind: str = "lxc") -> None:
        self._call("put", f"/nodes/{node}/{kind}/{vmid}/config", delete="hookscript",
                   **({"digest": digest} if digest else {}))

    def set_storage_content(self, storage: str, content: list[str]) -> None:
        self._call("put", f"/storage/{storage}", content=",".join(content))


def config_from_api(vmid: int, data: dict[str, Any]) -> pveconf.CtConfig:
    """The API's config (raw lxc.* keys come as `lxc: [[key, value], ...]`) as a CtConfig."""
    lines = [(k, str(v)) for k, v in sorted(data.items()) if k not in ("lxc", "digest")]
    for pair in data.get("lxc") or []:
        if isinstance(pair, list | tuple) and len(pair) == 2:
            lines.append((str(pair[0]), str(pair[1])))
    digest = data.get("digest")
    return pveconf.CtConfig(vmid, lines, digest=str(digest) if digest else None)


def connect(cfg: Config) -> Api:
    """The API as the config's `api` section says; bad settings are usage errors."""
    from proxmoxer import ProxmoxAPI
    from proxmoxer.core import AuthenticationError

    a = cfg.api
    user = str(a.get("user") or ROOT_USER)
    if "!" in user:
        raise PvecleanError(
            f"api.user '{user}' is an API token: Proxmox lets only {ROOT_USER} set or delete "
            f"hookscripts, with a password login; set api.user: {ROOT_USER} and "
            "api.password_file (or use api.backend: local on the host)", ExitCode.USAGE)
    if a.get("backend") == "local":
        return Api(ProxmoxAPI(backend="local", timeout=TIMEOUT), "pvesh on this host", ROOT_USER)
    host, pwfile = a.get("host"), a.get("password_file")
    if not host or not pwfile:
        raise PvecleanError("api.backend https needs api.host and api.password_file",
                            ExitCode.USAGE)
    try:
        password = Path(pwfile).read_text(encoding="utf-8").strip("\n")
    except OSError as exc:
        raise PvecleanError(f"cannot read api.password_file {pwfile}: {exc.strerror}",
                            ExitCode.USAGE) from None
    where = f"https://{host}"
    if importlib.util.find_spec("requests") is None:
        raise PvecleanError("api.backend https needs the Python package 'requests' "
                            "(apt install python3-requests, or pip install requests)",
                            ExitCode.USAGE)
    try:
        prox = ProxmoxAPI(host, backend="https", user=user, password=password,
                          verify_ssl=a.get("verify_ssl", True), timeout=TIMEOUT)
    except AuthenticationError:
        raise PvecleanError(f"login as {user} at {where} failed: check api.user and "
                            "api.password_file", ExitCode.ACCESS) from None
    except _network_errors() as exc:
        raise PvecleanError(_network_message(exc, where), ExitCode.ACCESS) from None
    return Api(prox, where, user, backend="https")
