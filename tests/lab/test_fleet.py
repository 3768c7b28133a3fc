"""The fleet view with the real parts: Debian's prometheus-node-exporter (textfile collector on
pveclean's directory) and prometheus (pveclean's rules) on loopback ports, asked through
Prometheus' HTTP query API what `pveclean metrics` wrote of the seeds' situation."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.lxclab import Lab
from tests.harness.scenarios import seeds

RULES = Path(__file__).resolve().parents[2] / "config" / "prometheus" / "pveclean.rules.yml"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prom:
    """node_exporter and prometheus, started for one test, stopped by it."""

    def __init__(self, node_exporter: str, prometheus: str, textfile: Path, root: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        ne, pr = _port(), _port()
        self.url = f"http://127.0.0.1:{pr}"
        rules = yaml.load(RULES.read_text(), Loader=yaml.CSafeLoader)
        for g in rules["groups"]:  # the lab cannot wait minutes: each alert fires at once
            for r in g["rules"]:
                r["for"] = "0s"
        (root / "rules.yml").write_text(yaml.dump(rules, Dumper=yaml.CSafeDumper))
        (root / "prometheus.yml").write_text(yaml.dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(root / "rules.yml")],
            "scrape_configs": [{"job_name": "node",
                                "static_configs": [{"targets": [f"127.0.0.1:{ne}"]}]}]},
            Dumper=yaml.CSafeDumper))
        log = open(root / "log", "ab")  # noqa: SIM115 -- the children's, closed with them
        self.log = log
        self.procs.append(subprocess.Popen(
            [node_exporter, f"--web.listen-address=127.0.0.1:{ne}", "--collector.disable-defaults",
             "--collector.textfile", f"--collector.textfile.directory={textfile}"],
            stdout=log, stderr=log))
        self.procs.append(subprocess.Popen(
            [prometheus, f"--config.file={root / 'prometheus.yml'}",
             f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{pr}"],
            stdout=log, stderr=log))

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait(self, expr: str, ok: Any, timeout: float = 30) -> list[dict[str, Any]]:
        end = time.monotonic() + timeout
        got: list[dict[str, Any]] = []
        while time.monotonic() < end:
            try:
                got = self.query(expr)
                if ok(got):
                    return got
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        raise AssertionError(f"{expr}: {got} after {timeout} s")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()


def _need(name: str, path: str) -> str:
    if not os.access(path, os.X_OK):
        pytest.skip(f"{name} not installed ({path}; make lab-deps installs it)")
    return path


@pytest.fixture
def prom(lab: Lab, tmp_path: Path) -> Iterator[Prom]:
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    p = Prom(_need("prometheus-node-exporter", "/usr/bin/prometheus-node-exporter"),
             _need("prometheus", "/usr/bin/prometheus"), textfile, tmp_path)
    p.textfile = textfile  # type: ignore[attr-defined]
    try:
        yield p
    finally:
        p.stop()


def _by_gpu(result: list[dict[str, Any]]) -> dict[str, float]:
    return {r["metric"]["gpu"]: float(r["value"][1]) for r in result}


def _parsers_accept(path: Path, promtool: str) -> None:
    """The official parser reads it, each family typed; promtool's linter has nothing to say."""
    from prometheus_client.parser import text_string_to_metric_families

    fams = list(text_string_to_metric_families(path.read_text()))
    assert fams and all(f.type in ("gauge", "counter") and f.samples for f in fams), path
    r = subprocess.run([promtool, "check", "metrics"], input=path.read_text(),
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def test_the_map_in_prometheus_shows_a_containers_holders_until_cleanup_and_a_leak_fires(
        lab: Lab, vmid: int, prom: Prom, promtool: str) -> None:
    textfile: Path = prom.textfile  # type: ignore[attr-defined]
    lab.write_config(metrics_path=str(textfile / "pveclean.prom"))
    seeds(lab, vmid, host=False)
    jobs = textfile.parent / "dcgm-jobs"
    r = lab.pveclean("metrics", "--textfile-dir", str(textfile), "--dcgm-job-dir", str(jobs))
    assert r.returncode == 0, r.stderr
    assert not [p for p in textfile.iterdir() if p.name.startswith(".")]  # no temp left
    for i in range(4):  # dcgm-exporter's job mapping: other labs on this host may add theirs
        assert f"lxc/{vmid}" in (jobs / str(i)).read_text().splitlines()
    view = json.loads(lab.pveclean("gpus", "--json").stdout)
    expected = {str(g["index"]): float(sum(1 for p in g["processes"] if p["vmid"] == vmid))
                for g in view["gpus"]}
    assert all(n > 0 for n in expected.values()) and len(expected) == 4
    ident = f"lxc/{vmid}"
    got = prom.wait(f'pveclean_gpu_holders{{id="{ident}"}}', lambda x: len(x) == 4)
    assert _by_gpu(got) == expected
    one = got[0]["metric"]
    assert one["owner_type"] == "lxc" and one["node"] == os.uname().nodename
    assert one["UUID"].startswith("GPU-") and len(one["pci_bus_id"]) == len("00000000:01:00.0")
    mem = _by_gpu(prom.query(f'pveclean_gpu_memory_bytes{{id="{ident}"}}'))
    assert all(v > 0 for v in mem.values()) and len(mem) == 4
    assert prom.query(f'pveclean_container_running{{id="{ident}"}}')[0]["value"][1] == "1"

    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert lab.pveclean("metrics", "--textfile-dir", str(textfile)).returncode == 0
    prom.wait(f'sum(pveclean_gpu_holders{{id="{ident}"}}) or vector(0)',
              lambda x: x and float(x[0]["value"][1]) == 0)
    for written in ("pveclean.prom", "pveclean_gpus.prom"):
        _parsers_accept(textfile / written, promtool)
    runs = prom.wait(f'pveclean_runs_total{{id="{ident}",phase="manual"}}', lambda x: x)
    assert [(r["metric"]["verdict"], r["value"][1]) for r in runs] == [("clean", "1")]
    assert prom.query('ALERTS{alertname="PvecleanGpuMemoryUnaccounted"}') == []

    lab.nvml.leak(1, 1000)
    assert lab.pveclean("metrics", "--textfile-dir", str(textfile)).returncode == 0
    fired = prom.wait('ALERTS{alertname="PvecleanGpuMemoryUnaccounted",alertstate="firing"}',
                      lambda x: x)
    assert [a["metric"]["gpu"] for a in fired] == ["1"]


def test_a_run_that_nobody_logged_says_so_in_its_report(lab: Lab, vmid: int,
                                                        tmp_path: Path) -> None:
    lab.write_config(syslog=True, syslog_socket=str(tmp_path / "no-log"),
                     journal_socket=str(tmp_path / "no-journal"))
    lab.create_ct(vmid, gpus=(0,), start=False)
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    (path,) = lab.report_dir.glob(f"{vmid}-manual-*.yaml")
    rep = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
    assert rep["notify_errors"] == [
        f"the run was not logged: neither the journal ({tmp_path}/no-journal) nor syslog "
        f"({tmp_path}/no-log) took it"]
    shown = lab.pveclean("reports", "show", str(path))
    assert "not said: the run was not logged: neither the journal" in shown.stdout, shown


def test_a_runs_journal_entry_has_fields_naming_the_report_it_wrote(lab: Lab, vmid: int,
                                                                    tmp_path: Path) -> None:
    path = tmp_path / "journal.socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    try:
        lab.write_config(syslog=True, journal_socket=str(path),
                         syslog_socket=str(tmp_path / "no-log"))
        lab.create_ct(vmid, gpus=(0,))
        lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 512})
        assert lab.pveclean("ct", str(vmid)).returncode == 0
        entry = sock.recv(1 << 16)
    finally:
        sock.close()
    fields = dict(line.split("=", 1) for line in entry.decode().splitlines() if "=" in line)
    (report,) = lab.report_dir.glob(f"{vmid}-manual-*.yaml")
    assert fields["PVECLEAN_VMID"] == str(vmid) and fields["PVECLEAN_PHASE"] == "manual"
    assert fields["PVECLEAN_VERDICT"] == "clean" and fields["SYSLOG_IDENTIFIER"] == "pveclean"
    assert fields["PVECLEAN_REPORT"] == str(report)  # named before it was written: the same
    assert "notify_errors" not in yaml.load(report.read_text(), Loader=yaml.CSafeLoader)


