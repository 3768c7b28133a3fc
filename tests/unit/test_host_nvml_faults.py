"""host/nvml against the fake NVML library through the real, unmodified pynvml, in this
process: no GPU fault blinds the run. A GPU that fell off the bus (GPU_IS_LOST, Xid 79) or
answers with an error is a row with its status and reason while the others are read; each
getter's answer is judged on its own; the process getters fall back v3 -> v2 -> v1 as the
driver offers; PCI ids keep a wide domain; a PID's MIG rows are summed.

pynvml keeps the library it loaded for the whole process: the fake is loaded once, and
each test points it at its own state file (FAKE_NVML_STATE, read on every call). A build
without some symbols (an old driver) is asked in a subprocess."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pveclean.core.gpufaults import GpuWatch, config_minors, unchecked
from pveclean.core.pci import PciAddress
from pveclean.core.records import GpuDevices, GpuMemory, GpuStatus, NvmlProcesses, Scope
from pveclean.core.report import find_leaks, memory_table
from pveclean.host import nvml as nvml_mod
from pveclean.host.clock import start_deadline
from pveclean.host.nvml import Nvml, NvmlUnavailable, gpu_memory, pci_id
from pveclean.host.runreads import Reads
from pveclean.host.worker import Worker
from tests.harness.fakenvml import FakeNvml

pynvml = pytest.importorskip("pynvml")
GIB = 1024


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = FakeNvml(tmp_path_factory.mktemp("fakenvml")).build()
    if pynvml.nvmlLib is None:
        pynvml.nvmlLib = ctypes.CDLL(str(path))
    else:  # a fake loaded before: it reads the state file FAKE_NVML_STATE names all the same
        assert hasattr(pynvml.nvmlLib, "nvmlDeviceGetHandleByIndex_v2")
    return path


@pytest.fixture
def fake(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    f = FakeNvml(tmp_path / "nvml")
    monkeypatch.setenv("FAKE_NVML_STATE", str(f.state_path))
    for i in range(3):
        f.add_gpu(i)
    return f


@pytest.fixture
def alive() -> Iterator[list[int]]:
    """Three live PIDs (the fake counts a process only while it lives)."""
    ps = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
    yield [p.pid for p in ps]
    for p in ps:
        p.kill()
        p.wait()


def session(lib: Path) -> Nvml:
    return Nvml(str(lib), timeout=5.0)


def by_index(rows: list[Any]) -> dict[int, GpuMemory]:
    return {g.index: g for g in gpu_memory(rows)}


# ---- a lost or erroring GPU loses only itself ---------------------------------------------
def test_a_gpu_lost_before_the_run_gives_the_others(lib: Path, fake: FakeNvml,
                                                     alive: list[int]) -> None:
    """nvmlInit and the count work while GPU 1 is lost (the driver's NVML does the same):
    before, the lost handle failed the whole init ("NVML init failed: GpuIsLost")."""
    fake.lose(1)
    fake.set_process(0, alive[0], 4 * GIB)
    fake.set_process(2, alive[1], 2 * GIB)
    nv = session(lib)
    gpus = by_index(nv.memory_rows())
    assert sorted(gpus) == [0, 1, 2]
    assert gpus[1].status == "lost" and "GpuIsLost" in (gpus[1].reason or "")
    assert gpus[0].ok and gpus[0].used_mib == 4 * GIB and gpus[2].used_mib == 2 * GIB
    procs = nv.processes()
    assert procs.by_pid == {alive[0]: {0: 4 * GIB}, alive[1]: {2: 2 * GIB}}
    assert procs.faults[1][0] == "lost" and "GpuIsLost" in procs.faults[1][1]
    assert set(nv.pci_bus_ids()) == {0, 2}


@pytest.mark.parametrize("error,status", [("UNKNOWN", "unavailable"),
                                          ("TIMEOUT", "unavailable"),
                                          ("GPU_IS_LOST", "lost")])
def test_a_handle_that_fails_after_the_count_loses_only_its_gpu(
        lib: Path, fake: FakeNvml, alive: list[int], error: str, status: str) -> None:
    fake.gpu_error(2, "handle", error)
    fake.set_process(0, alive[0], GIB)
    nv = session(lib)
    gpus = by_index(nv.memory_rows())
    assert (gpus[2].status, gpus[0].status, gpus[1].status) == (status, "ok", "ok")
    assert gpus[2].reason is not None and gpus[2].reason.startswith("handle: ")
    assert nv.processes().by_pid == {alive[0]: {0: GIB}}


def test_a_gpu_lost_between_the_reads_keeps_the_others_after_figures(
        lib: Path, fake: FakeNvml, alive: list[int]) -> None:
    fake.set_process(0, alive[0], GIB)
    fake.set_process(1, alive[1], GIB)
    nv = session(lib)
    before = gpu_memory(nv.memory_rows())
    fake.lose(1)  # its handle was given: every getter now answers GPU_IS_LOST
    fake.remove_process(0, alive[0])
    after = gpu_memory(nv.memory_rows())
    table = {r.index: r.as_dict() for r in memory_table(before, after)}
    assert table[0]["freed_mib"] == GIB and "status" not in table[0]
    assert table[2]["used_after_mib"] == 0
    assert table[1]["used_after_mib"] is None and table[1]["status"] == "lost"
    assert table[1]["reason"].startswith("after: memory: GpuIsLost")


def test_a_failed_memory_answer_keeps_the_process_answer(lib: Path, fake: FakeNvml,
                                                         alive: list[int]) -> None:
    """GPU 0's memory getter fails: its row is marked, and its process list (a holder with
    4 GiB) and the other GPUs' are still read."""
    fake.gpu_error(0, "memory", "UNKNOWN")
    fake.set_process(0, alive[0], 4 * GIB)
    nv = session(lib)
    gpus = by_index(nv.memory_rows())
    assert gpus[0].status == "unavailable" and "memory: Unknown" in (gpus[0].reason or "")
    assert gpus[0].name == "NVIDIA-H100-80GB-HBM3" and gpus[0].minor == 0
    assert nv.processes().by_pid == {alive[0]: {0: 4 * GIB}}


