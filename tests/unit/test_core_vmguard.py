"""The VM guard's decision on hand-built maps of the host (core/gpumap's typed records)."""

from __future__ import annotations

from pveclean.core.gpumap import GpuHolding, GpuMap, GpuProc, nodes_of
from pveclean.core.records import GpuDevices
from pveclean.core.vmguard import Decision, Plan, VmStart
from pveclean.core.vmguard import plan as guard
from pveclean.core.vmguard import still_held as held_after
from tests import gpumaps
from tests.gpumaps import hostpci, pci, pcis, row

A0, A1 = "0000:18:00.0", "0000:19:00.0"


def plan(vmid: int, addresses: list[str], m: GpuMap, reservations: dict[str, int],
         policy: str, allow_host: list[str], keeping: dict[int, list[str]] | None = None,
         drivers: dict[str, str | None] | None = None) -> Plan:
    """The guard's plan, the VM's start (its addresses as sysfs writes them) spelled as the
    tests do."""
    start = VmStart(vmid, pcis(*addresses), {pci(a): v for a, v in reservations.items()},
                    {ct: pcis(*a) for ct, a in (keeping or {}).items()},
                    {pci(a): d for a, d in (drivers or {}).items()})
    return guard(start, m, policy, allow_host)


def still_held(addresses: list[str], m: GpuMap, allow_host: list[str]) -> list[str]:
    return held_after(pcis(*addresses), m, allow_host)


def gmap(*gpus: tuple[str, int, list[GpuHolding]], status: str = "ok", leak_mib: int = 0,
         untied: tuple[GpuProc, ...] = ()) -> GpuMap:
    return gpumaps.gmap([gpumaps.use(i, a, rows, status=status, leak_mib=leak_mib)
                         for a, i, rows in gpus], untied=untied)


def test_nothing_holds_the_gpu() -> None:
    p = plan(200, [A0], gmap((A0, 0, [])), {}, "refuse", [])
    assert p.decision is Decision.CLEAR and not p.blockers
    assert [(str(t.address), t.index, t.minor) for t in p.targets] == [(A0, 0, 0)]


def test_a_container_holder_refuses_by_default_naming_it_and_the_fix() -> None:
    p = plan(200, [A0], gmap((A0, 0, [row(11, "ct", 129, mib=18000)])), {}, "refuse", [])
    assert p.decision is Decision.REFUSE
    assert p.blockers == ["GPU 0 (0000:18:00.0) is held by CT 129: PID 11 python3, 18000 MiB: "
                          "`pveclean ct 129` or `pct stop 129`"]


def test_stop_containers_names_only_the_vms_gpus() -> None:
    m = gmap((A0, 0, [row(11, "ct", 129), row(12, "ct", 130)]), (A1, 1, [row(13, "ct", 131)]))
    p = plan(200, [A0], m, {}, "stop-containers", [])
    assert p.decision is Decision.STOP
    assert p.stop == {129: (frozenset({0}), frozenset({0})), 130: (frozenset({0}), frozenset({0}))}


def test_a_host_process_holding_the_gpu_refuses_in_both_policies_even_if_allowed() -> None:
    """The driver's unbind waits for every holder of the node: an allowed one is a hang."""
    m = gmap((A0, 0, [row(5, "host", name="nv-hostengine", mib=None), row(6, "ct", 129)]))
    for policy in ("refuse", "stop-containers"):
        for allow in ([], ["nv-hostengine"]):
            assert plan(200, [A0], m, {}, policy, allow).decision is Decision.REFUSE
    p = plan(200, [A0], m, {}, "stop-containers", ["nv-hostengine"])
    assert "vm_gpu_allow_host lets pass only processes that do not hold the GPU" in \
        p.blockers[0] and "hang" in p.blockers[0]


def test_the_persistence_daemon_is_let_go_per_gpu() -> None:
    m = gmap((A0, 0, [row(5, "host", name="nvidia-persistenced", mib=None), row(6, "ct", 129)]),
             (A1, 1, [row(5, "host", name="nvidia-persistenced", mib=None)]))
    p = plan(200, [A0], m, {}, "stop-containers", [])
    assert p.decision is Decision.STOP and p.persistence == frozenset({0})
    assert "persistence mode is turned off for this GPU alone" in p.notes[0]
    assert p.as_dict()["persistence_off"] == [0]
    assert plan(200, [A0], m, {}, "refuse", []).persistence == frozenset()  # refused
    assert plan(200, [A1], m, {}, "refuse", []).decision is Decision.CLEAR


def test_what_cannot_be_placed_or_read_is_not_innocent() -> None:
    assert plan(200, [A0], gmap((A0, 0, [row(7, "unknown")])), {}, "stop-containers",
                []).decision is Decision.REFUSE
    lost = gmap((A0, 0, []), status="lost")
    p = plan(200, [A0], lost, {}, "stop-containers", [])
    assert p.decision is Decision.REFUSE and "is lost" in p.blockers[0]


def test_memory_no_process_accounts_for_refuses() -> None:
    p = plan(200, [A0], gmap((A0, 0, []), leak_mib=4096), {}, "stop-containers", [])
    assert p.decision is Decision.REFUSE and "4096 MiB that no process" in p.blockers[0]


def test_another_running_vm_has_it() -> None:
    p = plan(200, [A1], gmap(), {A1: 201}, "stop-containers", [])
    assert p.blockers == ["GPU 0000:19:00.0 is in use by VM 201 (vfio-pci): `qm stop 201`"]
    assert plan(200, [A1], gmap(), {"0000:19:00": 201}, "refuse",
                []).decision is Decision.REFUSE  # a whole-device reservation
    assert plan(200, [A1], gmap(), {A1: 200}, "refuse", []).decision is Decision.CLEAR


