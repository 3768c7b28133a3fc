"""Tests for the fake NVML library, driven through the real, unmodified pynvml.

pynvml caches the loaded library per process, so every NVML query runs in a fresh
subprocess that finds the fake through LD_LIBRARY_PATH (pynvml's own
``CDLL("libnvidia-ml.so.1")``) or through a preloaded ``pynvml.nvmlLib``.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_spec = importlib.util.spec_from_file_location(
    "_fakenvml_under_test", Path(__file__).parent.parent / "harness" / "fakenvml.py"
)
assert _spec is not None and _spec.loader is not None
fakenvml = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fakenvml
_spec.loader.exec_module(fakenvml)
FakeNvml = fakenvml.FakeNvml

MIB = 1024 * 1024
NOT_AVAILABLE = 2**64 - 1

# Dumps everything pveclean cares about as JSON; NVML errors become {"error": class name}.
DUMP = r"""
import json, sys, time
import pynvml

def mem(h):
    m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    return {"v1": [m1.total, m1.free, m1.used],
            "v2": [m2.version, m2.total, m2.reserved, m2.free, m2.used]}

def text(v):
    return v.decode() if isinstance(v, bytes) else v

def procs(fn, h):
    try:
        return [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in fn(h)]
    except pynvml.NVMLError as e:
        return {"error": type(e).__name__, "value": e.value}

out = {}
try:
    t0 = time.monotonic()
    pynvml.nvmlInit()
    out["init_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    n = pynvml.nvmlDeviceGetCount()
    out["count_s"] = time.monotonic() - t0
    out["count"] = n
    out["driver"] = pynvml.nvmlSystemGetDriverVersion()
    out["gpus"] = []
    for i in range(n):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        h2 = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        out["gpus"].append({
            "index": pynvml.nvmlDeviceGetIndex(h),
            "index_by_uuid": pynvml.nvmlDeviceGetIndex(h2),
            "name": pynvml.nvmlDeviceGetName(h),
            "uuid": uuid,
            "minor": pynvml.nvmlDeviceGetMinorNumber(h),
            "bus_id": text(pynvml.nvmlDeviceGetPciInfo_v3(h).busId),
            "mem": mem(h),
            "compute": procs(pynvml.nvmlDeviceGetComputeRunningProcesses, h),
            "graphics": procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses, h),
        })
    pynvml.nvmlShutdown()
except pynvml.NVMLError as e:
    out["error"] = type(e).__name__
    out["value"] = e.value
    out["message"] = str(e)
print(json.dumps(out))
"""


def run_py(script: str, env: dict[str, str], timeout: float = 30) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def lib_env(fake: Any) -> dict[str, str]:
    """A minimal environment whose only NVML hint is LD_LIBRARY_PATH."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **fake.env()}


def dump(fake: Any) -> dict[str, Any]:
    result: dict[str, Any] = run_py(DUMP, lib_env(fake))
    return result


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    f = FakeNvml(tmp_path / "nvml")
    f.build()
    return f


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["sleep", "600"])
    yield p
    if p.poll() is None:
        p.kill()
        p.wait()


def proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat[stat.rindex(")") + 2]


def wait_zombie(pid: int) -> None:
    deadline = time.monotonic() + 10
    while proc_state(pid) != "Z":
        assert time.monotonic() < deadline, f"pid {pid} never became a zombie"
        time.sleep(0.01)


# -- build -----------------------------------------------------------------------------------


def test_build_skips_when_up_to_date_and_paths(tmp_path: Path) -> None:
    f = FakeNvml(tmp_path)
    lib = f.build()
    assert lib == f.lib_path == tmp_path.resolve() / "libnvidia-ml.so.1"
    assert f.state_path == tmp_path.resolve() / "fakenvml.state"
    assert f.env() == {"LD_LIBRARY_PATH": str(tmp_path.resolve())}
    mtime = lib.stat().st_mtime_ns
    time.sleep(0.01)
    assert f.build() == lib
    assert lib.stat().st_mtime_ns == mtime  # not recompiled
    os.utime(lib, (0, 0))  # older than the source: recompiled
    f.build()
    assert lib.stat().st_mtime_ns != 0


