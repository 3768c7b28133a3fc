"""host/gpureset: persistence off and the GPU's services stopped around the reset, and both
given back on every path: success, the tool's failure, its deadline, a failed step before
it, Ctrl-C and SIGTERM; the tool run bounded and killed past its deadline."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pveclean.host.gpureset import Ops, Outcome, guarded_reset, run_tool, systemctl

UNITS = ["nvidia-persistenced.service", "nvidia-dcgm.service"]


class Host:
    """A host whose GPU 0 has persistence on and both services running."""

    def __init__(self, reset: Outcome | str = Outcome.DONE, fail_stop: str = "",
                 mode: bool | None = True) -> None:
        self.mode = mode
        self.running = set(UNITS)
        self.calls: list[str] = []
        self.reset_does = reset
        self.fail_stop = fail_stop

    def persistence(self, index: int) -> bool | None:
        return self.mode

    def set_persistence(self, index: int, on: bool) -> str | None:
        self.calls.append(f"pm {index} {'on' if on else 'off'}")
        self.mode = on
        return None

    def systemctl(self, verb: str, unit: str) -> str | None:
        self.calls.append(f"{verb} {unit}")
        if verb == "stop" and unit == self.fail_stop:
            return "Job for it failed"
        (self.running.discard if verb == "stop" else self.running.add)(unit)
        return None

    def reset(self, address: str, timeout: float) -> tuple[Outcome, str]:
        self.calls.append(f"reset {address}")
        if self.reset_does == "ctrl-c":
            raise KeyboardInterrupt
        if self.reset_does == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert isinstance(self.reset_does, Outcome)
        return self.reset_does, "said"

    def ops(self) -> Ops:
        return Ops(self.persistence, self.set_persistence, self.systemctl, self.reset)


def _restored(h: Host) -> None:
    assert h.mode is True and h.running == set(UNITS)


@pytest.mark.parametrize("does", [Outcome.DONE, Outcome.FAILED, Outcome.TIMEOUT, "ctrl-c",
                                  "sigterm"])
def test_every_path_restores_persistence_and_the_services(does: Outcome | str) -> None:
    h = Host(does)
    res = guarded_reset(h.ops(), 0, "00000000:01:00.0", UNITS, 5.0)
    _restored(h)
    assert h.calls == ["pm 0 off", f"stop {UNITS[0]}", f"stop {UNITS[1]}",
                       "reset 00000000:01:00.0", f"start {UNITS[1]}", f"start {UNITS[0]}",
                       "pm 0 on"]
    want = does if isinstance(does, Outcome) else Outcome.INTERRUPTED
    assert res.outcome is want and res.restored


def test_a_failed_stop_aborts_before_the_reset_and_restores() -> None:
    h = Host(fail_stop=UNITS[1])
    res = guarded_reset(h.ops(), 0, "x", UNITS, 5.0)
    assert res.outcome is Outcome.ABORTED and not any(c.startswith("reset") for c in h.calls)
    _restored(h)


def test_persistence_off_before_is_left_off_and_unknown_aborts() -> None:
    h = Host(mode=False)
    guarded_reset(h.ops(), 0, "x", [], 5.0)
    assert h.mode is False and "pm 0 on" not in h.calls
    h = Host(mode=None)
    res = guarded_reset(h.ops(), 0, "x", UNITS, 5.0)
    assert res.outcome is Outcome.ABORTED and h.calls == []


def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / f"tool{len(list(tmp_path.iterdir()))}"
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


def test_the_tool_succeeds_fails_and_hangs(tmp_path: Path) -> None:
    ok = _script(tmp_path, 'echo "GPU 00000000:01:00.0 was successfully reset."')
    assert run_tool([ok, "-r", "-i", "0"], 5) == (
        Outcome.DONE, "GPU 00000000:01:00.0 was successfully reset.")
    bad = _script(tmp_path, 'echo "In use by another client"; exit 255')
    assert run_tool([bad], 5) == (Outcome.FAILED, "In use by another client")
    hang = _script(tmp_path, "sleep 60")
    t = time.monotonic()
    outcome, said = run_tool([hang], 0.5)
    assert outcome is Outcome.TIMEOUT and "0.5 s" in said and time.monotonic() - t < 5
    assert run_tool([str(tmp_path / "missing")], 1)[0] is Outcome.FAILED
    assert systemctl(ok, "stop", "x.service") is None
    assert systemctl(bad, "stop", "x.service") == "In use by another client"