def test_containers_that_keep_the_gpu_are_noted() -> None:
    p = plan(200, [A0], gmap((A0, 0, [])), {}, "refuse", [], keeping={129: [A0]})
    assert p.decision is Decision.CLEAR
    assert p.notes == ["CT 129's config passes 0000:18:00.0 too: its next start takes the GPU "
                       "back"]


def test_still_held_after_the_stop() -> None:
    assert still_held([A0], gmap((A0, 0, []), (A1, 1, [row(3, "ct", 1)])), []) == []
    assert still_held([A0], gmap((A0, 0, [row(3, "ct", 129)])), []) == [
        "GPU 0 (0000:18:00.0) still held: PID 3 python3, 1000 MiB"]
    assert still_held([A0], gmap((A0, 0, [row(3, "host", name="x")])), ["x"]) == [
        "GPU 0 (0000:18:00.0) still held: PID 3 x, 1000 MiB"]  # allowed, still a hang
    assert "allocated with no process" in still_held([A0], gmap((A0, 0, []), leak_mib=9), [])[0]


def test_conflicts_show_what_the_vms_next_start_would_do() -> None:
    from pveclean.core.vmguard import conflicts

    m = gmap((A0, 0, [row(11, "ct", 129)]), (A1, 1, [row(12, "ct", 130)]))
    refs = [hostpci(200, A0, "trainer"), hostpci(201, "0000:19:00", "win")]
    got = conflicts(m.gpus, refs, "refuse")
    assert [(c.gpu, c.vms[0].vmid, list(c.containers), c.next_vm_start)
            for c in got] == [(0, 200, [129], "refuse"), (1, 201, [130], "refuse")]
    assert conflicts(m.gpus, refs, "stop-containers")[0].next_vm_start == \
        "stop CT 129's holders of it"
    host = gmap((A0, 0, [row(11, "ct", 129), row(5, "host")]))
    assert conflicts(host.gpus, refs, "stop-containers")[0].next_vm_start == "refuse"
    assert conflicts(gmap((A0, 0, [])).gpus, refs, "refuse") == []  # nothing holds it
    assert conflicts(m.gpus, [], "refuse") == []  # no VM passes it


def test_a_gpu_on_the_nvidia_driver_that_nvml_does_not_list_refuses() -> None:
    down = gpumaps.gmap(nvml="unavailable: DriverNotLoaded")
    p = plan(200, [A0], down, {}, "stop-containers", [], drivers={A0: "nvidia"})
    assert p.decision is Decision.REFUSE
    assert "NVML does not list it (NVML: unavailable: DriverNotLoaded)" in p.blockers[0]
    # on vfio-pci already: NVML cannot see it, and nothing of the host can hold it
    assert plan(200, [A0], down, {}, "refuse", [],
                drivers={A0: "vfio-pci"}).decision is Decision.CLEAR


def test_a_holder_whose_nodes_cannot_be_tied_to_a_gpu_is_no_innocent() -> None:
    """A process holding a GPU driver node whose device number the host has no node for
    (a major of the nvidia driver's, not nvidia0..N): it may hold the VM's GPU, so the
    start is refused, in either policy, naming it; before, its device text went unread."""
    devices = GpuDevices({}, frozenset({195, 508}))
    odd = 508 << 8 | 3  # nvidia-uvm's major, a minor no node of this host has
    nodes = nodes_of({odd}, devices)
    assert nodes.minors == frozenset() and nodes.untied == {odd}
    held = gpumaps.proc(7, "ct", 129, devices=("/opt/x (io_uring fixed file, 508:3)",),
                        rdevs=frozenset({odd}))
    m = gmap((A0, 0, []), untied=(held,))
    for policy in ("refuse", "stop-containers"):
        p = plan(200, [A0], m, {}, policy, [])
        assert p.decision is Decision.REFUSE
        assert p.blockers == ["PID 7 python3 holds a GPU node pveclean cannot tie to a GPU "
                              "(CT 129): look with `pveclean gpus`"]
    assert still_held([A0], m, []) == [
        "still held: PID 7 python3 holds a GPU node pveclean cannot tie to a GPU (CT 129): "
        "look with `pveclean gpus`"]


def test_an_io_uring_holder_of_a_gpu_node_holds_that_gpu() -> None:
    """The scan's device numbers, not its display text, tie a holder to its GPU: an io_uring
    fixed file of /dev/nvidia0 is a holder of GPU 0 (its label once matched no pattern)."""
    from pveclean.core.gpumap import gpu_use, makedev, place_all
    from pveclean.core.records import GpuMemory

    devices = GpuDevices({makedev(195, 0): "/dev/nvidia0"}, frozenset({195}))
    p = gpumaps.proc(9, "ct", 129, devices=("/dev/nvidia0 (io_uring fixed file, 195:0)",),
                     rdevs=frozenset({makedev(195, 0)}))
    g = gpu_use(GpuMemory(0, "GPU-a", "H100", 100, 0, 0, minor=0), pci(A0),
                place_all([p], devices))
    assert [r.proc.host_pid for r in g.processes] == [9]
    p2 = plan(200, [A0], gpumaps.gmap([g]), {}, "refuse", [])
    assert p2.decision is Decision.REFUSE and "held by CT 129: PID 9" in p2.blockers[0]
