"""reportfiles: one report per run, written exclusively (0600, never over another), listed by the
time in its name, loaded back, pruned. Tested by round trip, not by the YAML text."""

from __future__ import annotations

import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from pveclean.host import reportfiles, wholefile
from pveclean.host.reportfiles import ReportError

T0 = 1764744792.253174  # 2025-12-03T06:53:12.253174Z


def _report(vmid: int = 129, phase: str = "manual", started: float = T0,
            **extra: Any) -> dict[str, Any]:
    rep: dict[str, Any] = {"vmid": vmid, "phase": phase, "verdict": "clean",
                           "_started": started, "_internal": object(),
                           "holders": [{"host_pid": 4242, "name": "python3",
                                        "cmdline": "python3 -c 'x: [1]' # \"q\"",
                                        "devices": ["/dev/nvidia0 (195:0)"]}],
                           "summary": {"holders": 1, "stopped": 1, "freed_mib": 1234},
                           "warnings": [], "note": None, "ratio": 0.5, "flag": True}
    rep.update(extra)
    return rep


def _write(rep: dict[str, Any], report_dir: str) -> Path:
    """A plain document written as a report named by its container, phase and start (the
    keys starting with `_` stand for what a Report keeps and does not write)."""
    body = {k: v for k, v in rep.items() if not k.startswith("_")}
    return reportfiles.write(body, report_dir,
                             reportfiles.report_name(rep["vmid"], rep["phase"], rep["_started"]))


def test_names_carry_the_utc_time() -> None:
    assert reportfiles.utc_stamp(T0) == datetime.fromtimestamp(T0, UTC).strftime(
        "%Y%m%dT%H%M%S.%fZ")
    assert reportfiles.report_name(129, "pre-start", T0) == \
        f"129-pre-start-{reportfiles.utc_stamp(T0)}.yaml"
    assert reportfiles.utc_stamp(1796280792.253174) == "20261203T065312.253174Z"


def test_write_and_load_round_trip(tmp_path: Path) -> None:
    rep = _report()
    path = _write(rep, str(tmp_path / "reports"))
    assert path.name == reportfiles.report_name(129, "manual", T0)
    loaded = reportfiles.load(path)
    assert loaded == {k: v for k, v in rep.items() if not k.startswith("_")}


def test_a_report_is_valid_yaml_for_any_reader(tmp_path: Path) -> None:
    rep = _report(holders=[{"name": "evil\x1b[2J\u202e", "cmdline": "a: b\n- c\n'\"",
                            "empty": "", "num_like": "0129", "bool_like": "yes"}])
    path = _write(rep, str(tmp_path))
    assert yaml.safe_load(path.read_text(encoding="utf-8"))["holders"] == rep["holders"]


def test_reports_are_0600_in_a_created_0700_directory(tmp_path: Path) -> None:
    d = tmp_path / "a/reports"
    path = _write(_report(), str(d))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert [p.name for p in d.iterdir()] == [path.name]  # no temp file left


def test_an_existing_directory_keeps_its_mode(tmp_path: Path) -> None:
    d = tmp_path / "log"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    assert reportfiles.ensure_dir(str(d)) == d
    assert stat.S_IMODE(d.stat().st_mode) == 0o755


def test_ensure_dir_failure_is_a_report_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ReportError, match="cannot create report dir"):
        reportfiles.ensure_dir(str(tmp_path / "file/reports"))


def test_the_same_name_twice_never_overwrites(tmp_path: Path) -> None:
    first = _write(_report(verdict="clean"), str(tmp_path))
    second = _write(_report(verdict="residual"), str(tmp_path))
    third = _write(_report(verdict="error"), str(tmp_path))
    assert second.name == first.name.replace(".yaml", "-1.yaml")
    assert third.name == first.name.replace(".yaml", "-2.yaml")
    assert [reportfiles.load(p)["verdict"] for p in (first, second, third)] == [
        "clean", "residual", "error"]


def test_a_symlink_at_the_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    d = tmp_path / "reports"
    d.mkdir()
    name = reportfiles.report_name(129, "manual", T0)
    (d / name).symlink_to(victim)
    path = _write(_report(), str(d))
    assert path.name != name and victim.read_text() == "precious\n"


def test_exclusive_temp_creates_new_files_only(tmp_path: Path) -> None:
    fd, path = wholefile.exclusive_temp(tmp_path, ".t-", ".x")
    os.close(fd)
    fd2, path2 = wholefile.exclusive_temp(tmp_path, ".t-", ".x", mode=0o640)
    os.close(fd2)
    assert path != path2
    assert Path(path).name.startswith(".t-") and path.endswith(".x")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 & ~_umask()
    assert stat.S_IMODE(os.stat(path2).st_mode) == 0o640 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_exclusive_temp_gives_up_when_every_name_is_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)
    fd, _ = wholefile.exclusive_temp(tmp_path, "p", "s")
    os.close(fd)
    with pytest.raises(FileExistsError, match="no free temporary name"):
        wholefile.exclusive_temp(tmp_path, "p", "s")


def test_write_into_a_directory_it_cannot_write_is_a_report_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="cannot write report in"):
        _write(_report(), "/proc/1")


