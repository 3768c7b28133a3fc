"""`make bench` code works: its helpers, its load processes, and a tiny run (--quick) whose
output has the expected structure. No timing is asserted anywhere."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.bench import run as bench_run
from tests.bench.cleanup import METHODS, _said, holders_floor, method_label
from tests.bench.discovery import _steps, is_flat
from tests.bench.load import HostLoad, build_loadproc
from tests.bench.measure import median, spawn_like_proxmox
from tests.bench.settings import ALL_METHODS, BenchConfig, quick
from tests.bench.table import (
    Results,
    Row,
    Table,
    render_markdown,
    render_text,
    to_json,
    write_results,
)
from tests.harness.lxclab import Workload, lab_unavailable_reason
from tests.harness.scenarios import Seeds


def test_median_and_flatness() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([1.0, 2.0]) == 1.5
    with pytest.raises(ValueError):
        median([])
    assert is_flat([0.001, 0.0012]) is True  # linear
    assert is_flat([0.001, 0.0028]) is False  # quadratic growth: 2.8x per process
    assert is_flat([-0.00001, 0.00005]) is True  # noise under the floor
    assert is_flat([0.001]) is None


def test_steps_are_marginal_costs() -> None:
    from tests.bench.discovery import Point

    pts = [Point(50, 50, [1.0], [0.5], None), Point(200, 200, [1.3], [0.6], None),
           Point(500, 500, [1.9], [0.7], None)]
    steps = _steps(pts, lambda p: median(p.cli))
    assert steps == pytest.approx([0.002, 0.002])


def test_holders_floor_is_the_slowest_holder_under_the_policy() -> None:
    w = Workload(None, "t", Path("/nonexistent"))
    s = Seeds(1, workers=[w] * 4, vllm=w, nccl=w)
    assert holders_floor(s, term_delay_ms=300, grace_s=1.0) == 1.0  # nccl: SIGKILL at grace
    assert holders_floor(s, term_delay_ms=3000, grace_s=1.0) == 1.0  # others killed at grace
    assert holders_floor(s, term_delay_ms=300, grace_s=0.1) == pytest.approx(0.1)


def test_recipe_labels_and_output_filter() -> None:
    assert set(METHODS) == set(ALL_METHODS)
    assert "sleep 5;" in method_label("host-fuser", BenchConfig())
    assert "sleep 0.1;" in method_label("host-fuser", quick())
    said = _said("Cannot stat file /proc/1/fd/0: Permission denied\n/dev/nvidia0:  m\n"
                 "/bin/sh: fuser: not found\n/bin/sh: fuser: not found\n")
    assert said == "/bin/sh: fuser: not found"


def test_tables_render_as_text_markdown_and_json(tmp_path: Path) -> None:
    res = Results({"date": "2026-01-01T00:00:00+00:00", "uname": "Linux x", "nproc": 2,
                   "cpu": "cpu", "memory_gib": 1.0, "python": "3.11",
                   "load_avg_at_start": [0.0, 0.0, 0.0]})
    res.targets = [Row("Hook", "pre-stop: wall", "100 ms", "< 300 ms", True),
                   Row("Discovery", "a | b", "1x", ">= 10x", False),
                   Row("Cleanup", "info", "x")]
    res.details = [Table("Detail", ["A", "B"], [["1", "2"]], ["a note"])]
    res.total_seconds = 12.0
    text = render_text(res)
    assert "date: 2026-01-01" in text and "nproc: 2" in text and "NOT met" in text
    md = render_markdown(res)
    assert "| Section | Measure | Result | Target | Met |" in md
    assert "a \\| b" in md  # pipes in cells are escaped
    data = to_json(res)
    assert [t["verdict"] for t in data["targets"]] == ["met", "NOT met", "-"]
    assert data["details"][0]["rows"] == [["1", "2"]]
    md_path, js_path = write_results(res, tmp_path)
    assert md_path.read_text() == md
    assert json.loads(js_path.read_text())["machine"]["nproc"] == 2
    assert (tmp_path / "latest.json").exists()


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_host_load_processes_hold_fds_and_go_away() -> None:
    try:
        binary = build_loadproc()
    except RuntimeError as exc:
        pytest.skip(f"cannot build the static load helper: {exc}")
    with HostLoad(fds=20, binary=binary) as load:
        load.grow_to(3)
        load.grow_to(5)
        pgids = load.pgids()
        members = [int(p) for p in os.listdir("/proc") if p.isdigit()
                   and _pgid(int(p)) in pgids]
        assert len(members) == 5 + 2  # two batches: five children and their two parents
        children = [p for p in members if p not in pgids]
        assert all(_fd_count(p) == 23 for p in children)  # stdin/out/err + 20
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) in pgids]


def _pgid(pid: int) -> int | None:
    """Process group of a process (zombies included), None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rfind(")") + 2:].split()[2])


def test_hook_spawn_is_like_proxmox(tmp_path: Path) -> None:
    sh = shutil.which("sh")
    assert sh is not None
    r = spawn_like_proxmox([sh, "-c", "echo \"$PATH $LC_ALL ${HOME:-nohome}\"; cat; echo end"],
                           tmp_path)
    assert r.returncode == 0
    assert r.output.splitlines() == ["/sbin:/bin:/usr/sbin:/usr/bin C nohome", "end"]
    assert r.max_rss_kib > 0 and r.seconds > 0


def test_unavailable_lab_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_run, "lab_unavailable_reason", lambda: "no lab here")
    assert bench_run.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert err == "bench: the lab cannot run here: no lab here\n"


@pytest.mark.lab
def test_quick_bench_run_has_every_section(tmp_path: Path) -> None:
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(f"lab: {reason}")
    assert bench_run.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {"date", "uname", "nproc", "cpu"} <= set(data["machine"])
    sections = {t["section"] for t in data["targets"]}
    assert sections == {"Discovery", "Growth", "Cleanup", "Hook", "Start-up", "Gpus",
                        "Metrics", "Bloat", "Report bloat", "Settle", "Peak memory"}
    assert all(t["verdict"] in ("met", "NOT met", "-") for t in data["targets"])
    assert not [t for t in data["targets"] if t["measure"] == "section failed"]
    assert set(data["raw"]) >= {"discovery", "growth", "cleanup", "hooks", "imports", "gpus",
                                "metrics", "report-bloat", "settle"}
    # every tool sees the same holders; counts of the cleanup are exact, not timings
    for level in data["raw"]["discovery"]["levels"]:
        assert set(level["found"].values()) == {quick().ct_holders}
    cleanup = {m: outs[0] for m, outs in data["raw"]["cleanup"].items()}
    assert set(cleanup) == set(ALL_METHODS)
    assert cleanup["pveclean"]["holders_left"] == [] and cleanup["pveclean"]["freed"]
    assert cleanup["pveclean"]["unrelated_killed"] == []
    assert sorted(cleanup["host-fuser"]["unrelated_killed"]) == ["host daemon",
                                                                 "other CT's worker"]
    assert len(cleanup["ct-ps-busybox"]["holders_left"]) == 6
    hooks = data["raw"]["hooks"]
    assert set(hooks) == {"pre-start", "post-start", "pre-stop", "pre-stop-slow-pct", "version"}
    assert all(r["returncode"] == 0 for runs in hooks.values() for r in runs)
    md = (tmp_path / "latest.md").read_text()
    assert "| Section | Measure | Result | Target | Met |" in md