def test_build_without_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    with pytest.raises(RuntimeError, match="not found"):
        FakeNvml(tmp_path).build()


def test_state_file_is_rendered(tmp_path: Path) -> None:
    f = FakeNvml(tmp_path)
    assert "gpu" not in f.state_path.read_text()
    f.add_gpu(0, uuid="GPU-a", name="X", total_mib=100, reserved_mib=10, minor=3)
    f.set_process(0, 42, None, counted_mib=7)
    f.set_process(0, 43, 5, kind="graphics")
    f.leak(0, 9)
    f.init_error("NVML_ERROR_DRIVER_NOT_LOADED")
    f.hang(0.5)
    f.proc_query_error(15)
    lines = [ln for ln in f.state_path.read_text().splitlines() if not ln.startswith("#")]
    assert lines == [
        "init_error DRIVER_NOT_LOADED",
        "hang 0.5",
        "proc_query_error 15",
        "gpu 0 GPU-a X 100 10 3",
        "proc 0 42 na:7 compute",
        "proc 0 43 5 graphics",
        "leak 0 9",
    ]
    f.init_error(None)
    f.hang(None)
    f.proc_query_error(None)
    f.clear_leaks()
    f.remove_process(0, 42)
    assert f.state_path.read_text().splitlines()[1:] == [
        "gpu 0 GPU-a X 100 10 3",
        "proc 0 43 5 graphics",
    ]
    assert not list(tmp_path.glob(".fakenvml.*"))  # no temp files left behind
    with pytest.raises(ValueError):
        f.add_gpu(1, name="has space")


# -- devices ---------------------------------------------------------------------------------


def test_no_state_file_means_zero_gpus(fake: Any) -> None:
    fake.state_path.unlink()
    out = dump(fake)
    assert out["count"] == 0
    assert out["gpus"] == []
    assert out["driver"] == "550.127.05"


def test_devices_names_uuids_minors(fake: Any) -> None:
    fake.add_gpu(0)
    fake.add_gpu(1, uuid="GPU-11111111-2222-3333-4444-555555555555", name="NVIDIA-A100", minor=7)
    out = dump(fake)
    assert out["count"] == 2
    g0, g1 = out["gpus"]
    assert (g0["index"], g0["index_by_uuid"], g0["minor"]) == (0, 0, 0)
    assert g0["name"] == "NVIDIA-H100-80GB-HBM3"
    assert g0["uuid"] == "GPU-fa4e0000-0000-4000-8000-000000000000"
    assert (g1["index"], g1["index_by_uuid"], g1["minor"]) == (1, 1, 7)
    assert g1["name"] == "NVIDIA-A100"
    assert g1["uuid"] == "GPU-11111111-2222-3333-4444-555555555555"
    assert g0["bus_id"] != g1["bus_id"]
    assert g0["bus_id"].startswith("00000000:")


def test_memory_info_v1_and_v2(fake: Any) -> None:
    fake.add_gpu(0, total_mib=1000, reserved_mib=100)
    mem = dump(fake)["gpus"][0]["mem"]
    # v1: used includes the reserved memory
    assert mem["v1"] == [1000 * MIB, 900 * MIB, 100 * MIB]
    # v2 (real NVML semantics): reserved reported apart, total = reserved + free + used
    assert mem["v2"] == [0x02000028, 1000 * MIB, 100 * MIB, 900 * MIB, 0]


