"""What a container controls reaches a terminal escaped, and reports keep it exactly."""

from __future__ import annotations

from tests.harness.lxclab import Lab
from tests.helpers import start_in_ct

# ---- container text is data ---------------------------------------------------------------

EVIL_PATH = "/opt/a\x1b[2J\x1b[31m X\u202e"
EVIL_NAME = "\x1b]0;pwned\x07"


def test_escape_sequences_never_reach_the_terminal_and_reports_keep_them(
        lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,))
    w = start_in_ct(lab, vmid, "python3", ["--hold", EVIL_PATH, "--name", EVIL_NAME],
                    pre=f"touch '{EVIL_PATH}' && mount --bind /dev/nvidia0 '{EVIL_PATH}' && ")
    (pid,) = w.host_pids(lab)
    r = lab.pveclean("ct", str(vmid), "--dry-run")
    assert r.returncode == 0, r.stderr
    for out in (r.stdout, r.stderr):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b]0;pwned\\x07" in r.stdout  # the name, shown escaped
    head, row = [ln for ln in r.stdout.splitlines() if ln.startswith("  ")][:2]
    # alignment counts what is displayed: the column after the name lines up
    assert head.index("GPU:MiB") == row.index("\\x07") + len("\\x07") + 2
    assert lab.alive(pid)
    r = lab.pveclean("ct", str(vmid))  # the cleanup's table too, and its report
    assert r.returncode == 0, r.stderr
    for out in (r.stdout, r.stderr):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    head, row = [ln for ln in r.stdout.splitlines() if ln.startswith("  ")][:2]
    assert head.index("DEVICES") == row.index("/opt/a\\x1b[2J")
    assert head.index("OUTCOME") == row.index("terminated")
    shown = lab.pveclean("reports", "show", "latest", str(vmid))
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "\\x1b[2J" in shown.stdout
    # the report keeps the exact values
    (path,) = sorted(lab.report_dir.glob(f"{vmid}-*.yaml"))
    import yaml

    rep = yaml.safe_load(path.read_text())
    (h,) = rep["holders"]
    assert h["name"] == EVIL_NAME[:15]
    assert h["devices"][0].startswith(EVIL_PATH + " (")
