"""What a container controls reaches a terminal escaped, and reports keep it exactly."""

from __future__ import annotations

from tests.harness.lxclab import Lab, Workload


def start_in_ct(lab: Lab, vmid: int, name: str, flags: list[str], pre: str = "") -> Workload:
    """Like Lab.run_in_ct, with any holder flags and a shell prelude run before it."""
    tag, ready = lab.ct_holder(vmid, name, kind="x")
    argv = [f"/opt/lab/bin/{name}", *flags, "--ready", ready, "--exit-after", "900"]
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    lab.pct("exec", str(vmid), "--", "/bin/sh", "-c",
            f"{pre}{quoted} </dev/null >/dev/null 2>&1 &")
    w = Workload(vmid, tag, lab.rootfs(vmid) / ready.lstrip("/"))
    lab.workloads.append(w)
    lab._wait_ready(w, 1)
    return w


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
    # alignment counts what is displayed: the columns after the name line up
    assert head.index("DEVICES") == row.index("/opt/a\\x1b[2J")
    assert head.index("OUTCOME") == row.index("would-stop")
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
    assert lab.alive(pid)
