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
                                                         ) -> None:
    (tmp_path / "lxc").mkdir()
    cfgfile = tmp_path / "pveclean.yaml"
    cfgfile.write_text(f"pve_config_dir: {tmp_path / 'lxc'}\nstate_dir: {tmp_path / 's'}\n"
                       f"report_dir: {tmp_path / 'r'}\nsyslog: false\n")
    cfgfile.chmod(0o644)
    for argv in (["-c", str(cfgfile), "100", "start-pre"],  # no such container
                 ["-c", str(cfgfile), "100", "stop-post"],
                 ["-c", str(cfgfile), "100", "bogus"],
                 ["-c", str(cfgfile), "abc", "start-pre"],
                 ["-c", str(tmp_path / "missing.yaml"), "100", "start-pre"]):
        with NvmlWorker() as nvml:
            assert unit.from_argv(argv, nvml) == 0, argv
    out = capfd.readouterr()
    assert "Traceback" not in out.out + out.err
    assert len(out.out.splitlines()) == 5
    with pytest.raises(PvecleanError, match="cannot go into a systemd unit"):
        dropin.dropin_text(100, "/opt/my pveclean/bin/pveclean", None)
    text = dropin.dropin_text(100, "/usr/sbin/pveclean", None)
    assert "ExecStartPre=/bin/sh -c '/usr/sbin/pveclean unit 100 start-pre;" in text