def test_metrics_reads_a_host_process_that_held_nothing_again_within_roll_runs(
        lab: Lab, tmp_path: Path) -> None:
    """The timer's budget: a host process that held no GPU node is not read on every run,
    but again within ROLL runs (at its own phase), so one that opens a node later shows by
    then; a new process is read at once."""
    from pveclean.commands.metrics import ROLL

    lab.write_config(state_dir=str(lab.root / "state"))
    textfile = tmp_path / "textfile"
    node = str(lab.nodes["nvidia0"])
    late = subprocess.Popen([sys.executable, "-c", "import os, sys, time; "
                             "sys.stdin.readline(); fd = os.open(sys.argv[1], os.O_RDWR); "
                             "time.sleep(300)", node], stdin=subprocess.PIPE, text=True)
    try:
        def holders() -> float:
            r = lab.pveclean("metrics", "--textfile-dir", str(textfile))
            assert r.returncode == 0, r.stderr
            from prometheus_client.parser import text_string_to_metric_families

            return sum(s.value for f in text_string_to_metric_families(
                (textfile / "pveclean_gpus.prom").read_text())
                if f.name == "pveclean_gpu_holders" for s in f.samples
                if s.labels["owner_type"] == "node")

        assert holders() == 0  # run 0: everything read, `late` holds nothing yet
        from dataclasses import replace

        from pveclean.commands.metrics import load_settled
        from pveclean.core.config import Config

        run, due = load_settled(replace(Config(), state_dir=str(lab.root / "state")))
        assert run == 1 and 1 <= due[late.pid] <= ROLL  # read again at its phase, not each run
        assert late.stdin is not None
        late.stdin.write("open\n")
        late.stdin.flush()
        time.sleep(0.3)
        seen = [holders() for _ in range(ROLL)]
        assert seen[-1] == 1 and 1 in seen, seen  # within ROLL runs
        early = lab.run_on_host("nvtop", hold=[node])  # new since: read at once
        assert holders() == 2
        assert early.popen is not None
    finally:
        late.kill()
        late.wait()
