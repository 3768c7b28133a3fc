"""host/mig against the fake NVML through the real pynvml (its `mig` directive): a GPU
without MIG, in MIG mode with devices, in MIG mode with none; and the fake's `reset`
directive freeing a GPU's leak, as the lab's nvidia-smi stand-in uses it."""

from __future__ import annotations

from pathlib import Path

from pveclean.host.mig import mig_state
from pveclean.host.nvml import Nvml
from tests.harness.fakenvml import FakeNvml
from tests.unit.test_host_nvml_faults import fake, lib  # noqa: F401  (fixtures)


def test_mig_off_on_with_devices_and_on_without(lib: Path, fake: FakeNvml) -> None:  # noqa: F811
    nv = Nvml(str(lib))
    assert mig_state(nv, 0) == (False, 0)
    fake.set_mig(0, 2)
    assert mig_state(Nvml(str(lib)), 0) == (True, 2)
    assert mig_state(Nvml(str(lib)), 1) == (False, 0)
    fake.set_mig(0, 0)
    assert mig_state(Nvml(str(lib)), 0) == (True, 0)
    fake.set_mig(0, None)
    assert mig_state(Nvml(str(lib)), 0) == (False, 0)


def test_a_reset_line_frees_that_gpus_leak(lib: Path, fake: FakeNvml) -> None:  # noqa: F811
    fake.leak(0, 4000)
    fake.leak(1, 500)
    before = {g.index: g.used_mib for g in Nvml(str(lib)).memory()}
    with open(fake.state_path, "a", encoding="ascii") as fh:
        fh.write("reset 0\n")  # as the nvidia-smi stand-in appends it
    after = {g.index: g.used_mib for g in Nvml(str(lib)).memory()}
    assert after[0] == before[0] - 4000 and after[1] == before[1]
    fake.leak(1, 600)  # a rewrite of the file keeps the reset (the leak is gone)
    assert 0 not in fake.leaks