def test_processes_and_leaks_in_memory_and_lists(fake: Any, sleeper: Any) -> None:
    fake.add_gpu(0, total_mib=1000, reserved_mib=100)
    fake.add_gpu(1, total_mib=1000, reserved_mib=0)
    me = os.getpid()
    fake.set_process(0, sleeper.pid, 300)
    fake.set_process(0, me, 50, kind="graphics")
    fake.set_process(1, me, 20)
    fake.leak(0, 7)
    g0, g1 = dump(fake)["gpus"]
    none = 0xFFFFFFFF
    assert g0["compute"] == [[sleeper.pid, 300 * MIB, none, none]]
    assert g0["graphics"] == [[me, 50 * MIB, none, none]]
    used0 = 100 + 300 + 50 + 7
    assert g0["mem"]["v1"] == [1000 * MIB, (1000 - used0) * MIB, used0 * MIB]
    assert g0["mem"]["v2"][2:] == [100 * MIB, (1000 - used0) * MIB, (used0 - 100) * MIB]
    assert g1["compute"] == [[me, 20 * MIB, none, none]]
    assert g1["graphics"] == []
    assert g1["mem"]["v1"][2] == 20 * MIB

    fake.clear_leaks()
    fake.remove_process(0, me)
    g0 = dump(fake)["gpus"][0]
    assert g0["graphics"] == []
    assert g0["mem"]["v1"][2] == 400 * MIB


def test_dead_pid_is_not_counted(fake: Any) -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    fake.add_gpu(0, total_mib=1000, reserved_mib=0)
    fake.set_process(0, p.pid, 500)
    g0 = dump(fake)["gpus"][0]
    assert g0["compute"] == []
    assert g0["mem"]["v1"][2] == 0


def test_memory_freed_when_process_killed_and_reaped(fake: Any, sleeper: Any) -> None:
    fake.add_gpu(0, total_mib=1000, reserved_mib=10)
    fake.set_process(0, sleeper.pid, 600)
    g0 = dump(fake)["gpus"][0]
    assert [p[0] for p in g0["compute"]] == [sleeper.pid]
    assert g0["mem"]["v1"][2] == 610 * MIB
    sleeper.kill()
    sleeper.wait()
    assert proc_state(sleeper.pid) is None
    g0 = dump(fake)["gpus"][0]
    assert g0["compute"] == []
    assert g0["mem"]["v1"][2] == 10 * MIB


def test_zombie_is_not_counted(fake: Any, sleeper: Any) -> None:
    fake.add_gpu(0, total_mib=1000, reserved_mib=10)
    fake.set_process(0, sleeper.pid, 600, kind="graphics")
    assert dump(fake)["gpus"][0]["mem"]["v1"][2] == 610 * MIB
    sleeper.kill()
    wait_zombie(sleeper.pid)  # killed but not reaped
    g0 = dump(fake)["gpus"][0]
    assert g0["graphics"] == []
    assert g0["mem"]["v1"][2] == 10 * MIB
    assert proc_state(sleeper.pid) == "Z"


def test_not_available_process_memory(fake: Any, sleeper: Any) -> None:
    fake.add_gpu(0, total_mib=1000, reserved_mib=0)
    fake.set_process(0, sleeper.pid, None, counted_mib=250)
    fake.set_process(0, os.getpid(), None)
    g0 = dump(fake)["gpus"][0]
    # pynvml maps NVML_VALUE_NOT_AVAILABLE to None
    assert sorted(g0["compute"]) == sorted(
        [[sleeper.pid, None, 0xFFFFFFFF, 0xFFFFFFFF], [os.getpid(), None, 0xFFFFFFFF, 0xFFFFFFFF]]
    )
    assert g0["mem"]["v1"][2] == 250 * MIB
    sleeper.kill()
    sleeper.wait()
    assert dump(fake)["gpus"][0]["mem"]["v1"][2] == 0


RAW_PROTOCOL = r"""
import ctypes, json, pynvml
from ctypes import byref, c_uint
pynvml.nvmlInit()
lib = pynvml.nvmlLib
h = pynvml.nvmlDeviceGetHandleByIndex(0)
Info = pynvml.c_nvmlProcessInfo_v3_t
out = {}
for name in ("nvmlDeviceGetComputeRunningProcesses_v3",
             "nvmlDeviceGetComputeRunningProcesses_v2"):
    fn = getattr(lib, name)
    n = c_uint(0)
    r0 = fn(h, byref(n), None)
    n0 = n.value
    n = c_uint(1)
    arr = (Info * 1)()
    r1 = fn(h, byref(n), arr)
    n1 = n.value
    n = c_uint(5)
    arr = (Info * 5)()
    r2 = fn(h, byref(n), arr)
    out[name] = [r0, n0, r1, n1, r2, n.value,
                 [[e.pid, e.usedGpuMemory, e.gpuInstanceId, e.computeInstanceId]
                  for e in arr[:n.value]]]

class V1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]
n = c_uint(4)
arr = (V1 * 4)()
r = lib.nvmlDeviceGetComputeRunningProcesses(h, byref(n), arr)
out["v1"] = [r, n.value, [[e.pid, e.usedGpuMemory] for e in arr[:n.value]]]

n = c_uint(0)
out["graphics_empty"] = [lib.nvmlDeviceGetGraphicsRunningProcesses_v3(h, byref(n), None), n.value]
out["null_count"] = lib.nvmlDeviceGetComputeRunningProcesses_v3(h, None, None)
print(json.dumps(out))
"""