def test_a_failed_process_answer_keeps_the_memory_answer(lib: Path, fake: FakeNvml,
                                                         alive: list[int]) -> None:
    fake.gpu_error(1, "procs", "TIMEOUT")
    fake.set_process(0, alive[0], 4 * GIB)
    fake.set_process(1, alive[1], GIB)
    nv = session(lib)
    procs = nv.processes()
    assert procs.by_pid == {alive[0]: {0: 4 * GIB}}
    assert procs.faults == {1: ("unavailable", "process list: Timeout (Timeout)")}
    gpus = by_index(nv.memory_rows())
    assert gpus[1].ok and gpus[1].used_mib == GIB


@pytest.mark.parametrize("getter", ["info", "minor"])
def test_a_failed_name_uuid_or_minor_marks_the_gpu(lib: Path, fake: FakeNvml,
                                                   getter: str) -> None:
    fake.gpu_error(1, getter, "GPU_IS_LOST")
    gpus = by_index(session(lib).memory_rows())
    assert gpus[1].status == "lost" and gpus[0].ok and gpus[2].ok
    if getter == "info":
        assert (gpus[1].name, gpus[1].uuid) == ("", "")
    else:
        assert gpus[1].minor is None


def test_init_failing_is_still_nvml_unavailable(lib: Path, fake: FakeNvml) -> None:
    fake.init_error("DRIVER_NOT_LOADED")
    with pytest.raises(NvmlUnavailable, match="DriverNotLoaded"):
        session(lib).memory_rows()


# ---- an old driver: the process getters fall back ----------------------------------------
@pytest.mark.parametrize("missing", ["v3", "v2"])
def test_an_old_driver_still_gives_per_process_memory(lib: Path, fake: FakeNvml,
                                                      alive: list[int], missing: str) -> None:
    """Before R510 there is no _v3 (pynvml: NVMLLibraryMismatchError for the unversioned
    getter, FunctionNotFound for _v3); before R450 no _v2 either: v2, then v1."""
    fake.old_driver(missing)
    fake.set_process(0, alive[0], 3 * GIB)
    fake.set_process(1, alive[1], 512, kind="graphics")
    with pytest.raises(pynvml.NVMLLibraryMismatchError):  # what the old code asked
        pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
    nv = session(lib)
    assert nv.processes().by_pid == {alive[0]: {0: 3 * GIB}, alive[1]: {1: 512}}
    assert nv.processes().faults == {}
    assert _texts(nv.pci_bus_ids()) == {0: "0000:18:00.0", 1: "0000:19:00.0",
                                        2: "0000:1a:00.0"}


OLD_DRIVER = textwrap.dedent("""
    import sys
    from pveclean.host.nvml import Nvml
    nv = Nvml(sys.argv[1], timeout=5.0)
    procs = nv.processes()
    print(sorted((pid, dict(per)) for pid, per in procs.by_pid.items()), dict(procs.faults))
""")


