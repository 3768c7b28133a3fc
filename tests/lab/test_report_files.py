"""Report files on lab containers: private modes, pruning, an existing directory's mode kept, and
secrets redacted in what is written."""

from __future__ import annotations

import json
import os
import time

from tests.harness.lxclab import Lab


def test_report_dir_and_files_are_private_and_pruned(lab: Lab, vmid: int) -> None:
    report_dir = lab.root / "private-reports"  # made by pveclean (an existing one keeps its mode)
    lab.write_config(keep_reports=3, report_dir=str(report_dir))
    lab.create_ct(vmid, gpus=(0,), start=False)
    for _ in range(5):
        assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert report_dir.stat().st_mode & 0o777 == 0o700
    files = sorted(report_dir.glob(f"{vmid}-*.yaml"))
    assert len(files) == 3
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    old = files[0]
    os.utime(old, (time.time() - 200 * 86400,) * 2)
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert not old.exists()


def test_secrets_in_command_lines_are_redacted(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], extra_args=[
        "--hf-token=hf_abcdef123", "--api-key", "sk-secret", "HF_TOKEN=hf_xyz",
        "--db", "postgres://me:pa55w0rd@db/x"])
    r = lab.pveclean("ct", str(vmid), "--json")
    out = r.stdout
    for secret in ("hf_abcdef123", "sk-secret", "hf_xyz", "pa55w0rd"):
        assert secret not in out
    rep = json.loads(out)
    cmd = rep["holders"][0]["cmdline"]  # the arguments, each redacted where a match covers it
    tail = cmd[cmd.index("--") + 1 :]
    assert tail == ["--hf-token=***", "--api-key", "***", "HF_TOKEN=***", "--db",
                    "postgres://me:***@db/x"]
    text = next(lab.report_dir.glob(f"{vmid}-*.yaml")).read_text()
    assert "hf_abcdef123" not in text and "pa55w0rd" not in text


def test_an_existing_report_dir_keeps_its_mode(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), start=False)
    shared = lab.root / "varlog"
    shared.mkdir()
    shared.chmod(0o755)
    lab.write_config(report_dir=str(shared))
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert oct(shared.stat().st_mode & 0o777) == oct(0o755)
    assert list(shared.glob(f"{vmid}-*.yaml"))
    fresh = lab.root / "fresh" / "reports"
    lab.write_config(report_dir=str(fresh))
    assert lab.pveclean("ct", str(vmid)).returncode == 0
    assert oct(fresh.stat().st_mode & 0o777) == oct(0o700)