def test_list_reports_by_time_in_the_name(tmp_path: Path) -> None:
    names = [reportfiles.report_name(129, "pre-start", T0 + 10),
             reportfiles.report_name(129, "post-stop", T0),
             reportfiles.report_name(1290, "manual", T0 + 5),
             reportfiles.report_name(129, "manual", T0 + 20)]
    for n in names:
        (tmp_path / n).write_text("vmid: 1\n")
    (tmp_path / ".tmp-abc.yaml").write_text("")
    (tmp_path / "129-notes.txt").write_text("")
    got = [p.name for p in reportfiles.list_reports(str(tmp_path), 129)]
    assert got == [names[1], names[0], names[3]]  # phases differ: the time orders them
    assert [p.name for p in reportfiles.list_reports(str(tmp_path))] == [
        names[1], names[2], names[0], names[3]]
    assert reportfiles.list_reports(str(tmp_path / "missing")) == []


def test_list_reports_after_a_collision_keeps_both(tmp_path: Path) -> None:
    a = _write(_report(), str(tmp_path))
    b = _write(_report(), str(tmp_path))
    assert reportfiles.list_reports(str(tmp_path), 129) == sorted([a, b], key=lambda p: p.name)


@pytest.mark.parametrize(("content", "needle"), [
    (b": not [ yaml", "not valid YAML at line 1"),
    (b"a: 1\nb: [\n", "not valid YAML"),
    (b"- a list\n", "not a pveclean report"),
    (b"just text\n", "not a pveclean report"),
    (b"", "not a pveclean report"),
    (b"vmid: \xff\xfe\n", "not a text file"),
])
def test_load_errors_are_report_errors(tmp_path: Path, content: bytes, needle: str) -> None:
    p = tmp_path / "129-manual-x.yaml"
    p.write_bytes(content)
    with pytest.raises(ReportError) as exc:
        reportfiles.load(p)
    assert str(exc.value).startswith(f"{p}: ") and needle in str(exc.value)


def test_load_refuses_python_tags(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text("vmid: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ReportError, match="not valid YAML"):
        reportfiles.load(p)


def test_prune_by_count_and_age(tmp_path: Path) -> None:
    now = time.time()
    paths = []
    for i in range(5):  # one a day, the oldest four days old
        started = now - 86400 * (4 - i)
        p = _write(_report(started=started), str(tmp_path))
        os.utime(p, (started, started))
        paths.append(p)
    other = _write(_report(vmid=130, started=now - 86400 * 30), str(tmp_path))
    os.utime(other, (now - 86400 * 30,) * 2)
    assert reportfiles.prune(str(tmp_path), 129, keep=10, max_age_days=2.5) == 2
    assert reportfiles.list_reports(str(tmp_path), 129) == paths[2:]
    assert reportfiles.prune(str(tmp_path), 129, keep=1, max_age_days=100) == 2
    assert reportfiles.list_reports(str(tmp_path), 129) == paths[4:]
    assert not other.exists()  # CT 130's, 30 days old: retention covers every container
    assert reportfiles.prune(str(tmp_path / "missing"), 129, keep=1, max_age_days=1) == 0


def test_prune_keeps_the_newest_reports_and_no_old_one(tmp_path: Path) -> None:
    """report.prune stats only as far as the first young report (oldest first)."""
    now = time.time()
    names = [reportfiles.report_name(129, "manual", now - 86400 * (10 - i)) for i in range(10)]
    for i, name in enumerate(names):  # one a day, the oldest ten days old
        (tmp_path / name).write_text("vmid: 129\n")
        os.utime(tmp_path / name, (now - 86400 * (10 - i),) * 2)
    (tmp_path / reportfiles.report_name(130, "manual", now - 86400 * 20)).write_text("vmid: 130\n")
    assert reportfiles.prune(str(tmp_path), 129, keep=8, max_age_days=7.5) == 3  # 2 over, 1 old
    assert [p.name for p in reportfiles.list_reports(str(tmp_path), 129)] == names[3:]
    assert reportfiles.prune(str(tmp_path), 129, keep=2, max_age_days=30) == 5
    assert [p.name for p in reportfiles.list_reports(str(tmp_path), 129)] == names[8:]
    assert len(reportfiles.list_reports(str(tmp_path))) == 2  # CT 130's aged out too


def test_retention_covers_every_container_a_destroyed_ones_too(tmp_path: Path) -> None:
    """A run of CT 129 ages out the reports of CT 130 (destroyed long ago) and keeps at most
    `keep` of each container; names that are not reports are left alone."""
    now = time.time()
    old = [reportfiles.report_name(130, "post-stop", now - 86400 * d) for d in (40, 35)]
    many = [reportfiles.report_name(131, "manual", now - 3600 * (6 - h)) for h in range(6)]
    for name in (*old, *many):
        (tmp_path / name).write_text("vmid: 1\n")
    (tmp_path / "notes.yaml").write_text("mine\n")
    (tmp_path / "130-manual-garbled.yaml").write_text("x\n")
    _write(_report(started=now), str(tmp_path))
    assert reportfiles.prune(str(tmp_path), 129, keep=4, max_age_days=30) == 0
    left = {p.name for p in tmp_path.iterdir()}
    assert not left & set(old)  # aged out although CT 130 never ran again
    assert sorted(left & set(many)) == sorted(many[2:])  # the newest 4 of CT 131
    assert {"notes.yaml", "130-manual-garbled.yaml"} <= left


def test_a_report_named_with_writes_suffix_ages_out_too() -> None:
    """write() names a second report of the same microsecond `...Z-1.yaml`: its time is still
    read from its name, so retention over other containers removes it when it is old."""
    plain = reportfiles.name_time("130-post-stop-20200101T000000.000001Z.yaml")
    assert plain is not None
    assert reportfiles.name_time("130-post-stop-20200101T000000.000001Z-1.yaml") == plain
    assert reportfiles.name_time("130-post-stop-20200101T000000.000001Z.yaml.tmp") is None
    assert reportfiles.name_time("notes.yaml") is None
