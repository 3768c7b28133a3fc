"""core/xid and core/xidlog: the driver's Xid lines parsed exactly, kmsg records, the
catalog's actions, and the log folded from records (owners, counts, unparsed, user writes)."""

from __future__ import annotations

import pytest

from pveclean.core.owners import HOST, UNKNOWN, Owner, OwnerKind
from pveclean.core.xid import (
    CATALOG_VERSION,
    Action,
    KmsgRecord,
    classify,
    parse_line,
    parse_record,
)
from pveclean.core.xidlog import XidLog, fold, from_dict, same_name

CT129 = Owner(OwnerKind.CT, 129)


def test_the_drivers_line_with_pid_and_name() -> None:
    x = parse_line("NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=python3, Graphics "
                   "Exception: ESR 0x504648=0x2000e")
    assert x is not None
    assert (x.pci, x.xid, x.pid, x.name) == ("0000:01:00", 13, 4242, "python3")
    assert x.text == "Graphics Exception: ESR 0x504648=0x2000e"
    assert x.action is Action.APP


def test_unknown_pid_and_name_are_none_not_guessed() -> None:
    x = parse_line("NVRM: Xid (PCI:0000:cb:00): 48, pid='<unknown>', name=<unknown>, "
                   "An uncorrectable double bit error")
    assert x is not None and x.pid is None and x.name is None and x.action is Action.RESET


def test_older_drivers_and_mig_attribution() -> None:
    old = parse_line("NVRM: Xid (PCI:0000:10:00): 79, pid=0, GPU has fallen off the bus.")
    assert old is not None and old.pid == 0 and old.name is None
    assert old.text == "GPU has fallen off the bus." and old.action is Action.REBOOT
    oldest = parse_line("NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off the bus.")
    assert oldest is not None and oldest.pid is None and oldest.text.startswith("GPU has")
    mig = parse_line("NVRM: Xid (PCI:0000:41:00 GPU-I:03 GPU-CI:01): 31, pid=77, "
                     "name=trainer, MMU Fault")
    assert mig is not None and (mig.gpu_instance, mig.compute_instance) == (3, 1)


@pytest.mark.parametrize("text", [
    "NVRM: Xid (PCI:0000:01:00): 13, pid=42",  # truncated: no text after
    "NVRM: Xid (PCI:0000:01:00): , pid=42, name=x, y",  # no number
    "NVRM: Xid (0000:01:00): 3, C 00000005",  # an older format we do not know
    "xNVRM: Xid (PCI:0000:01:00): 13, pid=42, name=x, y",  # not at the start
    "NVRM: Xid (PCI:0000:01:00): 13 pid=42",
    "python3: NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=x, y",
])
def test_anything_else_is_not_an_xid(text: str) -> None:
    assert parse_line(text) is None


def test_a_hostile_name_cannot_change_the_xid_or_pid() -> None:
    x = parse_line("NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=x, pid=1, 79, y, text")
    assert x is not None and (x.xid, x.pid, x.name) == (13, 4242, "x")


def test_the_catalog_and_xid_154s_recovery_action() -> None:
    assert "Xid Catalog" in CATALOG_VERSION
    assert classify(95) is Action.RESET and classify(79) is Action.REBOOT
    assert classify(999) is Action.UNLISTED
    assert classify(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
                    "Required)") is Action.RESET
    assert classify(154, "from 0x0 (None) to 0x2 (Node Reboot Required)") is Action.REBOOT
    assert classify(154, "garbled") is Action.UNLISTED


def test_kmsg_records() -> None:
    r = parse_record("3,812,4567890,-;NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, b\n"
                     " SUBSYSTEM=pci")
    assert r == KmsgRecord(0, 3, 812, 4567890, "-", "NVRM: Xid (PCI:0000:01:00): 13, pid=1, "
                           "name=a, b")
    user = parse_record("12,813,4567999,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=a, b")
    assert user is not None and user.facility == 1 and not user.kernel
    assert parse_record("6,814,1,c,caller=T12;a\\x0ab") == KmsgRecord(0, 6, 814, 1, "c", "a\nb")
    assert parse_record("garbage;x") is None and parse_record("") is None


def _rec(seq: int, msg: str, facility: int = 0) -> KmsgRecord:
    return KmsgRecord(facility, 3, seq, seq * 10, "-", msg)


XID13 = "NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=python3, Graphics Exception"
XID48 = "NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, DBE"


def test_fold_counts_kernel_xids_by_owner_and_keeps_the_unparsed() -> None:
    recs = [_rec(0, XID13), _rec(1, "usb 1-1: new device"),
            _rec(2, "NVRM: Xid (0000:01:00): 3, C 00000005"), _rec(3, XID48),
            _rec(4, XID13, facility=1)]  # a user's write: never an Xid
    log, new = fold(XidLog(), "boot-a", recs, {4242: CT129})
    assert [(s.xid.xid, s.owner, s.how) for s in new] == [(13, CT129, "cgroup"),
                                                           (48, UNKNOWN, "unknown")]
    assert log.counts == {("0000:01:00", CT129, 13, Action.APP): 1,
                          ("0000:01:00", UNKNOWN, 48, Action.RESET): 1}
    assert log.unparsed == ("NVRM: Xid (0000:01:00): 3, C 00000005",)
    assert log.seq == 4 and log.needs_reset("0000:01:00") is not None
    again, none = fold(log, "boot-a", recs, {4242: CT129})
    assert none == [] and again.counts == log.counts  # read twice, counted once


def test_fold_a_new_boot_restarts_the_position_and_counts_gaps() -> None:
    log, _ = fold(XidLog(), "boot-a", [_rec(5, XID13)], {})
    assert log.seq == 5
    log2, new = fold(log, "boot-a", [_rec(9, XID13)], {})
    assert log2.lost == 3 and len(new) == 1
    log3, new3 = fold(log2, "boot-b", [_rec(0, XID13)], {})
    assert log3.seq == 0 and len(new3) == 1 and sum(log3.counts.values()) == 3


def test_fold_the_last_gpu_map_names_a_gone_pid_only_under_its_name() -> None:
    log = XidLog().with_map({4242: (CT129, "python3"), 7: (HOST, "other")})
    _, new = fold(log, "b", [_rec(0, XID13)], {})
    assert new[0].owner == CT129 and new[0].how == "gpu map"
    reused = XidLog().with_map({4242: (CT129, "bash")})
    _, new = fold(reused, "b", [_rec(0, XID13)], {})
    assert new[0].owner == UNKNOWN


def test_same_name_takes_comms_cut() -> None:
    assert same_name("a-very-long-process-name", "a-very-long-pro")
    assert not same_name("python3", "python") and not same_name(None, "x")


def test_the_saved_log_round_trips() -> None:
    log, _ = fold(XidLog().with_map({1: (CT129, "x")}), "b",
                  [_rec(0, XID13), _rec(1, XID48), _rec(2, "NVRM: Xid broken")], {4242: CT129})
    assert from_dict(log.as_dict()) == log
    with pytest.raises(ValueError):
        from_dict([1])