def test_process_list_size_protocol(fake: Any, sleeper: Any) -> None:
    fake.add_gpu(0)
    me = os.getpid()
    fake.set_process(0, me, 100)
    fake.set_process(0, sleeper.pid, 200)
    out = run_py(RAW_PROTOCOL, lib_env(fake))
    entries = [
        [me, 100 * MIB, 0xFFFFFFFF, 0xFFFFFFFF],
        [sleeper.pid, 200 * MIB, 0xFFFFFFFF, 0xFFFFFFFF],
    ]
    for name in (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
    ):
        # count 0 -> INSUFFICIENT_SIZE + needed count; too small -> same; enough -> SUCCESS
        assert out[name] == [7, 2, 7, 2, 0, 2, entries], name
    assert out["v1"] == [0, 2, [[me, 100 * MIB], [sleeper.pid, 200 * MIB]]]
    assert out["graphics_empty"] == [0, 0]  # no processes: SUCCESS with count 0
    assert out["null_count"] == 2  # INVALID_ARGUMENT


# -- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "cls", "value"),
    [
        ("DRIVER_NOT_LOADED", "NVMLError_DriverNotLoaded", 9),
        ("LIB_RM_VERSION_MISMATCH", "NVMLError_LibRmVersionMismatch", 18),
        ("NO_PERMISSION", "NVMLError_NoPermission", 4),
        ("UNKNOWN", "NVMLError_Unknown", 999),
        (9, "NVMLError_DriverNotLoaded", 9),
    ],
)
def test_init_errors(fake: Any, error: str | int, cls: str, value: int) -> None:
    fake.add_gpu(0)
    fake.init_error(error)
    out = dump(fake)
    assert (out["error"], out["value"]) == (cls, value)
    assert "count" not in out
    fake.init_error(None)
    assert dump(fake)["count"] == 1


def test_init_error_message_comes_from_library(fake: Any) -> None:
    fake.init_error(28)  # a code pynvml has no built-in text for: asks nvmlErrorString
    out = dump(fake)
    assert (out["error"], out["message"]) == ("NVMLError_GpuNotFound", "GPU not found")


def test_proc_query_error(fake: Any, sleeper: Any) -> None:
    fake.add_gpu(0, total_mib=1000, reserved_mib=0)
    fake.set_process(0, sleeper.pid, 100)
    fake.proc_query_error("GPU_IS_LOST")
    g0 = dump(fake)["gpus"][0]
    assert g0["compute"] == {"error": "NVMLError_GpuIsLost", "value": 15}
    assert g0["graphics"] == {"error": "NVMLError_GpuIsLost", "value": 15}
    assert g0["mem"]["v1"][2] == 100 * MIB  # memory queries still work


def test_hang(fake: Any) -> None:
    fake.add_gpu(0)
    fake.hang(0.3)
    out = dump(fake)
    assert out["count"] == 1
    assert out["init_s"] >= 0.3
    assert out["count_s"] >= 0.3
    fake.hang(None)
    out = dump(fake)
    assert out["init_s"] < 0.3


