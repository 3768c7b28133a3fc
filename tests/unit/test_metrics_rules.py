"""The shipped Prometheus rules and Grafana dashboard (config/prometheus): promtool accepts the
rules, each alert's `promtool test rules` case passes and fails once the rule's condition is
taken away, and the dashboard is JSON whose queries parse and name only known series."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pveclean.core import metrics, metrics_gpus, metrics_xid

DIR = Path(__file__).resolve().parents[2] / "config" / "prometheus"
RULES = DIR / "pveclean.rules.yml"
TESTS = DIR / "pveclean.rules.test.yml"
DASHBOARD = DIR / "pveclean-dashboard.json"
# documented by prometheus-pve-exporter and NVIDIA's dcgm-exporter (default counters)
PVE_EXPORTER = {"pve_guest_info", "pve_up", "pve_node_info", "pve_cpu_usage_ratio",
                "pve_memory_usage_bytes"}
DCGM_EXPORTER = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"}
OURS = set(metrics.RUN_FAMILIES) | set(metrics_gpus.FAMILIES) | set(metrics_xid.FAMILIES)
KNOWN = OURS | PVE_EXPORTER | DCGM_EXPORTER
PROMQL_WORDS = {"sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring",
                "group_left", "group_right", "and", "or", "unless", "time", "increase",
                "rate", "label_values", "bool", "offset", "vector", "absent", "topk"}


def _rules() -> list[dict[str, Any]]:
    data = yaml.load(RULES.read_text(), Loader=yaml.CSafeLoader)
    return [r for g in data["groups"] for r in g["rules"]]


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


def _series_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside braces, strings and
    durations that are not functions, keywords or label names of a by/on list."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = re.sub(r"\boffset\s+[0-9]+[smhdwy]", "", bare)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return {n for n in names if n not in PROMQL_WORDS and not n.startswith("$")}


def test_promtool_checks_the_rules(promtool: str) -> None:
    r = _run(promtool, "check", "rules", str(RULES), cwd=DIR)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in r.stdout


def test_every_rule_names_only_series_pveclean_writes() -> None:
    for rule in _rules():
        assert _series_names(rule["expr"]) <= OURS, rule["alert"]


def test_the_rule_tests_pass(promtool: str) -> None:
    r = _run(promtool, "test", "rules", str(TESTS), cwd=DIR)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_test_case() -> None:
    cases = yaml.load(TESTS.read_text(), Loader=yaml.CSafeLoader)["tests"]
    tested = {a["alertname"] for c in cases for a in c.get("alert_rule_test", [])
              if a.get("exp_alerts")}
    assert tested == {r["alert"] for r in _rules()}


@pytest.mark.parametrize("alert", [r["alert"] for r in _rules()])
def test_each_case_fails_without_its_rules_condition(alert: str, promtool: str,
                                                     tmp_path: Path) -> None:
    data = yaml.load(RULES.read_text(), Loader=yaml.CSafeLoader)
    for g in data["groups"]:
        for r in g["rules"]:
            if r["alert"] == alert:  # the same series, a condition that never holds
                r["expr"] = f"({r['expr']}) and on () vector(0) > 1"
    (tmp_path / RULES.name).write_text(yaml.dump(data, Dumper=yaml.CSafeDumper))
    shutil.copy(TESTS, tmp_path / TESTS.name)
    r = _run(promtool, "test", "rules", TESTS.name, cwd=tmp_path)
    assert r.returncode != 0 and alert in r.stdout + r.stderr, r.stdout + r.stderr


def _targets() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_the_dashboard_is_json_whose_queries_name_only_known_series() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["panels"] and _targets()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for expr in _targets():
        assert _series_names(expr) <= KNOWN, expr
    used = set().union(*(_series_names(e) for e in _targets()))
    for needed in ("pveclean_gpu_memory_bytes", "pveclean_gpu_holders",
                   "pveclean_last_verdict", "pveclean_gpu_unaccounted_memory_bytes"):
        assert needed in used
    var = dash["templating"]["list"][1]["query"]["query"]
    assert _series_names(var.replace("label_values", "")) - {"node"} <= OURS


def test_the_dashboards_queries_parse(promtool: str, tmp_path: Path) -> None:
    """Each query as a recording rule (Grafana's variables filled in): promtool parses it."""
    rules = [{"record": f"dashboard:query_{i}",
              "expr": e.replace("$node", "pve1").replace("$__rate_interval", "1m")}
             for i, e in enumerate(_targets())]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.dump({"groups": [{"name": "d", "rules": rules}]},
                              Dumper=yaml.CSafeDumper))
    r = _run(promtool, "check", "rules", str(path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_name_check_sees_a_series_it_does_not_know() -> None:
    assert _series_names('sum by (id) (nope_metric{a="b"}) * on (id) pve_up') == {
        "nope_metric", "pve_up"}
