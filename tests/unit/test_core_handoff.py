"""The hand-off record's rules (core/handoff.py): one record per IOMMU group, the oldest
non-vfio driver of each function winning, and a give-back that leaves busy groups."""

from __future__ import annotations

from pveclean.core.handoff import GroupHandoff, merge, split

GPU, AUDIO, GPU2 = "0000:18:00.0", "0000:18:00.1", "0000:19:00.0"

FIRST = GroupHandoff(GPU, ((GPU, "nvidia"), (AUDIO, "snd_hda_intel")))


def test_a_later_start_never_overwrites_the_drivers_before() -> None:
    again = GroupHandoff(GPU, ((GPU, "vfio-pci"), (AUDIO, "vfio-pci")))
    assert merge([FIRST], [again]) == [FIRST]


def test_two_gpus_of_one_group_are_one_record() -> None:
    """The VM's second GPU of the same group finds it on vfio-pci already."""
    both = GroupHandoff(GPU, ((GPU, "nvidia"), (AUDIO, "snd_hda_intel"), (GPU2, "nvidia")))
    second = GroupHandoff(GPU2, ((GPU, "vfio-pci"), (AUDIO, "vfio-pci"), (GPU2, "vfio-pci")))
    assert merge([both], [second]) == [both]
    assert merge([], [both, second]) == [both]


def test_an_unrelated_group_is_added() -> None:
    other = GroupHandoff(GPU2, ((GPU2, "nvidia"),))
    assert merge([FIRST], [other]) == [FIRST, other]


def test_a_busy_function_keeps_its_whole_group() -> None:
    other = GroupHandoff(GPU2, ((GPU2, "nvidia"),))
    give, keep = split([FIRST, other], {AUDIO: "reserved by VM 300"})
    assert give == [other]
    assert keep == [(FIRST, f"{AUDIO}: reserved by VM 300")]


def test_a_record_item_that_is_not_one_is_passed() -> None:
    assert GroupHandoff.of({"pci_bus_id": GPU, "drivers_before": {GPU: "nvidia"}}) == \
        GroupHandoff(GPU, ((GPU, "nvidia"),))
    assert GroupHandoff.of("junk") is None and GroupHandoff.of({"pci_bus_id": 1}) is None
