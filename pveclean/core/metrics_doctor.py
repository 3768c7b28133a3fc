"""`pveclean doctor`'s findings as Prometheus samples, pure: the number of findings per guest
and check (`id` as prometheus-pve-exporter writes it: `lxc/129`; `node/<name>` for the host's
own, such as its module and NVML disagreeing), and whether the look finished."""

from __future__ import annotations

from pveclean.core.doctor import HOST, Check, Diagnosis
from pveclean.core.metrics import Family, guest_id

FILE_NAME = "pveclean_doctor.prom"
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "pveclean_doctor_findings": ("gauge", "Findings of pveclean doctor per guest and check "
                                 "(a version mismatch, a moved major, a missing node, ...); 0 "
                                 "for each check of a guest looked at with none.",
                                 ("node", "id", "check")),
    "pveclean_doctor_up": ("gauge", "1 when pveclean doctor's last look finished, 0 when it "
                           "did not.", ("node",)),
}


def _fams() -> dict[str, Family]:
    return {n: Family(n, kind, hlp, labels) for n, (kind, hlp, labels) in FAMILIES.items()}


def families(d: Diagnosis, node: str) -> list[Family]:
    """Every check of every guest looked at, 0 where nothing was found (an alert's `for:`
    then sees a series go from 0 to 1, and a fixed one go back)."""
    fams = _fams()
    ids = [guest_id(node, "node")] + [guest_id(g) for g in d.looked]
    for gid in ids:
        for check in Check:
            fams["pveclean_doctor_findings"].set(0, node, gid, str(check))
    for f in d.findings:
        gid = guest_id(node, "node") if f.guest == HOST else guest_id(f.guest)
        fams["pveclean_doctor_findings"].add(1, node, gid, str(f.check))
    fams["pveclean_doctor_up"].set(1, node)
    return list(fams.values())


def failed(node: str) -> list[Family]:
    fams = _fams()
    fams["pveclean_doctor_up"].set(0, node)
    return list(fams.values())
