"""The right config at the right time: post-stop's leak check looks at the GPUs the container
ran with, not at the next run's (lxc-pve-poststop-hook applies pending changes first)."""

from __future__ import annotations

from tests.harness.lxclab import Lab
from tests.helpers import reports, wait_for


def _pend(lab: Lab, vmid: int, text: str) -> None:
    """A change made while the container runs: `pct set` writes it to [pve:pending]."""
    path = lab.root / "etc/pve/lxc" / f"{vmid}.conf"
    path.write_text(path.read_text() + "\n[pve:pending]\n" + text)


def _leak_check_after_a_pending_change(lab: Lab, vmid: int) -> dict[str, object]:
    assert lab.nvml is not None
    lab.run_in_ct(vmid, "python3", hold=["/dev/nvidia0"], gpu_mib={0: 3000})
    _pend(lab, vmid, "dev0: /dev/nvidia1\n")  # GPU 0 replaced by GPU 1 at the next stop
    lab.nvml.leak(0, 2048)  # what the driver keeps of GPU 0 once the holder is gone
    lab.pct("stop", str(vmid))
    assert wait_for(lambda: reports(lab, vmid, "post-stop"))
    (post,) = reports(lab, vmid, "post-stop")
    assert "dev0: /dev/nvidia1" in (lab.root / "etc/pve/lxc" / f"{vmid}.conf").read_text()
    return post


def test_post_stop_checks_the_gpus_the_run_started_with(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), style="dev", start=False)
    lab.install_hook(vmid)
    lab.pct("start", str(vmid))  # pre-start records what this run starts with
    post = _leak_check_after_a_pending_change(lab, vmid)
    assert post["verdict"] == "leaked"
    assert [leak["index"] for leak in post["leaks"]] == [0]  # type: ignore[index]


def test_without_a_start_record_the_pre_stop_report_says(lab: Lab, vmid: int) -> None:
    lab.create_ct(vmid, gpus=(0,), style="dev")  # started before the hook was there
    lab.install_hook(vmid)
    post = _leak_check_after_a_pending_change(lab, vmid)
    assert post["verdict"] == "leaked"
    assert [leak["index"] for leak in post["leaks"]] == [0]  # type: ignore[index]


def test_a_container_without_gpus_gets_no_leak_reports(lab: Lab, vmid: int) -> None:
    """A later container with no GPU lines (same VMID as a destroyed GPU container, its
    drop-in left behind) is not blamed for memory others leave."""
    assert lab.nvml is not None
    lab.create_ct(vmid, gpus=(), start=False)
    lab.install_hook(vmid)
    lab.pct("start", str(vmid))
    lab.nvml.leak(2, 4096)
    lab.pct("stop", str(vmid))
    assert wait_for(lambda: reports(lab, vmid, "post-stop"))
    (post,) = reports(lab, vmid, "post-stop")
    assert post["verdict"] != "leaked" and not post.get("leaks")


def test_a_line_proxmox_does_not_apply_is_said_in_the_report(lab: Lab, vmid: int) -> None:
    """An indented `dev1:` is "unable to parse" for Proxmox: no device, and the report says
    so rather than pveclean looking for a GPU the container never got."""
    lab.create_ct(vmid, gpus=(0,))
    path = lab.root / "etc/pve/lxc" / f"{vmid}.conf"
    path.write_text(path.read_text() + "  dev1: /dev/nvidia1\ngpu0: /dev/nvidia2\n")
    res = lab.pveclean("ct", str(vmid), "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    import json

    rep = json.loads(res.stdout)
    said = [w for w in rep["warnings"] if "Proxmox does not apply it" in w]
    assert len(said) == 2 and "unable to parse" in said[0] and "unknown setting 'gpu0'" in said[1]
    assert "dev1: /dev/nvidia1" not in rep["container"]["gpu_config"]