UNINIT = r"""
import ctypes, json, pynvml
from ctypes import byref, c_uint
pynvml._LoadNvmlLibrary()
lib = pynvml.nvmlLib
n = c_uint(77)
out = {"before": lib.nvmlDeviceGetCount_v2(byref(n))}
pynvml.nvmlInit()
h = ctypes.c_void_p()
out["bad_index"] = lib.nvmlDeviceGetHandleByIndex_v2(5, byref(h))
out["bad_handle"] = lib.nvmlDeviceGetMinorNumber(ctypes.c_void_p(16), byref(n))
out["bad_uuid"] = lib.nvmlDeviceGetHandleByUUID(b"GPU-nope", byref(h))
hd = pynvml.nvmlDeviceGetHandleByIndex(0)
try:
    pynvml.nvmlDeviceGetMemoryInfo(hd, version=1)
except pynvml.NVMLError as e:
    out["bad_version"] = type(e).__name__
small = ctypes.create_string_buffer(4)
out["small_name"] = lib.nvmlDeviceGetName(hd, small, 4)
pynvml.nvmlShutdown()
out["after"] = lib.nvmlDeviceGetCount_v2(byref(n))
out["shutdown_again"] = lib.nvmlShutdown()
print(json.dumps(out))
"""


def test_uninitialized_and_bad_arguments(fake: Any) -> None:
    fake.add_gpu(0)
    out = run_py(UNINIT, lib_env(fake))
    assert out == {
        "before": 1,
        "bad_index": 2,
        "bad_handle": 2,
        "bad_uuid": 6,
        "bad_version": "NVMLError_ArgumentVersionMismatch",
        "small_name": 7,
        "after": 1,
        "shutdown_again": 1,
    }


def test_malformed_lines_are_ignored(fake: Any) -> None:
    fake.state_path.write_text(
        "\n".join(
            [
                "# comment",
                "gpu 0 GPU-ok NAME 1000 100  # trailing comment",
                "gpu x GPU-bad NAME 1000 100",
                "gpu 1 GPU-bad NAME 100 1000",  # reserved > total
                "gpu 2 GPU-bad",
                "gpu 0 GPU-duplicate NAME 1000 100",
                f"proc 0 {os.getpid()} lots",
                f"proc 0 {os.getpid()} 5 sideways",
                "leak 0 -5",
                "hang soon",
                "init_error NOT_AN_ERROR",
                "bogus directive",
                "x" * 5000,
                f"proc 0 {os.getpid()} 33",
            ]
        )
        + "\n"
    )
    out = dump(fake)
    assert out["count"] == 1
    g0 = out["gpus"][0]
    assert g0["uuid"] == "GPU-ok"
    assert g0["compute"] == [[os.getpid(), 33 * MIB, 0xFFFFFFFF, 0xFFFFFFFF]]
    assert g0["mem"]["v1"][2] == 133 * MIB


# -- loading ---------------------------------------------------------------------------------


PRELOAD = r"""
import ctypes, json, os, pynvml
pynvml.nvmlLib = ctypes.CDLL({lib!r})   # what pveclean does for a configured library path
pynvml.nvmlInit()                        # _LoadNvmlLibrary() keeps the preloaded library
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print(json.dumps({{
    "env": sorted(os.environ),
    "count": pynvml.nvmlDeviceGetCount(),
    "uuid": pynvml.nvmlDeviceGetUUID(h),
    "used": pynvml.nvmlDeviceGetMemoryInfo(h).used,
}}))
"""


def test_preloaded_library_with_cleared_environment(fake: Any, tmp_path: Path) -> None:
    fake.add_gpu(0, uuid="GPU-beside-the-so", total_mib=1000, reserved_mib=123)
    fake.add_gpu(1)
    # a state file in the working directory must not be picked up
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    (cwd / "fakenvml.state").write_text("gpu 0 GPU-wrong X 1 0\n")
    proc = subprocess.run(
        [sys.executable, "-c", PRELOAD.format(lib=str(fake.lib_path))],
        env={},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "LD_LIBRARY_PATH" not in out["env"]
    assert "FAKE_NVML_STATE" not in out["env"]
    assert out["count"] == 2
    assert out["uuid"] == "GPU-beside-the-so"
    assert out["used"] == 123 * MIB


def test_state_path_from_environment(fake: Any, tmp_path: Path) -> None:
    fake.add_gpu(0)
    other = FakeNvml(tmp_path / "other")  # only used to write a second state file
    other.add_gpu(0, uuid="GPU-from-env")
    other.add_gpu(1)
    other.add_gpu(2)
    out = run_py(DUMP, {**lib_env(fake), "FAKE_NVML_STATE": str(other.state_path)})
    assert out["count"] == 3
    assert out["gpus"][0]["uuid"] == "GPU-from-env"


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML is installed"
)
def test_without_library_pynvml_reports_library_not_found(tmp_path: Path) -> None:
    out = run_py(DUMP, {"PATH": os.environ.get("PATH", ""), "LD_LIBRARY_PATH": str(tmp_path)})
    assert out["error"] == "NVMLError_LibraryNotFound"


