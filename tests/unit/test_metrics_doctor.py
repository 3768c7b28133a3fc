"""doctor's findings as Prometheus samples: a count per guest and check, 0 for each check of a
guest looked at with none, the host's own under node/<name>; parsed back by the format's
reader."""

from __future__ import annotations

from pveclean.core import metrics, metrics_doctor
from pveclean.core.doctor import HOST, Check, Diagnosis, Finding


def f(guest: str, check: Check) -> Finding:
    return Finding(guest, check, "what", "evidence", "fix")


def test_counts_per_guest_and_check_with_zeros() -> None:
    d = Diagnosis((f("129", Check.LIBRARY_VERSION), f("129", Check.LIBRARY_VERSION),
                   f("129", Check.STALE_MAJOR), f(HOST, Check.DRIVER_VERSION)), ("129", "130"))
    text = metrics.render(metrics_doctor.families(d, "pve1"))
    got = {(lb["id"], lb["check"]): v for n, lb, v in metrics.parse(text)
           if n == "pveclean_doctor_findings"}
    assert got["lxc/129", "library_version"] == 2
    assert got["lxc/129", "stale_major"] == 1
    assert got["lxc/130", "library_version"] == 0
    assert got["node/pve1", "driver_version"] == 1
    assert len(got) == 3 * len(Check)
    assert 'pveclean_doctor_up{node="pve1"} 1' in text


def test_a_look_that_failed_says_up_0_and_no_findings() -> None:
    text = metrics.render(metrics_doctor.failed("pve1"))
    assert text.strip().endswith('pveclean_doctor_up{node="pve1"} 0')
    assert "pveclean_doctor_findings{" not in text
