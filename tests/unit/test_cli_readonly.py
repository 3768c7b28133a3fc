"""Read-only means read-only: a dry run and `status` write no report, no syslog line and no
metrics (a look must not silence an alert on the last verdict), with each sink watched; and
`status` counts GPUs, not the config lines that grant them."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pveclean.commands.cli import run_app
from pveclean.commands.gpuview import render_status
from pveclean.commands.status import collect
from pveclean.host import configfile
from pveclean.proxmox import pveapi
from tests.helpers import Cluster


@dataclass
class Sinks:
    config: Path
    reports: Path
    metrics: Path
    syslog: socket.socket

    def look(self) -> tuple[list[str], bytes | None, list[bytes]]:
        """What the sinks hold now: report files, the metrics file, syslog datagrams."""
        lines = []
        while True:
            try:
                lines.append(self.syslog.recv(1 << 16))
            except BlockingIOError:
                break
        files = sorted(p.name for p in self.reports.glob("*")) if self.reports.exists() else []
        return files, self.metrics.read_bytes() if self.metrics.exists() else None, lines


def _sinks(tmp: Path, config: Path) -> Iterator[Sinks]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp / "log.sock"))
    sock.setblocking(False)
    data = yaml.safe_load(config.read_text())
    data.update(report_dir=str(tmp / "reports"), syslog=True,
                syslog_socket=str(tmp / "log.sock"), metrics_path=str(tmp / "pveclean.prom"))
    config.write_text(yaml.safe_dump(data))
    try:
        yield Sinks(config, tmp / "reports", tmp / "pveclean.prom", sock)
    finally:
        sock.close()


@pytest.fixture
def stopped_ct(tmp_path: Path) -> Iterator[Sinks]:
    """CT 130 with a GPU, stopped (its cgroup is absent), and pveclean's three sinks."""
    (tmp_path / "lxc").mkdir()
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "lxc/130.conf").write_text("arch: amd64\nhostname: t130\n"
                                           "dev0: /dev/nvidia0,gid=44\n")
    cfg = tmp_path / "pveclean.yaml"
    cfg.write_text(yaml.safe_dump({"pve_config_dir": str(tmp_path / "lxc"),
                                   "state_dir": str(tmp_path / "state"),
                                   "cgroup_root": str(tmp_path / "cgroup")}))
    cfg.chmod(0o644)
    yield from _sinks(tmp_path, cfg)


def test_a_dry_run_writes_no_report_no_syslog_no_metrics(
        stopped_ct: Sinks, capfd: pytest.CaptureFixture[str]) -> None:
    s = stopped_ct
    assert run_app(["ct", "130", "-c", str(s.config)]) == 0  # a real run: each sink gets it
    files, metrics, lines = s.look()
    assert len(files) == 1 and metrics and len(lines) == 1, (files, metrics, lines)
    assert b'verdict="nothing-to-do"} 1' in metrics
    stat = s.metrics.stat()
    capfd.readouterr()
    for extra in ([], ["--json"]):
        assert run_app(["ct", "130", "--dry-run", "-c", str(s.config), *extra]) == 0
        assert s.look() == (files, metrics, [])
        assert s.metrics.stat().st_mtime_ns == stat.st_mtime_ns
    out = capfd.readouterr().out
    assert "report:" not in out
    shown = json.loads(out[out.index("\n{") + 1:])
    assert shown["verdict"] == "dry-run" and not [k for k in shown if k.startswith("_")], shown


def test_a_dry_run_report_goes_only_where_the_admin_asks(
        stopped_ct: Sinks, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    s = stopped_ct
    kept = tmp_path / "kept" / "ct130.yaml"
    kept.parent.mkdir()
    args = ["ct", "130", "--dry-run", "--report-file", str(kept), "-c", str(s.config)]
    assert run_app(args) == 0
    assert s.look() == ([], None, [])
    saved = yaml.safe_load(kept.read_text())
    assert saved["verdict"] == "dry-run" and saved["vmid"] == 130 and "_started" not in saved
    assert kept.stat().st_mode & 0o777 == 0o600
    capfd.readouterr()
    assert run_app(args) == 4  # never over another file
    assert "cannot write the report to" in capfd.readouterr().err
    assert yaml.safe_load(kept.read_text()) == saved


def test_status_writes_no_report_no_syslog_no_metrics(cluster: Cluster) -> None:
    # CT 101 runs on this node with a GPU: status looks at its holders (a dry run)
    (cluster.tmp / "lxc/101.conf").write_text("arch: amd64\ndev0: /dev/nvidia0,gid=44\n")
    for s in _sinks(cluster.tmp, cluster.config):
        assert run_app(["status", "--json", "-c", str(s.config)]) == 0
        assert s.look() == ([], None, [])


FOUR_GPUS_DEV = {**{f"dev{i}": f"/dev/nvidia{i},gid=44" for i in range(4)},
                 "dev4": "/dev/nvidiactl,gid=44", "dev5": "/dev/nvidia-uvm,gid=44"}
FOUR_GPUS_LXC = [["lxc.cgroup2.devices.allow", "c 195:* rwm"],
                 *[["lxc.mount.entry", f"/dev/{n} dev/{n} none bind,optional,create=file"]
                   for n in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl")]]


def test_status_counts_gpus_not_config_lines(cluster: Cluster) -> None:
    pve = cluster.pve
    pve.add_ct(129, node="pve1", config=FOUR_GPUS_DEV)  # 6 lines, 4 GPUs: the demo's CT
    pve.add_ct(131, node="pve1", config={"lxc": FOUR_GPUS_LXC})  # 6 lines, 4 GPUs
    pve.add_ct(132, node="pve1", config={"lxc": [["lxc.mount.entry",
                                                  "/dev dev none bind,optional 0 0"]]})
    cfg = configfile.load(cluster.config)
    view = collect(pveapi.connect(cfg), cfg, with_holders=False)
    ct = {e["vmid"]: e for e in view.as_dict()["containers"]}  # type: ignore[attr-defined]
    assert (len(ct[129]["gpu"]), ct[129]["gpus"]) == (6, [0, 1, 2, 3])
    assert (len(ct[131]["gpu"]), ct[131]["gpus"]) == (6, [0, 1, 2, 3])
    assert ct[132]["gpus"] is None and ct[102]["gpus"] == []
    rows = {line.split()[0]: line.split() for line in render_status(view).splitlines()
            if line[:1].isdigit()}
    assert rows["129"][3] == "4" and rows["131"][3] == "4" and rows["132"][3] == "all"
    assert rows["101"][3] == "1" and rows["102"][3] == "0"
