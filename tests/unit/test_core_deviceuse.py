"""A held GPU node as a record (core/records.DeviceUse): its label is the report's text exactly,
the report reader gives the record back from it, and the report's cut keeps that text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pveclean.core import bounds
from pveclean.core.records import DeviceHow, DeviceUse, Holder, device_labels, more_column
from pveclean.core.reportread import device_of, devices_of, holder_of

LABELS = [
    (DeviceUse("/dev/nvidia0", 195, 0, DeviceHow.FD), "/dev/nvidia0 (195:0)"),
    (DeviceUse(None, 195, 255, DeviceHow.FD, "7"), "fd 7 (195:255)"),
    (DeviceUse("/dev/nvidia-uvm", 510, 0, DeviceHow.MMAP), "/dev/nvidia-uvm (mmap 510:0)"),
    (DeviceUse("/opt/g", 195, 1, DeviceHow.URING), "/opt/g (io_uring fixed file, 195:1)"),
    (DeviceUse.named("/dev/nvidiactl"), "/dev/nvidiactl"),
]


def test_each_form_is_the_label_a_report_shows() -> None:
    assert [str(d) for d, _label in LABELS] == [label for _d, label in LABELS]


def test_the_reader_gives_the_record_back() -> None:
    for d, label in LABELS[2:]:
        assert device_of(label) == d
    assert device_of("fd 7 (195:255)") == DeviceUse("fd 7", 195, 255, DeviceHow.FD)
    assert devices_of(["/dev/nvidia0 (195:0)", f"{bounds.MORE}+3 more"]) == (
        [LABELS[0][0]], 3)
    assert devices_of(None) == ([], 0)


@given(st.text())
def test_any_label_reads_back_to_itself(label: str) -> None:
    assert str(device_of(label)) == label


def test_the_table_shows_the_first_word_and_nvidia_nodes_short() -> None:
    assert [d.short for d, _ in LABELS] == ["0", "fd", "uvm", "/opt/g", "ctl"]
    assert DeviceUse.named("/dev/nvidia").short == "/dev/nvidia"
    assert DeviceUse.named("/tmp/a b").word == "/tmp/a"
    assert more_column(0) == [] and more_column(4) == [f"{bounds.MORE}+4"]


def test_a_holder_writes_its_labels_and_the_count_left_out() -> None:
    h = Holder(host_pid=1, starttime=1, ct_pid=None, name="p", exe=None, argv=(), uid=0,
               user="root", state="S", ppid=1, cgroup="/", devices=[LABELS[0][0]],
               devices_more=2)
    assert h.as_dict()["devices"] == ["/dev/nvidia0 (195:0)", f"{bounds.MORE}+2 more"]
    back = holder_of(h.as_dict())
    assert (back.devices, back.devices_more) == (h.devices, 2)
    assert device_labels([], 0) == []


@given(st.text(min_size=1, max_size=700), st.sampled_from(list(DeviceHow)),
       st.integers(5, 600))
def test_a_cut_device_shows_what_the_cut_label_showed(path: str, how: DeviceHow,
                                                      limit: int) -> None:
    d = DeviceUse(path, 195, 12, how)
    got = bounds.cut_device(d, limit)
    assert str(got) == bounds.cut_middle(str(d), limit)
    if len(str(d)) - len(path) <= limit - 1 - (limit - 1) // 2:
        assert (got.major, got.minor, got.how) == (d.major, d.minor, d.how)
