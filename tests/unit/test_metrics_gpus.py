"""core/metrics_gpus: `pveclean gpus`' map as samples that join with pve-exporter (`id`) and
dcgm-exporter (`UUID`, `pci_bus_id`), read by prometheus_client's parser and promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pveclean.core import metrics, metrics_gpus
from tests.gpumaps import gmap, hostpci, pci, row, use, vfio

MIB = 1 << 20


DATA = gmap(
    [use(0, "0000:3b:00.0", [row(10, "ct", 129, mib=4000), row(11, "ct", 129, mib=3000),
                             row(12, "host", None, mib=300), row(13, "ct", 130, mib=None),
                             row(14, "unknown", None, mib=100)],
         uuid="GPU-aaa", used=9000, unaccounted_mib=0),
     use(1, "10000:01:00.0", [row(15, "ct", 129, mib=500)], uuid="GPU-bbb", used=1500,
         unaccounted_mib=1000),
     use(2, None, uuid="GPU-ccc", status="unavailable", unaccounted_mib=None)],
    vfio=[vfio("0000:41:00.0"), vfio("0000:43:00.0", driver=None)],
    hostnames={129: "", 130: ""}, seconds=0.25, warnings=["one"])
REFS = [hostpci(200, "0000:41:00"), hostpci(102, "0000:3b:00.0"), hostpci(300, "0000:99:00.0")]


def _samples(text: str) -> dict[str, list[Any]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _text() -> str:
    return metrics.render(metrics_gpus.families(DATA, "pve1", {129: True, 130: False}, REFS,
                                                1700000000.4))


def test_memory_and_holders_per_owner_with_pve_exporters_ids() -> None:
    s = _samples(_text())
    mem = {(x.labels["gpu"], x.labels["id"]): x.value for x in s["pveclean_gpu_memory_bytes"]}
    assert mem == {("0", "lxc/129"): 7000 * MIB, ("0", "node/pve1"): 300 * MIB,
                   ("0", "lxc/130"): 0, ("0", "unknown"): 100 * MIB, ("1", "lxc/129"): 500 * MIB}
    holders = {(x.labels["gpu"], x.labels["id"]): x.value for x in s["pveclean_gpu_holders"]}
    assert holders[("0", "lxc/129")] == 2 and holders[("0", "lxc/130")] == 1
    one = next(x for x in s["pveclean_gpu_memory_bytes"] if x.labels["id"] == "lxc/129")
    assert one.labels == {"node": "pve1", "gpu": "0", "UUID": "GPU-aaa",
                          "pci_bus_id": "00000000:3B:00.0", "owner_type": "lxc",
                          "id": "lxc/129"}
    types = {x.labels["id"]: x.labels["owner_type"] for x in s["pveclean_gpu_memory_bytes"]}
    assert types == {"lxc/129": "lxc", "lxc/130": "lxc", "node/pve1": "node",
                     "unknown": "unknown"}


def test_unaccounted_memory_vfio_vm_assignments_and_running() -> None:
    s = _samples(_text())
    leak = {x.labels["gpu"]: x.value for x in s["pveclean_gpu_unaccounted_memory_bytes"]}
    assert leak == {"0": 0, "1": 1000 * MIB}  # GPU 2: NVML could not read it, no figure
    assert {x.labels["pci_bus_id"]: x.labels["driver"] for x in s["pveclean_gpu_vfio"]} == {
        "00000000:41:00.0": "vfio-pci", "00000000:43:00.0": "none"}
    assigned = {(x.labels["pci_bus_id"], x.labels["id"]) for x in s["pveclean_gpu_vm_assigned"]}
    assert assigned == {("00000000:41:00.0", "qemu/200"), ("00000000:3B:00.0", "qemu/102")}
    running = {x.labels["id"]: x.value for x in s["pveclean_container_running"]}
    assert running == {"lxc/129": 1, "lxc/130": 0}
    assert [x.value for x in s["pveclean_gpus_up"]] == [1]
    assert [x.value for x in s["pveclean_gpus_last_success_timestamp_seconds"]] == [1700000000]
    assert [x.value for x in s["pveclean_gpus_warnings"]] == [1]
    total = {x.labels["gpu"] for x in s["pveclean_gpu_memory_total_bytes"]}
    assert total == {"0", "1"}


def test_every_family_keeps_one_label_set() -> None:
    for fam in text_string_to_metric_families(_text()):
        assert len({tuple(sorted(x.labels)) for x in fam.samples}) == 1, fam.name


def test_a_failed_look_keeps_when_the_map_was_last_whole() -> None:
    old = metrics.parse(_text())
    text = metrics.render(metrics_gpus.failed("pve1", 30.5, metrics_gpus.last_success(old)))
    s = _samples(text)
    assert set(s) == {"pveclean_gpus_up", "pveclean_gpus_last_success_timestamp_seconds",
                      "pveclean_gpus_collect_duration_seconds", "pveclean_gpus_warnings"}
    assert s["pveclean_gpus_up"][0].value == 0
    assert s["pveclean_gpus_last_success_timestamp_seconds"][0].value == 1700000000
    first = metrics.render(metrics_gpus.failed("pve1", 30.5, None))
    assert "last_success" not in first


@pytest.mark.parametrize(("sysfs", "dcgm"), [
    ("0000:3b:00.0", "00000000:3B:00.0"), ("10000:01:00.0", "00010000:01:00.0"),
    (None, "")])
def test_bus_ids_as_dcgm_exporter_writes_them(sysfs: str | None, dcgm: str) -> None:
    assert metrics_gpus.dcgm_bus_id(None if sysfs is None else pci(sysfs)) == dcgm


def test_promtool_accepts_the_map(promtool: str) -> None:
    r = subprocess.run([promtool, "check", "metrics"], input=_text(), capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def _hangs(*_args: Any) -> Any:
    import time

    time.sleep(60)


def test_a_look_past_the_deadline_writes_up_0_and_keeps_the_last_success(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import time

    from pveclean.commands import metrics as command
    from pveclean.core.config import Config
    from pveclean.errors import ExitCode, PvecleanError

    prom = tmp_path / command.FILE_NAME
    prom.write_text(_text())
    monkeypatch.setattr(command, "w_look", _hangs)  # a hung pmxcfs, a wedged process
    cfg = dataclasses.replace(Config(), deadline_seconds=1.0, state_dir=str(tmp_path / "state"),
                              kmsg_path=str(tmp_path / "kmsg"))
    t = time.monotonic()
    with pytest.raises(PvecleanError) as err:
        command.write(cfg, str(tmp_path))
    assert time.monotonic() - t < 10
    assert err.value.exit_code == ExitCode.ACCESS and "pveclean_gpus_up 0" in str(err.value)
    s = _samples(prom.read_text())
    assert [x.value for x in s["pveclean_gpus_up"]] == [0]
    assert [x.value for x in s["pveclean_gpus_last_success_timestamp_seconds"]] == [1700000000]
    assert "pveclean_gpu_holders" not in s  # no old map shown as current


def test_dcgm_job_mapping_files_name_the_guests_per_gpu_index(tmp_path: Path) -> None:
    from pveclean.commands.metrics import write_job_map

    assert metrics_gpus.job_map(DATA) == {"0": ["lxc/129", "lxc/130"], "1": ["lxc/129"]}
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "3").write_text("lxc/7\n")  # a GPU no guest holds any more
    (jobs / "notes").write_text("someone else's\n")
    write_job_map(str(jobs), metrics_gpus.job_map(DATA))
    assert sorted(p.name for p in jobs.iterdir()) == ["0", "1", "notes"]
    assert (jobs / "0").read_text() == "lxc/129\nlxc/130\n"
    assert (jobs / "1").read_text() == "lxc/129\n"
    assert oct((jobs / "0").stat().st_mode & 0o777) == oct(0o644)


def test_a_clean_host_process_is_read_again_every_roll_runs_at_its_own_phase(
        tmp_path: Path) -> None:
    """commands/metrics: the record of host processes that held nothing. Each is due again
    exactly ROLL runs after it was read, at a phase of its own (a fifth of them each run),
    a process gone is dropped, and an unreadable record means every process is read."""
    from dataclasses import replace

    from pveclean.commands import metrics as cmd
    from pveclean.core.config import Config

    cfg = replace(Config(), state_dir=str(tmp_path / "state"))
    assert cmd.load_settled(cfg) == (0, {})
    pids = list(range(1000, 1100))
    cmd.save_settled(cfg, 0, {}, pids, set(pids))
    run, due = cmd.load_settled(cfg)
    assert run == 1 and set(due) == set(pids)
    reads = {p: 0 for p in pids}
    for r in range(1, 1 + 3 * cmd.ROLL):
        run, due = cmd.load_settled(cfg)
        assert run == r
        now = [p for p in pids if due.get(p, 0) <= r]  # what this run reads
        assert len(now) == len(pids) // cmd.ROLL  # spread evenly, never all at once
        for p in now:
            reads[p] += 1
        cmd.save_settled(cfg, r, due, now, set(pids))
    assert set(reads.values()) == {3}  # each once every ROLL runs
    run, due = cmd.load_settled(cfg)
    cmd.save_settled(cfg, run, due, [], set(pids) - {1000})
    assert 1000 not in cmd.load_settled(cfg)[1]  # gone: dropped (a new 1000 is read at once)
    (tmp_path / "state" / cmd.SETTLED_FILE).write_text("{not json")
    assert cmd.load_settled(cfg) == (0, {})