@pytest.mark.parametrize("without", [("v3",), ("v2",)])
def test_a_library_without_the_newer_getters_still_gives_per_process_memory(
        tmp_path: Path, alive: list[int], without: tuple[str, ...]) -> None:
    """The fake built without the symbols, as an R470 (or older) libnvidia-ml.so.1 is."""
    old = FakeNvml(tmp_path / "old", without=without)
    old.build()
    old.add_gpu(0)
    old.set_process(0, alive[0], 3 * GIB)
    env = {**os.environ, "FAKE_NVML_STATE": str(old.state_path)}
    r = subprocess.run([sys.executable, "-c", OLD_DRIVER, str(old.lib_path)],
                       capture_output=True, text=True, timeout=60, env=env, check=False)
    assert r.stdout.strip() == f"[({alive[0]}, {{0: {3 * GIB}}})] {{}}", r.stderr


# ---- PCI ids and MIG rows ----------------------------------------------------------------
def test_a_wide_pci_domain_is_printed_whole(lib: Path, fake: FakeNvml) -> None:
    """Intel VMD puts GPUs in domain 0x10000 and above: NVML writes 00010000:18:00.0, sysfs
    10000:18:00.0; a domain that fits in 4 digits keeps 4."""
    fake.pci_domain(0, 0x10000)
    fake.pci_domain(1, 0x1)
    assert _texts(session(lib).pci_bus_ids()) == {0: "10000:18:00.0", 1: "0001:19:00.0",
                                                  2: "0000:1a:00.0"}
    assert str(pci_id("00000000:01:00.0")) == "0000:01:00.0"
    assert str(pci_id(b"ABCDE123:01:00.0")) == "abcde123:01:00.0"
    assert pci_id("not an id") is None


def _texts(buses: Mapping[int, PciAddress]) -> dict[int, str]:
    """GPU index -> its PCI address as sysfs names it."""
    return {i: str(a) for i, a in buses.items()}


def test_a_pid_with_rows_in_several_mig_instances_has_their_sum(
        lib: Path, fake: FakeNvml, alive: list[int]) -> None:
    """One row per MIG instance: the PID's memory is their sum, so the GPU's used memory is
    accounted for and no leak is reported (before: the first figure, a 3 GiB "leak" with the
    advice to reset the GPU)."""
    fake.set_process(0, alive[0], 1 * GIB, instance=(1, 0))
    fake.set_process(0, alive[0], 3 * GIB, instance=(2, 0))
    fake.set_process(0, alive[1], 256, instance=(2, 0))
    nv = session(lib)
    procs = nv.processes()
    assert procs.by_pid == {alive[0]: {0: 4 * GIB}, alive[1]: {0: 256}}
    gpus = nv.memory()
    assert gpus[0].used_mib == 4 * GIB + 256
    assert find_leaks(gpus, procs, {0}, set()) == []


def test_one_process_in_both_lists_is_counted_once(lib: Path, fake: FakeNvml,
                                                   alive: list[int]) -> None:
    """A compute and graphics process (nvidia-smi's C+G) is the same memory in both lists."""
    fake.set_process(0, alive[0], GIB, kind="compute")
    fake.set_process(0, alive[0], None, kind="graphics")
    fake.set_process(1, alive[1], None, kind="compute")
    assert session(lib).processes().by_pid == {alive[0]: {0: GIB}, alive[1]: {1: None}}


def test_no_leak_is_judged_on_a_gpu_nvml_could_not_read(lib: Path, fake: FakeNvml,
                                                        alive: list[int]) -> None:
    fake.set_process(0, alive[0], 4 * GIB)
    fake.gpu_error(0, "procs", "UNKNOWN")
    nv = session(lib)
    assert find_leaks(nv.memory(), nv.processes(), {0}, set()) == []


# ---- the run's reads: each answer on its own, a lost GPU of the container is a problem ----
def _fake_process(proc: Path, pid: int) -> None:
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (python3) S 1 " + " ".join(["0"] * 17) + " 500 0 0\n")
    (d / "status").write_text(f"Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t{pid}\t7\n")
    (d / "cgroup").write_text("0::/lxc/129/ns\n")
    (d / "cmdline").write_text("python3\0")


