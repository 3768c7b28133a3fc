"""host/kmsg: the kernel log read from a settable path, from where the last run left off,
bounded per run; owners of live PIDs by cgroup; the saved position; hostile writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pveclean.core.owners import UNKNOWN, Owner, OwnerKind
from pveclean.core.xid import Action
from pveclean.core.xidlog import Seen, XidLog
from pveclean.host import kmsg, procfs
from tests.harness.kmsg import Kmsg, xid_line

CT129 = Owner(OwnerKind.CT, 129)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Path]:
    """A /proc with PID 4242 (python3 in CT 129) and the boot id."""
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "comm").write_text("python3\n")
    (proc / "4242" / "cgroup").write_text("0::/lxc/129/ns/system.slice/vllm.service\n")
    (proc / "boot_id").write_text("boot-a\n")
    old = procfs.PROC
    procfs.set_root(str(proc))
    yield tmp_path
    procfs.set_root(old)


def _pass(host: Path, **kw: int) -> tuple[XidLog, list[Seen], str | None]:
    return kmsg.read_xids(str(host / "kmsg"), str(host / "state"),
                          str(host / "proc" / "boot_id"), **kw)


def test_an_xid_is_traced_to_the_container_and_read_once(host: Path) -> None:
    k = Kmsg(host / "kmsg")
    k.kernel("usb 1-1: new high-speed USB device", cont=("SUBSYSTEM=usb", "DEVICE=c189:1"))
    k.xid(pid=4242, name="python3")
    log, new, why = _pass(host)
    assert why is None and [(s.xid.xid, s.owner, s.how) for s in new] == [
        (13, CT129, "cgroup")]
    _, again, _ = _pass(host)
    assert again == []  # the saved position
    k.xid(xid=48, pid="unknown", name="<unknown>")
    log, new, _ = _pass(host)
    assert [s.xid.xid for s in new] == [48]
    assert log.counts[("0000:01:00", UNKNOWN, 48, Action.RESET)] == 1
    assert (host / "state" / "xid.json").stat().st_mode & 0o777 == 0o600


def test_a_reused_pid_is_not_the_faulting_process(host: Path) -> None:
    Kmsg(host / "kmsg").xid(pid=4242, name="trainer")
    _, new, _ = _pass(host)
    assert new[0].owner == UNKNOWN


def test_hostile_writes_count_for_nothing(host: Path) -> None:
    """What a container writes to /dev/kmsg is recorded under the user facility, with or
    without a `<0>` prefix; its process names and cmdlines never reach the log as the
    driver's line; truncated and interleaved records are no Xid either."""
    k = Kmsg(host / "kmsg")
    k.user(xid_line(xid=79))
    k.user("<0>" + xid_line(xid=95))
    k.kernel("python3[4242]: " + xid_line(xid=48))  # a comm that looks like one, logged
    k.kernel(xid_line(xid=13)[:40])  # truncated by the ring buffer
    k.raw("3,99;" + xid_line(xid=95) + "\n")  # a broken header
    k.kernel("NVRM: Xid (PCI:0000:01:00): 13, pid=4242")  # cut short
    log, new, why = _pass(host)
    assert why is None and new == [] and log.counts == {}
    assert "NVRM: Xid (PCI:0000:01:00): 13, pid=4242" in log.unparsed


def test_interleaved_and_unfinished_records(host: Path) -> None:
    k = Kmsg(host / "kmsg")
    k.kernel("NVRM: GPU at PCI:0000:01:00: GPU-aaaa")
    k.xid(pid=4242)
    k.kernel("nvidia-nvswitch: something else")
    k.xid(xid=31, pid=4242, text="MMU Fault: ENGINE GRAPHICS")
    k.raw("3,99,1,-;" + xid_line(xid=79))  # no newline yet: read next run, whole
    _, new, _ = _pass(host)
    assert [s.xid.xid for s in new] == [13, 31]
    k.raw("\n")
    _, new, _ = _pass(host)
    assert [s.xid.xid for s in new] == [79]


def test_bounded_per_run_and_a_new_boot(host: Path) -> None:
    k = Kmsg(host / "kmsg")
    for _ in range(5):
        k.xid()
    _, new, _ = _pass(host, max_records=2)
    assert len(new) == 2
    _, new, _ = _pass(host, max_records=2)
    assert len(new) == 2
    _, new, _ = _pass(host, max_records=2)
    assert len(new) == 1
    (host / "proc" / "boot_id").write_text("boot-b\n")
    k.wipe()
    k2 = Kmsg(host / "kmsg")
    k2.xid(xid=95)
    log, new, _ = _pass(host)
    assert [s.xid.xid for s in new] == [95] and sum(log.counts.values()) == 6


def test_a_log_that_cannot_be_opened_is_said(host: Path) -> None:
    _log, new, why = _pass(host)
    assert new == [] and why is not None and "kmsg" in why


def test_the_device_if_readable(tmp_path: Path) -> None:
    """The real /dev/kmsg, read-only (root, or dmesg_restrict=0): records parse."""
    try:
        recs, _lost = kmsg.read_records("/dev/kmsg", -1, 50)
    except OSError:
        pytest.skip("/dev/kmsg not readable here")
    assert all(r.seq >= 0 for r in recs)


def test_a_busy_log_is_read_not_saved_and_reports_take_nothing(host: Path) -> None:
    import fcntl
    import os

    Kmsg(host / "kmsg").xid(pid=4242, name="python3")
    (host / "state").mkdir()
    fd = os.open(host / "state" / kmsg.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    old = kmsg.LOCK_WAIT
    kmsg.LOCK_WAIT = 0.1
    try:
        _log, new, why = _pass(host)
        assert new == [] and why is not None and "busy" in why
        assert kmsg.for_report(str(host / "state"), 129) == []
    finally:
        kmsg.LOCK_WAIT = old
        os.close(fd)
    _log, new, why = _pass(host)
    assert len(new) == 1 and why is None
    assert len(kmsg.for_report(str(host / "state"), 129)) == 1
