"""The dry run an admin decides on: per holder the command line (escaped, quoted, cut to the
width), its GPUs and MiB, what would be sent, "would free N MiB on GPUs ...", the GPU users
left alone and why; 80 columns unless the terminal is wider; one number format."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pveclean.commands.dryview import render_dry_run
from pveclean.commands.gpuview import render_gpus
from pveclean.core.records import Holder, OtherUser
from pveclean.core.report import Report
from pveclean.core.reportparts import GpuRow, Settings
from pveclean.core.text import width
from tests.reportkit import holder, report, summary

MODEL = "/models/" + "meta-llama/Llama-3.1-70B-Instruct-with-a-very-long-name" * 2
DEVICES = [f"/dev/nvidia{i} (195:{i})" for i in range(4)] + ["/dev/nvidiactl (195:255)",
                                                              "/dev/nvidia-uvm (508:0)"]


def _holder(pid: int, argv: list[str], mib: dict[int, int | None], **kw: Any) -> Holder:
    return holder(pid, kw.pop("outcome", "would-stop"), ct_pid=pid - 4000, name="python3",
                  argv=tuple(argv), unit=kw.pop("unit", "vllm.service"), devices=DEVICES,
                  gpu_memory_mib=mib, **kw)


def seeds_report() -> Report:
    """CT 129 as the seeds have it: four tensor-parallel ranks, a vLLM server, NCCL's helper,
    its init; CT 130's worker and the host's nvidia-persistenced use the GPUs too."""
    ranks = [_holder(4100 + r, ["python3", "-m", "torch.distributed.run", f"--rank={r}",
                                "--model", MODEL], {r: 6000}) for r in range(4)]
    return report(
        129, "dry-run", duration_s=0.1, summary=summary(holders=7),
        holders=[*ranks,
                    _holder(4200, ["vllm", "serve", "it's \x1b[31mred\x1b[0m"], {0: 2048}),
                    _holder(4201, ["nccl-helper"], {1: None, 2: 300}, unit=None),
                    _holder(4001, ["/sbin/init"], {}, protected="the container's init "
                                                                "(PID 1)", outcome="protected")],
        other_gpu_users=[
            OtherUser(5100, "python3", "/lxc/130/ns/user.slice", {3: 1500}),
            OtherUser(900, "nvidia-persiste", "/system.slice/nvidia-persistenced.service",
                      {0: 0})],
        gpus=[GpuRow(i, None, "", "NVIDIA H100 80GB HBM3", 81559, None, 7000, 7000, None)
              for i in range(4)],
        settings=Settings(10, 60, None))


def test_the_dry_run_shows_what_an_admin_decides_on() -> None:
    text = render_dry_run(seeds_report(), 80, grace=10)
    lines = text.splitlines()
    assert max(width(ln) for ln in lines) <= 80, [ln for ln in lines if width(ln) > 80]
    for r in range(4):  # the ranks are told apart by their command lines
        at = next(n for n, ln in enumerate(lines) if ln.startswith(f"  {4100 + r} "))
        assert f" {r}:6000 " in lines[at] and lines[at].endswith(" vllm.service")
        assert lines[at + 1].startswith("      python3 -m torch.distributed.run --rank=")
        assert f"--rank={r} --model /models/" in lines[at + 1]
    assert "would stop 6 GPU holder(s): SIGTERM, then SIGKILL to any left after 10 s" in text
    assert ("would free 26348 MiB (and memory NVML gives no figure for) on GPU(s) 0, 1, 2, 3"
            in text)
    assert " 1:? 2:300 " in text  # GPUs and MiB per holder, unknown said as ?
    assert "'it'\"'\"'s \\x1b[31mred\\x1b[0m'" in text and "\x1b" not in text
    assert "will not touch 3 other GPU user(s):" in text
    assert "PID 5100 python3, GPU:MiB 3:1500: another container (CT 130)" in text
    assert "PID 900 nvidia-persiste, GPU:MiB 0:0: a host process (nvidia-persistenced." in text
    assert "PID 4001 python3, GPU:MiB -: protected: the container's init (PID 1)" in text
    assert "->" not in text  # no before -> after memory: nothing is stopped
    assert "GPU 0 NVIDIA H100 80GB HBM3: 7000 of 81559 MiB used now" in text
    assert "no report written" in lines[0]


def test_wider_only_when_the_terminal_is_wider() -> None:
    narrow = render_dry_run(seeds_report(), 40).splitlines()
    assert narrow == render_dry_run(seeds_report(), 80).splitlines()
    wide = render_dry_run(seeds_report(), 200).splitlines()
    assert max(width(ln) for ln in wide) > 80 and MODEL in "\n".join(wide)
    assert max(width(ln) for ln in wide) <= 200


def test_nothing_to_stop() -> None:
    rep = dataclasses.replace(seeds_report(), holders=[], other_gpu_users=[])
    text = render_dry_run(rep)
    assert "would stop nothing" in text and "would free" not in text


@pytest.mark.parametrize("mib", [18000, 123456])
def test_one_number_format(mib: int) -> None:
    """`gpus` prints MiB as `ct` and `status` do: digits only."""
    from pveclean.core.owners import Owner, OwnerKind
    from tests.gpumaps import gmap, row, use

    ct = Owner(OwnerKind.CT, 129)
    data = gmap([use(0, "0000:01:00.0", [row(1, "ct", 129, name="x", mib=mib, ct_pid=1)],
                     name="H100", uuid="GPU-1", used=mib, total=mib * 2,
                     by_owner=[(ct, mib)])], host="pve", seconds=0.1)
    text = render_gpus(data)
    assert f"{mib:,}" not in text and f"memory: {mib} of {mib * 2} MiB used" in text
    assert f"CT 129 {mib} MiB" in text


def test_hint_and_warning_lines_are_escaped_once() -> None:
    """A unit name holding a backslash (systemd's \\x2d) pasted from a hint into a shell is
    the unit's name: each line is escaped once (issue 39: twice, `\\\\\\\\x2d`)."""
    unit = "app\\x2dgpu.service"
    hint = f"{unit} in CT 129 is still active; stop it with: pct exec 129 -- systemctl stop {unit}"
    rep = dataclasses.replace(seeds_report(), hints=[hint], warnings=[f"look at {unit}"])
    text = render_dry_run(rep, columns=200)
    assert "systemctl stop app\\\\x2dgpu.service" in text  # the shell reads app\x2dgpu.service
    assert "app\\\\\\\\x2dgpu" not in text
    assert "warning: look at app\\\\x2dgpu.service" in text
