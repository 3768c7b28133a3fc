"""commands/unit: the systemd drop-in's unit phases never fail the unit but by a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from pveclean.commands import unit
from pveclean.errors import PvecleanError
from pveclean.host.prelude import NvmlWorker
from pveclean.proxmox import dropin


def test_unit_phases_never_fail_the_unit_but_by_a_refusal(tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         ) -> None:
    """...and say it all in the journal: the unit's stdout is null, its stderr lxc-start's
    error log (/run/pve/ct-<vmid>.stderr)."""
    monkeypatch.setenv("INVOCATION_ID", "0123abcd")  # as systemd runs it
    import socket

    (tmp_path / "lxc").mkdir()
    sock_path = tmp_path / "journal.socket"
    cfgfile = tmp_path / "pveclean.yaml"
    cfgfile.write_text(f"pve_config_dir: {tmp_path / 'lxc'}\nstate_dir: {tmp_path / 's'}\n"
                       f"report_dir: {tmp_path / 'r'}\nsyslog: false\n"
                       f"journal_socket: {sock_path}\n")
    cfgfile.chmod(0o644)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.bind(str(sock_path))
        journal.settimeout(5)
        for argv in (["-c", str(cfgfile), "100", "start-pre"],  # no such container
                     ["-c", str(cfgfile), "100", "stop-post"],
                     ["-c", str(cfgfile), "100", "bogus"],
                     ["-c", str(cfgfile), "abc", "start-pre"]):
            with NvmlWorker() as nvml:
                assert unit.from_argv(argv, nvml) == 0, argv
        got = [journal.recv(1 << 16) for _ in range(4)]
    with NvmlWorker() as nvml:  # a config that does not load: exit 0 all the same
        assert unit.from_argv(["-c", str(tmp_path / "missing.yaml"), "100", "start-pre"],
                              nvml) == 0
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""
    assert all(b"SYSLOG_IDENTIFIER=pveclean\n" in m for m in got)
    assert b"CT 100 does not exist" in got[0] and b"PVECLEAN_PHASE=unit start-pre\n" in got[0]
    assert b"bad arguments" in got[2] and b"invalid VMID" in got[3]
    with pytest.raises(PvecleanError, match="cannot go into a systemd unit"):
        dropin.dropin_text(100, "/opt/my pveclean/bin/pveclean", None)
    text = dropin.dropin_text(100, "/usr/sbin/pveclean", None)
    assert "ExecStartPre=/bin/sh -c '/usr/sbin/pveclean unit 100 start-pre;" in text
