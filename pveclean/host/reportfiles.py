"""Reports: one YAML file per run, redacted, written atomically (0600 in a 0700 dir)."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from pveclean.core.bounds import UNSAVED_SHOWN
from pveclean.core.lazyre import lazy
from pveclean.host.wholefile import exclusive_temp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from pveclean.core.report import Report
    from pveclean.core.reportread import ReportRow


class ReportError(Exception):
    """A report that could not be written or read: `str()` is the whole line. Its one
    argument is its message, so it pickles whole across the worker (as psutil's do)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def utc_stamp(t: float) -> str:
    """20261203T065312.253174Z: the time in a report's name."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y%m%dT%H%M%S.%fZ")


WIDTH = 2**31 - 1  # columns: a long string is never folded over lines
_SURROGATES = lazy("[\ud800-\udfff]")  # os.fsdecode's stand-ins for undecodable bytes
_BREAKS = lazy("[\r\x85\u2028\u2029]")  # line breaks besides \n


def to_yaml(report: Mapping[str, object], terminal: bool = False) -> str:
    """The report as YAML in block layout (PyYAML's safe dumper, libyaml's where present);
    multi-line text as a literal block where it can be one verbatim. For a terminal
    everything but printable ASCII is escaped: bidi overrides and other format characters
    are printable to YAML but not safe on a screen."""
    import yaml

    return yaml.dump(report, Dumper=_dumper(), sort_keys=False, default_flow_style=False,
                     allow_unicode=not terminal, width=WIDTH)


@functools.cache
def _dumper() -> Any:
    """The safe dumper, writing a lone surrogate as U+FFFD (libyaml can neither encode one
    nor read its escape back), multi-line text as `|`, and text with a line break other than
    \n escaped in double quotes (PyYAML reads one back from single quotes as a space)."""
    import yaml

    class Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
        pass

    def text(dumper: Any, s: str) -> Any:
        style = "|" if "\n" in s else None
        if "\r" in s or not s.isascii():
            s = _SURROGATES.sub("\ufffd", s)
            style = '"' if _BREAKS.search(s) else style
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)

    Dumper.add_representer(str, text)
    return Dumper


def ensure_dir(report_dir: str) -> Path:
    """The report dir; created 0700 when missing. An existing directory keeps its mode:
    pveclean chmods only what it created (report_dir: /var/log must not become 0700).
    Reports are 0600 files created with O_EXCL, safe in a shared directory too."""
    d = Path(report_dir)
    try:
        if not d.is_dir():
            d.mkdir(mode=0o700, parents=True)
            os.chmod(d, 0o700)  # mkdir's mode went through the umask
    except FileExistsError:
        pass  # made by a concurrent run
    except OSError as exc:
        raise ReportError(f"cannot create report dir {d}: {exc.strerror}") from None
    return d


def report_name(vmid: int, phase: str, started: float) -> str:
    return f"{vmid}-{phase}-{utc_stamp(started)}.yaml"


def write_report(rep: Report, report_dir: str) -> Path:
    """A run's report, named by its container, phase and start (report_name)."""
    return write(rep.as_dict(), report_dir, report_name(rep.vmid, rep.phase, rep.started))


def write(report: Mapping[str, object], report_dir: str, name: str) -> Path:
    """Write atomically as `name` (or `name` with -1, -2... when that is taken): temp file in
    the same dir, fsync, rename. Never overwrites."""
    d = ensure_dir(report_dir)
    text = to_yaml(report)
    try:
        fd, tmp = exclusive_temp(d, ".tmp-", ".yaml")
    except OSError as exc:
        raise ReportError(f"cannot write report in {d}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        target = d / name
        for i in range(1, 100):
            try:
                os.link(tmp, target)  # fails if it exists: never overwrite another run's report
                break
            except FileExistsError:
                target = d / name.replace(".yaml", f"-{i}.yaml")
        os.unlink(tmp)
        return target
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ReportError(f"cannot write report in {d}: {exc.strerror}") from None


SPARE_DIR = "/run/pveclean/unsaved"  # tmpfs: writable when the report dir is not, never hung
SPARE_KEEP = 20  # per container


def write_spare(report: Report, keep: int = SPARE_KEEP,
                spare_dir: str = SPARE_DIR) -> Path | None:
    """A report that could not be written to the report dir, written whole to SPARE_DIR
    (0600 in 0700, named as in the report dir; at most `keep` per container, the oldest
    go); None when even that failed. /run is a tmpfs on Proxmox: it cannot hang, and it is
    gone after a reboot (the syslog line names the file, the report is bounded in size)."""
    try:
        path = write_report(report, spare_dir)
    except ReportError:
        return None
    prune(spare_dir, report.vmid, keep, max_age_days=365)
    return path


def unsaved_text(report: Report, spare: Path | None, limit: int = UNSAVED_SHOWN) -> str:
    """An unsaved report for stderr (the task log, a terminal): its YAML with everything but
    printable ASCII escaped, cut at a line break within `limit` characters, and where the
    whole one is."""
    text = to_yaml(report.as_dict(), terminal=True)
    where = (f"the whole report is in {spare}" if spare is not None else
             "the whole report could not be kept anywhere; see the journal: journalctl -t "
             "pveclean")
    if len(text) > limit:
        end = text.rfind("\n", 0, limit) + 1 or limit
        text = f"{text[:end]}# … cut here: {len(text) - end} more characters; {where}\n"
    else:
        text += f"# {where}\n" if spare is not None else ""
    return text


def list_reports(report_dir: str, vmid: int | None = None) -> list[Path]:
    """The reports in `report_dir` (of one container), oldest first: by the time in the name."""
    prefix = f"{vmid}-" if vmid is not None else ""
    try:
        with os.scandir(report_dir) as it:
            names = [e.name for e in it if e.name.endswith(".yaml")
                     and e.name.startswith(prefix) and not e.name.startswith(".")]
    except OSError:
        return []
    d = Path(report_dir)
    return [d / n for n in sorted(names, key=lambda n: (n.split("-")[-1], n))]


def load(path: Path) -> dict[str, object]:
    """A report file's plain values, as YAML gives them (read as a report by
    core/reportread.py); ReportError naming the file when it is no YAML mapping."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ReportError(f"{path}: not valid YAML{where}") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a text file") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: not a pveclean report")
    return data


def load_report(path: Path) -> Report:
    """A report file as a typed Report (core/reportread.py); ReportError naming the file
    when it is unreadable or no container's report."""
    from pveclean.core.reportread import UnreadableReport, from_dict

    try:
        return from_dict(load(path))
    except UnreadableReport as exc:
        raise ReportError(f"{path}: {exc}") from None


def load_row(path: Path) -> ReportRow:
    """A report file as `pveclean reports` lists it (any report: a VM's too)."""
    from pveclean.core.reportread import row_of

    return row_of(path.name, load(path))


def latest(report_dir: str, vmid: int, phase: str, max_age: float, now: float
           ) -> Path | None:
    """The newest report of container `vmid` in `phase`, by its name (report_name), when it
    was written within `max_age` s of `now`."""
    for path in reversed(list_reports(report_dir, vmid)):
        if not path.name.startswith(f"{vmid}-{phase}-"):
            continue
        try:
            return path if now - path.stat().st_mtime <= max_age else None
        except OSError:
            return None
    return None


def prune(report_dir: str, vmid: int, keep: int, max_age_days: float) -> int:
    """Retention: at most `keep` reports per container, none older than `max_age_days`.
    This container's first, oldest first, so the age check stops at the first report young
    enough (every run prunes: a stat of each of a hundred reports was most of a report's
    cost); then every other container's (a destroyed one's too) by the time in their names,
    without a stat (prune_others). Returns how many of this container's went."""
    files = list_reports(report_dir, vmid)
    excess = len(files) - keep
    now = time.time()
    removed = 0
    for i, p in enumerate(files):
        try:
            if i >= excess and now - p.stat().st_mtime <= max_age_days * 86400:
                break
            p.unlink()
            removed += 1
        except OSError:
            continue
    prune_others(report_dir, vmid, keep, max_age_days, now)
    return removed


_NAME_STAMP = lazy(r"-(\d{8}T\d{6}\.\d{6}Z)(?:-\d+)?\.yaml")


def name_time(name: str) -> float | None:
    """The start time in a report's name (`129-manual-20261203T065312.253174Z.yaml`, or with
    write()'s `-1` when that name was taken)."""
    m = _NAME_STAMP.search(name)
    if m is None or not name.endswith(m.group(0)):
        return None
    try:
        return datetime.strptime(m.group(1), "%Y%m%dT%H%M%S.%fZ").replace(
            tzinfo=UTC).timestamp()
    except ValueError:
        return None


def prune_others(report_dir: str, vmid: int | None, keep: int, max_age_days: float,
                 now: float) -> int:
    """Retention over every container but `vmid`: the oldest past `keep` per container, and
    any whose name says it is older than `max_age_days`. A name that is not a report's is
    left alone."""
    per: dict[str, list[tuple[float, Path]]] = {}
    for p in list_reports(report_dir):
        ct = p.name.split("-", 1)[0]
        when = name_time(p.name)
        if when is None or not ct.isdigit() or (vmid is not None and ct == str(vmid)):
            continue
        per.setdefault(ct, []).append((when, p))
    removed = 0
    for files in per.values():
        excess = len(files) - keep
        for i, (when, p) in enumerate(files):
            if i < excess or now - when > max_age_days * 86400:
                with contextlib.suppress(OSError):
                    p.unlink()
                    removed += 1
    return removed
