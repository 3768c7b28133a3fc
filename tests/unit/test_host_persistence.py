"""host/persistence against the fake NVML through the real pynvml: a GPU's persistence mode
is read and set for that GPU alone, a change NVML makes stays in the driver's state (the
fake's file) until the next change, and a GPU that cannot answer raises one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pveclean.host import worker
from pveclean.host.nvml import Nvml, NvmlUnavailable
from pveclean.host.persistence import (
    persistence_mode,
    set_persistence_mode,
    w_persistence_mode,
    w_set_persistence_mode,
)
from tests.harness.fakenvml import FakeNvml
from tests.unit.test_host_nvml_faults import fake, lib  # noqa: F401  (fixtures)


def test_the_mode_is_read_per_gpu(lib: Path, fake: FakeNvml) -> None:  # noqa: F811
    fake.set_persistence(1, True)
    nv = Nvml(str(lib))
    assert [persistence_mode(nv, i) for i in range(3)] == [False, True, False]


def test_turning_one_gpu_off_leaves_the_others_and_survives_a_rewrite(
        lib: Path, fake: FakeNvml) -> None:  # noqa: F811
    for i in range(3):
        fake.set_persistence(i, True)
    nv = Nvml(str(lib))
    set_persistence_mode(nv, 1, False)
    assert [persistence_mode(nv, i) for i in range(3)] == [True, False, True]
    fake.leak(0, 10)  # the controller rewrites the state file: NVML's change stays
    assert fake.persistence_of(1) is False and fake.persistence_of(0) is True
    set_persistence_mode(nv, 1, True)
    assert persistence_mode(nv, 1) is True


def test_the_controllers_own_change_wins_over_its_earlier_lines(
        lib: Path, fake: FakeNvml) -> None:  # noqa: F811
    fake.set_persistence(0, True)
    fake.set_persistence(0, False)  # once read back from the file's old line and undone
    nv = Nvml(str(lib))
    assert persistence_mode(nv, 0) is False and fake.persistence_of(0) is False
    set_persistence_mode(nv, 0, True)  # NVML's change, then the controller's again
    fake.set_persistence(0, False)
    assert persistence_mode(nv, 0) is False


@pytest.mark.parametrize("error", ["NOT_SUPPORTED", "GPU_IS_LOST", "NO_PERMISSION"])
def test_a_gpu_that_cannot_answer_raises_naming_it(lib: Path, fake: FakeNvml,  # noqa: F811
                                                   error: str) -> None:
    fake.set_persistence(2, True)
    fake.gpu_error(2, "persistence", error)
    nv = Nvml(str(lib))
    with pytest.raises(NvmlUnavailable, match="persistence mode change"):
        set_persistence_mode(nv, 2, False)
    assert fake.persistence_of(2) is True  # nothing changed
    assert persistence_mode(nv, 0) is False  # the other GPUs answer


def test_a_lost_handle_is_named(lib: Path, fake: FakeNvml) -> None:  # noqa: F811
    fake.gpu_error(0, "handle", "GPU_IS_LOST")
    with pytest.raises(NvmlUnavailable, match=r"persistence mode of GPU 0: handle: "):
        persistence_mode(Nvml(str(lib)), 0)


def test_the_worker_side_answers_why_instead_of_raising(
        lib: Path, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(worker, "_state", {"nvml_library": str(lib), "nvml_timeout": 5.0})
    fake.gpu_error(1, "persistence", "NOT_SUPPORTED")
    assert w_set_persistence_mode(0, True, 5.0) is None
    assert w_persistence_mode(0, 5.0) == (True, None)
    mode, why = w_persistence_mode(1, 5.0)
    assert mode is None and why is not None and "Not Supported" in why
