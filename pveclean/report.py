"""Reports: one YAML file per run, redacted, written atomically (0600 in a 0700 dir)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import time
from pathlib import Path
from typing import Any

import yaml


class ReportError(Exception):
    pass


def utc_stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


MAX_VALUE = 64 << 10  # characters of one string value in a report


class Redactor:
    """Applies the configured patterns: a match's first group is kept, the rest becomes ***.
    Each value is cut to MAX_VALUE first, so the time stays bounded for any pattern."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = [re.compile(p) for p in patterns]

    def text(self, s: str) -> str:
        if len(s) > MAX_VALUE:
            s = s[: MAX_VALUE - 1] + "…"
        for p in self.patterns:
            s = p.sub(self._replace, s)
        return s

    @staticmethod
    def _replace(m: re.Match[str]) -> str:
        head = (m.group(1) or "") if m.re.groups else ""
        tail = (m.group("tail") or "") if "tail" in m.re.groupindex else ""
        return f"{head}***{tail}"

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        return v


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """libyaml's emitter where PyYAML has it: the same text, about 3x faster (a report with
    thousands of holders took seconds with the pure-Python one)."""


def _str_repr(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_repr)


def to_yaml(report: dict[str, Any], terminal: bool = False) -> str:
    """The report as YAML. PyYAML escapes control characters but emits bidi overrides and
    other format characters raw: for a terminal, everything non-ASCII is escaped."""
    return yaml.dump(report, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=not terminal, width=100)


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


def exclusive_temp(d: os.PathLike[str] | str, prefix: str, suffix: str,
                   mode: int = 0o600) -> tuple[int, str]:
    """A new file with a random name in `d`, created exclusively and never through a
    symlink (what tempfile.mkstemp does, without importing tempfile on every run)."""
    for _ in range(100):
        path = os.path.join(d, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                           | os.O_CLOEXEC, mode), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {d}")


def write(report: dict[str, Any], report_dir: str) -> Path:
    """Write atomically: temp file in the same dir, fsync, rename. Never overwrites."""
    d = ensure_dir(report_dir)
    name = report_name(int(report["vmid"]), str(report["phase"]), float(report["_started"]))
    body = {k: v for k, v in report.items() if not k.startswith("_")}
    text = to_yaml(body)
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


def list_reports(report_dir: str, vmid: int | None = None) -> list[Path]:
    d = Path(report_dir)
    try:
        files = [p for p in d.glob("*.yaml") if not p.name.startswith(".")]
    except OSError:
        return []
    if vmid is not None:
        files = [p for p in files if p.name.startswith(f"{vmid}-")]
    return sorted(files, key=lambda p: (p.name.split("-")[-1], p.name))


def load(path: Path) -> dict[str, Any]:
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


def prune(report_dir: str, vmid: int, keep: int, max_age_days: float) -> int:
    """Retention per container: at most `keep` reports, none older than `max_age_days`."""
    files = list_reports(report_dir, vmid)
    now = time.time()
    removed = 0
    for i, p in enumerate(reversed(files)):
        try:
            old = now - p.stat().st_mtime > max_age_days * 86400
            if i >= keep or old:
                p.unlink()
                removed += 1
        except OSError:
            continue
    return removed
