"""The VM hook's hand-off of a GPU to vfio-pci and back (vm_gpu_rebind), in-process against a
laid-out sysfs root whose kernel part helpers.KernelSim plays: the hand-off is kept in the
state dir for post-stop, a failure is said and undone and never refuses the start, and each
phase writes the VM's report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from pveclean.commands import vmhook
from pveclean.core.config import Config
from pveclean.host.clock import start_deadline
from tests.gpumaps import pci
from tests.harness import qm
from tests.helpers import KernelSim

GPU, AUDIO = "0000:18:00.0", "0000:18:00.1"


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return replace(Config(), report_dir=str(tmp_path / "reports"),
                   state_dir=str(tmp_path / "state"), vm_gpu_rebind=True)


def test_pre_start_hands_the_group_over_and_post_stop_gives_it_back(
        tmp_path: Path, cfg: Config, capsys: pytest.CaptureFixture[str]) -> None:
    qm.lay_out_pci(tmp_path, 2)
    fs = KernelSim(tmp_path / "sys/bus/pci")
    out = vmhook._rebind(200, cfg, [pci(GPU)], start_deadline(10), fs)
    assert out[GPU].as_dict()["drivers_before"] == {GPU: "nvidia", AUDIO: "snd_hda_intel"}
    assert fs.driver(GPU) == fs.driver(AUDIO) == "vfio-pci"
    saved = yaml.safe_load((tmp_path / "state/vfio-200.yaml").read_text())
    assert saved[0]["pci_bus_id"] == GPU
    vmhook.post_stop(200, cfg, fs)
    assert (fs.driver(GPU), fs.driver(AUDIO)) == ("nvidia", "snd_hda_intel")
    assert not (tmp_path / "state/vfio-200.yaml").exists()
    (rep,) = [yaml.safe_load(p.read_text())
              for p in (tmp_path / "reports").glob("200-post-stop-*.yaml")]
    assert rep["kind"] == "vm" and rep["given_back"] == {GPU: "ok"}
    assert f"VM 200 post-stop: {GPU} back on {GPU}: nvidia" in capsys.readouterr().out


def test_a_failed_hand_off_is_undone_said_and_not_kept(
        tmp_path: Path, cfg: Config, capsys: pytest.CaptureFixture[str]) -> None:
    qm.lay_out_pci(tmp_path, 1)
    fs = KernelSim(tmp_path / "sys/bus/pci", fail={(AUDIO, "unbind")})
    out = vmhook._rebind(200, cfg, [pci(GPU)], start_deadline(10), fs)
    assert isinstance(out[GPU], str) and "busy; undone" in out[GPU]
    assert (fs.driver(GPU), fs.driver(AUDIO)) == ("nvidia", "snd_hda_intel")
    assert not (tmp_path / "state/vfio-200.yaml").exists()
    assert "WARNING: 0000:18:00.0 not handed to vfio-pci" in capsys.readouterr().out
    vmhook.post_stop(200, cfg, fs)  # nothing was kept: nothing to give back, no report
    assert not list((tmp_path / "reports").glob("200-post-stop-*.yaml"))


def test_vmhook_usage_and_config_errors_never_refuse(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("vm_gpu_policy: maybe\n")
    bad.chmod(0o644)
    monkeypatch.setenv("PVECLEAN_CONFIG", str(bad))
    assert vmhook.main(["200", "pre-start"], None) == 0  # type: ignore[arg-type]
    assert "config error, nothing done" in capsys.readouterr().out
    assert vmhook.main(["x", "pre-start"], None) == 2  # type: ignore[arg-type]
    assert vmhook.main(["12", "pre-start"], None) == 2  # type: ignore[arg-type]  # < 100
    assert "invalid VMID 12" in capsys.readouterr().err


def test_a_second_start_keeps_the_first_drivers_and_a_reserved_group_is_left(
        tmp_path: Path, cfg: Config, capsys: pytest.CaptureFixture[str]) -> None:
    """A start that failed after pre-start ran no post-stop: the next start finds the group on
    vfio-pci and must not record `vfio-pci` as its driver; a late post-stop leaves a group
    another VM has reserved, and keeps it recorded."""
    import time

    qm.lay_out_pci(tmp_path, 1)
    fs = KernelSim(tmp_path / "sys/bus/pci")
    cfg = replace(cfg, qemu_run_dir=str(tmp_path / "run"))
    vmhook._rebind(200, cfg, [pci(GPU)], start_deadline(10), fs)
    vmhook._rebind(200, cfg, [pci(GPU)], start_deadline(10), fs)  # the retry
    saved = yaml.safe_load((tmp_path / "state/vfio-200.yaml").read_text())
    assert saved == [{"pci_bus_id": GPU, "drivers_before": {GPU: "nvidia",
                                                            AUDIO: "snd_hda_intel"}}]
    (tmp_path / "run").mkdir()
    (tmp_path / "run/pci-id-reservations").write_text(
        f"{GPU} 300 time:{int(time.time()) + 60}\n")
    vmhook.post_stop(200, cfg, fs)
    assert fs.driver(GPU) == "vfio-pci"
    assert f"{GPU} left on vfio-pci ({GPU}: reserved by VM 300)" in capsys.readouterr().out
    assert (tmp_path / "state/vfio-200.yaml").is_file()
    (tmp_path / "run/pci-id-reservations").write_text("")
    vmhook.post_stop(200, cfg, fs)
    assert (fs.driver(GPU), fs.driver(AUDIO)) == ("nvidia", "snd_hda_intel")
    assert not (tmp_path / "state/vfio-200.yaml").exists()


def test_a_failed_give_back_keeps_its_record_and_says_so(
        tmp_path: Path, cfg: Config) -> None:
    qm.lay_out_pci(tmp_path, 1)
    fs = KernelSim(tmp_path / "sys/bus/pci")
    cfg = replace(cfg, qemu_run_dir=str(tmp_path / "run"))
    vmhook._rebind(200, cfg, [pci(GPU)], start_deadline(10), fs)
    fs.fail = {(GPU, "bind")}
    vmhook.post_stop(200, cfg, fs)
    assert (tmp_path / "state/vfio-200.yaml").is_file()
    (rep,) = [yaml.safe_load(p.read_text())
              for p in (tmp_path / "reports").glob("200-post-stop-*.yaml")]
    assert rep["verdict"] == "give-back failed" and rep["given_back"][GPU] != "ok"


def test_a_stranded_hand_off_is_given_back_by_the_next_pre_start(
        tmp_path: Path, cfg: Config, capsys: pytest.CaptureFixture[str]) -> None:
    """VM 200's start failed after pre-start (no post-stop): its record is stranded (no QEMU,
    no reservation). VM 300's pre-start gives it back, unless VM 300 takes that group."""
    qm.lay_out_pci(tmp_path, 2)
    fs = KernelSim(tmp_path / "sys/bus/pci")
    cfg = replace(cfg, qemu_run_dir=str(tmp_path / "run"))
    vmhook._rebind(200, cfg, [pci(GPU)], start_deadline(10), fs)
    vmhook._give_back_stranded(300, cfg, {GPU, AUDIO}, fs)  # 300 takes it: left
    assert fs.driver(GPU) == "vfio-pci"
    vmhook._give_back_stranded(300, cfg, {"0000:19:00.0"}, fs)
    assert (fs.driver(GPU), fs.driver(AUDIO)) == ("nvidia", "snd_hda_intel")
    assert not (tmp_path / "state/vfio-200.yaml").exists()
    assert "VM 200's hand-off is stranded" in capsys.readouterr().out


