"""Shared fixtures. Lab tests need root and LXC; elsewhere they skip with the reason, but
under CI=true a skipped lab test is reported as a failure."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.lxclab import Lab, LabUnavailable, cgroup2_root, lab_unavailable_reason

CI = os.environ.get("CI") == "true"
_next_vmid = [990300 + (os.getpid() % 200) * 20]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.lab)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    if CI and rep.skipped and item.get_closest_marker("lab") is not None:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"lab test skipped under CI=true (lab tests must run in CI): {reason}"


@pytest.fixture
def lab() -> Iterator[Lab]:
    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(f"lab: {reason}")
    root = Path(tempfile.mkdtemp(prefix="pveclean-lab-", dir="/tmp"))
    try:
        the_lab = Lab.create(root)
    except LabUnavailable as exc:
        pytest.skip(f"lab: {exc}")
    try:
        yield the_lab
    finally:
        the_lab.destroy()


@pytest.fixture
def vmid() -> int:
    """A fresh VMID from a high range whose cgroup does not exist on this host."""
    while True:
        _next_vmid[0] += 1
        candidate = _next_vmid[0]
        try:
            taken = (cgroup2_root() / "lxc" / str(candidate)).exists()
        except LabUnavailable:
            taken = False
        if not taken:
            return candidate


@pytest.fixture
def vmid2(vmid: int) -> int:
    _next_vmid[0] += 1
    return _next_vmid[0]
