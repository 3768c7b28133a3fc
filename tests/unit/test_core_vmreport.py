"""core/vmreport: the VM hook's report as its file has it, keys in order, no private key."""

from __future__ import annotations

from pveclean.core.vmguard import Decision, Plan, Target
from pveclean.core.vmreport import CtStop, VmReport, VmVerdict


class _Moved:
    def as_dict(self) -> dict[str, object]:
        return {"pci_bus_id": "0000:18:00.0", "drivers_before": {}, "steps": []}


def test_pre_start_report() -> None:
    plan = Plan(Decision.STOP, [Target("0000:18:00.0", 0, 0)],
                {129: (frozenset({0}), frozenset({0}))})
    rep = (VmReport(200, "pre-start", "pve1", 0.0, "stop-containers", plan=plan)
           .with_stop(129, CtStop("clean", "/r/129.yaml"))
           .with_rebind({"0000:18:00.0": _Moved(), "0000:19:00.0": "busy"})
           .finished(VmVerdict.STOPPED, 1700000000.0))
    d = rep.as_dict()
    assert list(d) == ["pveclean_report", "kind", "vmid", "phase", "verdict", "host", "time",
                       "policy", "plan", "containers", "rebind"]
    assert (d["kind"], d["verdict"], d["time"]) == ("vm", "stopped",
                                                    "2023-11-14T22:13:20.000+00:00")
    assert d["containers"] == {"129": {"verdict": "clean", "report": "/r/129.yaml"}}
    assert d["rebind"] == {"0000:18:00.0": _Moved().as_dict(),
                           "0000:19:00.0": {"error": "busy"}}
    assert rep.started == 1700000000.0 and not any(k.startswith("_") for k in d)


def test_post_stop_report() -> None:
    rep = VmReport(200, "post-stop", "pve1", 0.0, "refuse",
                   given_back={"0000:18:00.0": [], "0000:19:00.0": ["x"]})
    d = rep.finished(VmVerdict.GIVEN_BACK, 0.0).as_dict()
    assert list(d)[-1] == "given_back" and "plan" not in d
    assert d["given_back"] == {"0000:18:00.0": "ok", "0000:19:00.0": ["x"]}
