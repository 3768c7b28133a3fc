"""A `pvesh` stand-in for the lab, for proxmoxer's `local` backend. Stdlib only.

Answers the few API paths pveclean's install, uninstall and status use, from the lab's files
(<lab>/etc/pve/lxc/*.conf, <lab>/etc/pve/storage.cfg) as a standalone PVE node would:
`pvesh get|set PATH [-key value ...] [--output-format json]`. Container config changes go
through the pct stand-in's `set` (same config lock and its stderr chatter, lock check and
hookscript checks). Errors go to stderr with exit code 255, as pvesh does. Each answer names
the Proxmox handler it mirrors:
- GET /nodes/{n}/lxc/{id}/config: PVE::API2::LXC::Config get_config ->
  PVE::AbstractConfig::load_current_config: pending changes merged unless current=1;
- GET /cluster/resources: PVE::API2::Cluster resources: status/name/template come from
  pvestatd's broadcast, which lags (PVE::Service::pvestatd, a round every 10 s): `unknown`
  until its first round;
- GET /nodes: PVE::API2::Nodes index -> PVE::API2Tools::extract_node_stats: `online` only
  while pvestatd's last round is under 5 minutes old (pmxcfs rrd_entry_is_old), else
  `unknown`; GET /cluster/status: PVE::API2::Cluster get_status, membership (a standalone
  node lists itself, online). `<lab>/run/pvestatd.hung` stops pvestatd's rounds;
- GET|PUT /nodes/{n}/qemu/{id}/config: PVE::API2::Qemu's vm_config and update_vm, as the
  container's (the qm stand-in's VmLab); VMs are in /cluster/resources as type qemu;
- GET /nodes/{n}/lxc/{id}/status/current: PVE::API2::LXC::Status vm_status ->
  PVE::LXC::vmstatus, live;
- GET /nodes/{n}/storage/{s}/content: PVE::API2::Storage::Content index ->
  PVE::Storage::volume_list: [] when the storage lacks the content type; files from
  PVE::Storage::Plugin::get_subdir (content-dirs honoured).
Usage: pvesh.py --lab DIR <get|set> PATH ...
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pct  # noqa: E402  (the pct stand-in, next to this file)
import qm  # noqa: E402  (the qm stand-in: VMs' configs and state)

NODE = pct.NODE


def install(lab_root: Path) -> Path:
    """Write <lab>/bin/pvesh; put <lab>/bin first in PATH for pveclean to find it."""
    path = lab_root / "bin" / "pvesh"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__)}" --lab "{lab_root}" '
                    '"$@"\n')
    path.chmod(0o755)
    return path


def read_storage_cfg(path: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] not in " \t":
            kind, _, sid = line.partition(":")
            current = out[sid.strip()] = {"type": kind.strip()}
        elif current is not None:
            key, _, value = line.strip().partition(" ")
            current[key] = value.strip()
    return out


def write_storage_cfg(path: Path, cfg: dict[str, dict[str, str]]) -> None:
    text = ""
    for sid, opts in cfg.items():
        text += f"{opts['type']}: {sid}\n"
        text += "".join(f"\t{k} {v}\n" for k, v in opts.items() if k != "type") + "\n"
    path.write_text(text)


STATD_ROUND = 10.0  # seconds between pvestatd rounds (PVE::Service::pvestatd)
RRD_MAX_AGE = 300.0  # pmxcfs rrd_entry_is_old: a node's data older than this is not shown


def statd_last(lab: pct.Lab) -> float:
    """When pvestatd last reported (its rounds run on every API read unless it is hung)."""
    statd_round(lab)
    try:
        return float(json.loads((lab.root / "run/pvestatd.json").read_text())["time"])
    except (OSError, ValueError, KeyError):
        return 0.0


def ct_config(lab: pct.Lab, vmid: str, current: bool = False) -> dict[str, Any]:
    """PVE::AbstractConfig::load_current_config: without `current`, the [pve:pending]
    values replace the current ones and its `delete` list removes keys."""
    sections = lab.read_sections(vmid)
    lines = list(sections[""])
    pending = sections.get("pve:pending", [])
    if not current and pending:
        merged = dict((k, v) for k, v in lines if not k.startswith("lxc."))
        for k, v in pending:
            if k != "delete" and not k.startswith("lxc."):
                merged[k] = v
        for k in dict(pending).get("delete", "").split(","):
            merged.pop(k.strip().lstrip("!"), None)
        lines = list(merged.items()) + [kv for kv in lines if kv[0].startswith("lxc.")]
    data: dict[str, Any] = {}
    raw = []
    for k, v in lines:
        if k.startswith("lxc."):
            raw.append([k, v])
        else:
            data[k] = int(v) if v.isdigit() and k in ("memory", "swap", "cores") else v
    if raw:
        data["lxc"] = raw
    data["digest"] = pct.config_digest(lab, vmid)
    return data


def handle(lab: pct.Lab, method: str, path: str, opts: dict[str, str]) -> Any:
    storage_cfg = lab.root / "etc/pve/storage.cfg"
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "nodes" and parts[1] != NODE:  # a standalone node
        raise pct.PctError(f"no such cluster node '{parts[1]}'")
    if method == "get" and parts == ["cluster", "status"]:  # PVE::API2::Cluster get_status
        return [{"type": "node", "id": f"node/{NODE}", "name": NODE, "nodeid": 0, "ip": "127.0.0.1",
                 "local": 1, "online": 1, "level": ""}]
    if method == "get" and parts == ["nodes"]:  # PVE::API2::Nodes index
        fresh = time.time() - statd_last(lab) < RRD_MAX_AGE
        return [{"node": NODE, "id": f"node/{NODE}", "type": "node",
                 "status": "online" if fresh else "unknown"}]
    if method == "get" and parts == ["cluster", "resources"]:
        out = []
        if opts.get("type") not in (None, "vm"):
            return out
        seen = statd_round(lab)
        for conf in sorted(lab.confdir.glob("*.conf"), key=lambda p: int(p.stem)):
            vmid = conf.stem
            c = dict(lab.read_conf(vmid))
            # vmid, node, type, lock from the cluster file system: current; status from
            # pvestatd: what its last round saw, `unknown` before its first.
            item: dict[str, Any] = {"id": f"lxc/{vmid}", "type": "lxc", "vmid": int(vmid),
                                    "node": NODE, "name": c.get("hostname", ""),
                                    "status": seen.get(vmid, "unknown"), "template": 0}
            if c.get("lock"):
                item["lock"] = c["lock"]
            out.append(item)
        vms = qm.VmLab(lab.root)
        for conf in sorted(vms.confdir.glob("*.conf"), key=lambda p: int(p.stem)):
            c = dict(vms.read_conf(conf.stem))  # a VM's status: live here (qm's pidfile)
            out.append({"id": f"qemu/{conf.stem}", "type": "qemu", "vmid": int(conf.stem),
                        "node": NODE, "name": c.get("name", ""), "template": 0,
                        "status": "running" if vms.qemu_pid(conf.stem) else "stopped"})
        return out
    m = re.fullmatch(r"nodes/[^/]+/qemu/(\d+)/config", "/".join(parts))
    if m:  # PVE::API2::Qemu vm_config / update_vm: as the container's, on qemu-server/
        vms, vmid = qm.VmLab(lab.root), m.group(1)
        if not vms.conf_path(vmid).exists():
            raise pct.PctError(f"Configuration file 'nodes/{NODE}/qemu-server/{vmid}.conf' "
                               "does not exist")
        if method == "get":
            return ct_config(vms, vmid, current=opts.get("current") in ("1", "true"))
        args = [vmid]
        for key in ("hookscript", "delete"):
            if key in opts:
                args += [f"--{key}", opts[key]]
        pct.cmd_set(vms, args, opts.get("digest"))
        return None
    m = re.fullmatch(r"nodes/[^/]+/lxc/(\d+)/status/current", "/".join(parts))
    if m and method == "get":
        vmid = m.group(1)
        c = dict(lab.read_conf(vmid))
        st: dict[str, Any] = {"vmid": int(vmid), "status": lab.state(vmid), "type": "lxc",
                              "name": c.get("hostname", ""), "ha": {"managed": 0}}
        if c.get("lock"):
            st["lock"] = c["lock"]
        return st
    m = re.fullmatch(r"nodes/[^/]+/lxc/(\d+)/config", "/".join(parts))
    if m:
        vmid = m.group(1)
        if method == "get":
            return ct_config(lab, vmid, current=opts.get("current") in ("1", "true"))
        args = [vmid]
        if "hookscript" in opts:
            args += ["--hookscript", opts["hookscript"]]
        if "delete" in opts:
            args += ["--delete", opts["delete"]]
        if len(args) == 1:
            raise pct.PctError("no options specified")
        pct.cmd_set(lab, args, opts.get("digest"))
        return None
    if len(parts) == 2 and parts[0] == "storage":  # PVE::API2::Storage::Config read/update
        cfg = read_storage_cfg(storage_cfg)
        if parts[1] not in cfg:
            raise pct.PctError(f"storage '{parts[1]}' does not exist")
        if method == "get":
            return {**cfg[parts[1]], "storage": parts[1], "digest": "0" * 40}
        cfg[parts[1]].update({k: v for k, v in opts.items()
                              if k in ("content", "shared", "content-dirs")})
        write_storage_cfg(storage_cfg, cfg)
        return None
    m = re.fullmatch(r"nodes/[^/]+/storage/([^/]+)/content", "/".join(parts))
    if m and method == "get":
        opts_of = read_storage_cfg(storage_cfg).get(m.group(1))
        if opts_of is None:
            raise pct.PctError(f"storage '{m.group(1)}' does not exist")
        if "snippets" not in opts_of.get("content", "").split(","):
            return []  # PVE::Storage::volume_list: only the storage's content types
        sdir = lab.snippets_dir(m.group(1)) or Path("/nonexistent")
        files = sorted(p for p in sdir.glob("*") if p.is_file()) if sdir.is_dir() else []
        return [{"volid": f"{m.group(1)}:snippets/{p.name}", "content": "snippets",
                 "format": "snippet", "size": p.stat().st_size} for p in files]
    raise pct.PctError(f"No '{method}' handler defined for '{path}'")


def statd_round(lab: pct.Lab) -> dict[str, str]:
    """What pvestatd broadcast last: the answer uses the previous round's view; a new round
    (every STATD_ROUND s) records the states seen now, for later answers."""
    cache = lab.root / "run/pvestatd.json"
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        data = {"time": 0.0, "status": {}}
    seen: dict[str, str] = data["status"]
    hung = (lab.root / "run/pvestatd.hung").exists()
    if time.time() - data["time"] >= STATD_ROUND and not hung:
        now = {p.stem: lab.state(p.stem) for p in lab.confdir.glob("*.conf")}
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"time": time.time(), "status": now}))
    return seen


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--lab":
        print("usage: pvesh.py --lab DIR <get|set> PATH ...", file=sys.stderr)
        return 255
    lab = pct.Lab(Path(argv[1]))
    method, path, rest = argv[2], argv[3], argv[4:]
    opts: dict[str, str] = {}
    i = 0
    while i < len(rest):
        key = rest[i]
        if key == "--output-format":
            i += 2
            continue
        if not key.startswith("-") or i + 1 >= len(rest):
            print(f"400 unable to parse option '{key}'", file=sys.stderr)
            return 255
        opts[key.lstrip("-")] = rest[i + 1]
        i += 2
    try:
        result = handle(lab, method, path, opts)
    except pct.PctError as exc:
        print(str(exc), file=sys.stderr)
        return 255
    if result is not None:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