def test_give_back_by_hand_only_for_a_vm_that_neither_runs_nor_starts(
        tmp_path: Path, cfg: Config, capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import time

    qm.lay_out_pci(tmp_path, 1)
    fs = KernelSim(tmp_path / "sys/bus/pci")
    cfg = replace(cfg, qemu_run_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    vmhook._rebind(200, cfg, [pci(GPU)], start_deadline(10), fs)
    (tmp_path / "run/pci-id-reservations").write_text(f"{GPU} 200 time:{int(time.time()) + 60}\n")
    assert vmhook._give_back_by_hand(200, cfg, fs) == 0
    assert fs.driver(GPU) == "vfio-pci" and "its GPUs stay" in capsys.readouterr().out
    (tmp_path / "run/pci-id-reservations").write_text("")
    (tmp_path / "run/200.pid").write_text(f"{os.getpid()}\n")  # its QEMU runs
    vmhook._give_back_by_hand(200, cfg, fs)
    assert fs.driver(GPU) == "vfio-pci"
    (tmp_path / "run/200.pid").unlink()
    vmhook._give_back_by_hand(200, cfg, fs)
    assert (fs.driver(GPU), fs.driver(AUDIO)) == ("nvidia", "snd_hda_intel")
    vmhook._give_back_by_hand(200, cfg, fs)
    assert "nothing recorded" in capsys.readouterr().out
