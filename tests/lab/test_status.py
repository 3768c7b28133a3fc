"""`pveclean status` on a lab host: GPUs, holders, the hook and the last report."""

from __future__ import annotations

import json
import time

from pveclean.host import reportfiles
from tests.harness.lxclab import Lab
from tests.harness.scenarios import NCCL_MIB, TP_MIB, VLLM_MIB, seeds
from tests.helpers import HOOK, pveclean


def test_status_on_the_lab_shows_gpus_holders_hook_and_last_report(host: Lab, vmid: int,
                                                                   vmid2: int) -> None:
    s = seeds(host, vmid, host=True)
    host.create_ct(vmid2, gpus=(), start=False)
    assert pveclean(host, "install", str(vmid), "--enable-snippets").returncode == 0
    # the last report: a residual run (a dry run writes none, nor does status)
    reportfiles.write({"vmid": vmid, "phase": "manual", "verdict": "residual",
                       "start": "2026-01-02T03:04:05Z"}, str(host.report_dir),
                      reportfiles.report_name(vmid, "manual", time.time() - 60))
    assert pveclean(host, "ct", str(vmid), "--dry-run").returncode == 0
    res = pveclean(host, "status", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["node"] == "labnode" and data["warnings"] == []
    ct = {e["vmid"]: e for e in data["containers"]}
    seed = ct[vmid]
    assert seed["status"] == "running" and seed["hook"] == "pveclean"
    assert seed["hookscript"] == HOOK
    assert sorted(g.split()[1].rsplit("/", 1)[1] for g in seed["gpu"]) == [
        "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"]
    pids = sorted(p for w in s.targets() for p in w.host_pids(host))
    assert sorted(h["host_pid"] for h in seed["holders"]) == pids
    assert seed["gpu_memory_mib"] == 4 * TP_MIB + VLLM_MIB + NCCL_MIB
    assert seed["last_report"]["verdict"] == "residual"
    assert seed["last_report"]["phase"] == "manual"
    other = ct[vmid2]
    assert other["hook"] == "none" and other["gpu"] == [] and "holders" not in other
    assert all(host.alive(p) for p in pids)  # status only looks

    text = pveclean(host, "status").stdout
    row = next(ln.split() for ln in text.splitlines() if ln.startswith(f"{vmid} "))
    assert row[:7] == [str(vmid), "labnode", "running", "4", "pveclean", str(len(pids)),
                       str(4 * TP_MIB + VLLM_MIB + NCCL_MIB)]
    assert row[7] == "residual"
    assert len(list(host.report_dir.glob("*.yaml"))) == 1  # neither wrote one
    assert f"  hookscript: {HOOK}" in text
    assert any(ln.startswith("  holder: PID ") and "GPU 0: 18000 MiB" in ln
               for ln in text.splitlines())

    (host.snippets / "pveclean-hook").unlink()  # lost: the next start would abort
    text = pveclean(host, "status").stdout
    assert (f"warning: CT {vmid}: hookscript {HOOK} is missing on node labnode; storage "
            "'local' is not shared, so a start there aborts") in text