def _scope(tmp_path: Path, pids: list[int], minors: list[int]) -> Scope:
    ct = tmp_path / "cg" / "lxc" / "129"
    (ct / "ns").mkdir(parents=True)
    (ct / "cgroup.procs").write_text("")
    (ct / "ns" / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return Scope(129, ct, GpuDevices({}, frozenset()), frozenset(),
                 [f"/dev/nvidia{m}" for m in minors] + ["/dev/nvidia*"], running=True)


def failed_memory(_timeout: float) -> tuple[None, str]:
    """w_memory when the whole memory answer failed (module-level: a request names it)."""
    return None, "NVML memory query failed: Unknown (Unknown Error)"


def run_host(lib: Path, scope: Scope) -> tuple[Reads, Any]:
    wk = Worker(**Nvml.settings(str(lib), 10))
    reads = Reads(wk, start_deadline(20), 2.0, True, 5.0)
    got = reads.host(scope, time.monotonic() + 15)
    reads.close()
    wk.close()
    return reads, got


@pytest.mark.parametrize("memory_fails", ["one GPU", "the whole answer"])
def test_the_run_finds_a_holder_on_a_healthy_gpu_whatever_memory_says(
        lib: Path, fake: FakeNvml, alive: list[int], proc: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, memory_fails: str) -> None:
    """A holder with only NVML memory (4 GiB on GPU 0): found and given its memory although
    the memory answer failed for GPU 1, or failed as a whole (before, a failed memory answer
    threw away the process answer already asked for)."""
    pid = alive[0]
    _fake_process(proc, pid)
    fake.set_process(0, pid, 4 * GIB)
    fake.gpu_error(1, "memory", "UNKNOWN")
    if memory_fails == "the whole answer":
        monkeypatch.setattr("pveclean.host.runreads.w_memory", failed_memory)
    reads, (view, _others, status, _alone) = run_host(lib, _scope(tmp_path, [pid], [0]))
    assert status.ok and view is not None
    assert view.holders[pid].gpu_memory_mib == {0: 4 * GIB}
    assert reads.problems == [] == reads.unjudged  # GPU 1 is not the container's (nvidia0)


def test_a_lost_gpu_of_the_container_is_a_problem_of_the_run(
        lib: Path, fake: FakeNvml, alive: list[int], proc: Path, tmp_path: Path) -> None:
    pid = alive[0]
    _fake_process(proc, pid)
    fake.set_process(0, pid, 4 * GIB)
    fake.lose(1)
    reads, (view, _others, status, _alone) = run_host(lib, _scope(tmp_path, [pid], [0, 1]))
    assert status.ok and view.holders[pid].gpu_memory_mib == {0: 4 * GIB}
    (problem,) = reads.unjudged  # not judged (issue 38): the verdict `not-judged`
    assert reads.problems == []
    assert problem.startswith("GPU 1 is lost (handle: GpuIsLost") and "not verified" in problem
    assert reads.before is not None and reads.before[1].status == "lost"


# ---- which faulted GPU may be the container's ---------------------------------------------
def _g(index: int, minor: int | None, status: str = "ok") -> GpuMemory:
    return GpuMemory(index, f"GPU-{index}", "H100", 81559, 512, 0, minor, GpuStatus(status),
                     None if status == "ok" else "handle: GpuIsLost")


@pytest.mark.parametrize("minors,held,seen,problem", [
    ({0}, set(), [_g(0, 0), _g(1, None, "lost")], False),  # nvidia0 is GPU 0: 1 is not ours
    ({1}, set(), [_g(0, 0), _g(1, None, "lost")], True),  # nvidia1 answers for no GPU
    ({0}, set(), [_g(0, 0), _g(1, 1, "lost")], False),  # its minor is known, not ours
    ({0}, {1}, [_g(0, 0), _g(1, 1, "lost")], True),  # a holder held nvidia1
    (None, set(), [_g(0, 0), _g(1, 1, "lost")], True),  # the config names no node: any GPU
])
def test_a_faulted_gpu_is_a_problem_when_it_may_be_the_container_s(
        minors: set[int] | None, held: set[int], seen: list[GpuMemory], problem: bool) -> None:
    watch = GpuWatch(minors, held)
    said = watch.note(seen, {})
    assert bool(said) is problem
    assert watch.note(seen, {}) == []  # said once


def test_config_minors() -> None:
    assert config_minors(["/dev/nvidia0", "/dev/nvidia12", "/dev/nvidiactl", "/dev/nvidia*"]
                         ) == {0, 12}
    assert config_minors(["/dev/nvidia*", "/dev/nvidia-caps/*"]) is None


def test_the_worker_s_answer_pickles_with_its_faults() -> None:
    import pickle

    rows: nvml_mod.ProcessRows = ({5: {0: 1}}, {1: ("lost", "handle: GpuIsLost")})
    q = nvml_mod.gpu_processes(pickle.loads(pickle.dumps(rows)))
    assert q == NvmlProcesses({5: {0: 1}}, {1: (GpuStatus.LOST, "handle: GpuIsLost")})
    assert pickle.loads(pickle.dumps(q)) == q


def test_the_leak_check_says_which_gpus_of_the_container_it_passed_over() -> None:
    procs = NvmlProcesses({}, {2: (GpuStatus.UNAVAILABLE, "process list: Timeout (Timeout)")})
    gpus = [_g(0, 0), _g(1, None, "lost"), _g(2, 2), _g(3, 3, "lost")]
    assert unchecked(gpus, procs, {0, 2}) == [
        "GPU 1 is lost (handle: GpuIsLost): its memory is not checked for leaks",
        "GPU 2 is unavailable (process list: Timeout (Timeout)): its memory is not checked "
        "for leaks"]  # GPU 3 is nvidia3, not the container's
    assert len(unchecked(gpus, procs, set())) == 3


# ---- issue 38: a failed getter is N/A, what the others read is kept ------------------------
@pytest.mark.parametrize("getter", ["info", "minor"])
def test_a_failed_name_uuid_or_minor_keeps_the_memory_figures(
        lib: Path, fake: FakeNvml, alive: list[int], getter: str) -> None:
    """nvitop's nvmlQuery/NaType: GPU 1's name/UUID (or minor) getter fails, its memory
    totals and its process list were read and stay (the GPU itself is still not judged)."""
    from pveclean.core.gpumap import gpu_use

    fake.gpu_error(1, getter, "UNKNOWN")
    fake.set_process(1, alive[0], 4 * GIB)
    nv = session(lib)
    gpus = by_index(nv.memory_rows())
    g = gpus[1]
    assert g.status == "unavailable" and g.figures_read
    assert g.unread == (("name", "uuid") if getter == "info" else ("minor",))
    assert g.used_mib == 4 * GIB and g.total_mib > 0
    assert nv.processes().by_pid == {alive[0]: {1: 4 * GIB}}
    use = gpu_use(g, None, [])
    assert (use.used_mib, use.total_mib) == (4 * GIB, g.total_mib)
    assert use.leak_mib == 0 and use.unaccounted_mib is None  # never judged: no leak
    assert use.as_dict()["unread"] == list(g.unread)
    row = {r.index: r for r in memory_table([g], [g])}[1]
    assert row.used_before_mib == 4 * GIB and row.status == "unavailable"
    assert not gpus[0].unread and gpus[0].figures_read


def test_a_failed_memory_getter_still_hides_the_figures(lib: Path, fake: FakeNvml) -> None:
    fake.gpu_error(1, "memory", "UNKNOWN")
    fake.gpu_error(2, "handle", "UNKNOWN")
    gpus = by_index(session(lib).memory_rows())
    assert gpus[1].unread == ("memory",) and not gpus[1].figures_read
    assert gpus[2].unread == ("handle",) and not gpus[2].figures_read


# ---- issue 38: a lost GPU keeps its last known UUID and bus id, drawn as lost --------------
def test_a_lost_gpu_keeps_its_last_uuid_and_bus_id_and_is_drawn_lost(
        lib: Path, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpus` (and --watch's rounds) after GPU 1 fell off the bus: its UUID and bus id are
    those of the earlier answer, its lines say LOST and never "no process holds this GPU"."""
    from pveclean.commands.gpulook import _ask_nvml
    from pveclean.commands.gpuview import _gpu_lines
    from pveclean.core.gpumap import gpu_use
    from pveclean.host import worker

    monkeypatch.setitem(worker.state(), "gpu_known", {})
    nv = session(lib)
    gpus, _, buses, _ = _ask_nvml(nv, [])
    uuid, bus = gpus[1].uuid, buses[1]
    assert uuid.startswith("GPU-")
    fake.lose(1)
    gpus, _, buses, _ = _ask_nvml(nv, [])
    g = {x.index: x for x in gpus}[1]
    assert g.status == "lost" and g.uuid == uuid and buses[1] == bus
    use = gpu_use(g, buses.get(1), [])
    text = "\n".join(_gpu_lines(use, {}))
    assert uuid in text and str(bus) in text and "LOST" in text
    assert "no process holds this GPU" not in text and "cannot be told" in text
    doc = use.as_dict()
    assert (doc["uuid"], doc["pci_bus_id"], doc["status"]) == (uuid, str(bus), "lost")
    # a session that never saw it: no UUID to give, still drawn as lost, not as "none"
    monkeypatch.setitem(worker.state(), "gpu_known", {})
    g = {x.index: x for x in _ask_nvml(session(lib), [])[0]}[1]
    text = "\n".join(_gpu_lines(gpu_use(g, None, []), {}))
    assert g.uuid == "" and "no process holds this GPU" not in text and "LOST" in text


# ---- issue 38: a --watch asks NVML again after a stall -------------------------------------
def _nvml_threads_done(limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while any(t.is_alive() for t in nvml_mod.ABANDONED):
        assert time.monotonic() < end, "an NVML call is still stuck"
        time.sleep(0.05)


def test_a_watch_asks_nvml_again_after_a_stall(lib: Path, fake: FakeNvml) -> None:
    """Round 1: NVML's init hangs past the session's timeout. While that call is still stuck
    the next round does not ask again (another thread would only stick); once it returned,
    the next round is a new session that reads the GPUs, not the stall's error again."""
    from pveclean.commands.gpulook import nvml_session

    _nvml_threads_done()
    state: Any = {"nvml_library": str(lib), "nvml_timeout": 0.3}
    fake.hang(1.5)
    first = nvml_session(state)
    with pytest.raises(NvmlUnavailable, match="did not answer"):
        first.memory_rows()
    fake.hang(None)
    assert nvml_session(state) is first  # its init is still stuck in the driver
    _nvml_threads_done()
    again = nvml_session(state)
    assert again is not first
    assert [g.ok for g in gpu_memory(again.memory_rows())] == [True, True, True]
    assert nvml_session(state) is again  # a session that answers is kept


# ---- issue 38: a lost GPU keeps its ids across runs: the driver's own information file -----
def _driver_tree(root: Path, rows: list[tuple[str, str, int]]) -> None:
    """/proc/driver/nvidia/gpus/<bus>/information as the driver writes it (tabs, its keys)."""
    for uuid, bus, minor in rows:
        d = root / "driver" / "nvidia" / "gpus" / bus
        d.mkdir(parents=True)
        (d / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 159\nGPU UUID: \t {uuid}\n"
            f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
            "GPU Firmware: \t 550.127.05\nGPU Excluded:\t No\n")


@pytest.mark.parametrize("how", ["lost", "uuid getter"])
def test_a_fresh_process_draws_a_lost_gpu_with_the_driver_s_uuid_and_bus_id(
        lib: Path, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        how: str) -> None:
    """A one-shot `gpus`, the VM hook and `reset` start with no earlier NVML answer: GPU 1,
    fallen off the bus (every getter GPU_IS_LOST: matched in PCI order) or with only its
    name/UUID getter failing (matched by its minor), gets its UUID, bus id and model from
    /proc/driver/nvidia/gpus/<bus>/information, and is drawn lost with them."""
    from pveclean.commands.gpulook import _ask_nvml
    from pveclean.commands.gpuview import _gpu_lines
    from pveclean.core.gpumap import gpu_use
    from pveclean.host import procfs, worker

    monkeypatch.setitem(worker.state(), "gpu_known", {})
    gpus, _, buses, _ = _ask_nvml(session(lib), [])
    real = {g.index: (g.uuid, str(buses[g.index]), g.minor) for g in gpus}
    _driver_tree(tmp_path / "proc", [(u, b, m) for u, b, m in real.values()
                                     if m is not None])
    monkeypatch.setattr(procfs, "PROC", str(tmp_path / "proc"))
    monkeypatch.setitem(worker.state(), "gpu_known", {})  # a fresh process: nothing known
    if how == "lost":
        fake.lose(1)
    else:
        fake.gpu_error(1, "info", "GPU_IS_LOST")
    gpus, _, buses, _ = _ask_nvml(session(lib), [])
    g = {x.index: x for x in gpus}[1]
    assert g.status == "lost" and (g.uuid, str(buses[1]), g.minor) == real[1]
    assert g.name in ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3")
    assert {x.index: x.uuid for x in gpus}[0] == real[0][0]  # the others: NVML's own
    text = "\n".join(_gpu_lines(gpu_use(g, buses.get(1), []), {}))
    assert real[1][0] in text and real[1][1] in text and "LOST" in text
    assert "no process holds this GPU" not in text