def test_state_changes_are_seen_by_a_running_process(fake: Any) -> None:
    fake.add_gpu(0)
    script = r"""
    import json, sys, pynvml
    pynvml.nvmlInit()
    counts = []
    for line in sys.stdin:
        counts.append(pynvml.nvmlDeviceGetCount())
        print("ok", flush=True)
    print(json.dumps(counts))
    """
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=lib_env(fake),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdin is not None and p.stdout is not None
    for index in (1, 2):
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline() == "ok\n"
        fake.add_gpu(index)
    p.stdin.write("go\n")
    p.stdin.close()
    assert p.stdout.readline() == "ok\n"
    assert json.loads(p.stdout.readline()) == [1, 2, 3]
    assert p.wait(timeout=30) == 0


def test_release_keeps_a_dead_holders_memory_under_no_process_then_gives_it_back(
        fake: Any) -> None:
    fake.add_gpu(0, total_mib=20000, reserved_mib=0)
    fake.add_gpu(1, total_mib=20000, reserved_mib=0)
    holder = subprocess.Popen(["sleep", "600"])
    fake.set_process(0, holder.pid, 8000)
    fake.set_process(1, holder.pid, 4000)
    fake.release(0, 1.0, steps=2)  # GPU 1 has none: its memory goes with the process
    assert dump(fake)["gpus"][0]["mem"]["v2"][4] == 8000 * MIB
    holder.kill()
    holder.wait()
    t0 = time.monotonic()
    g0, g1 = dump(fake)["gpus"]
    assert g0["compute"] == [] and g0["mem"]["v2"][4] == 8000 * MIB  # listed under no one
    assert g1["mem"]["v2"][4] == 0
    assert f"died {holder.pid} " in fake.state_path.read_text()  # the library's first sight
    fake.write()  # a rewrite keeps the library's "died" line: the clock is not restarted
    assert f"died {holder.pid} " in fake.state_path.read_text()
    time.sleep(max(0.0, 0.6 - (time.monotonic() - t0)))
    assert dump(fake)["gpus"][0]["mem"]["v2"][4] == 4000 * MIB  # one step of two given back
    time.sleep(0.6)
    assert dump(fake)["gpus"][0]["mem"]["v2"][4] == 0


def test_release_inf_never_gives_it_back_and_none_frees_with_the_process(fake: Any) -> None:
    fake.add_gpu(0, total_mib=20000, reserved_mib=0)
    holder = subprocess.Popen(["sleep", "600"])
    fake.set_process(0, holder.pid, 3000)
    fake.release(0, float("inf"))
    assert "release 0 inf 1" in fake.state_path.read_text()
    holder.kill()
    holder.wait()
    assert dump(fake)["gpus"][0]["mem"]["v2"][4] == 3000 * MIB
    fake.release(0, None)
    assert dump(fake)["gpus"][0]["mem"]["v2"][4] == 0
    with pytest.raises(ValueError):
        fake.release(0, -1.0)


def test_driver_version_directive(fake: Any) -> None:
    fake.add_gpu(0)
    assert dump(fake)["driver"] == "550.127.05"
    fake.set_driver_version("535.183.01")
    assert "driver_version 535.183.01" in fake.state_path.read_text()
    assert dump(fake)["driver"] == "535.183.01"
    fake.set_driver_version(None)
    assert dump(fake)["driver"] == "550.127.05"
