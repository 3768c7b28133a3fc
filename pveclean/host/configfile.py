"""Finding and loading the config file: the search order, and the permission and trust checks
root makes before it believes a file that steers what it kills."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from pveclean.core.config import HOOK_DIRS, Config, parse
from pveclean.errors import ConfigError

DEFAULT_PATH = Path("/etc/pveclean/pveclean.yaml")
ENV_VAR = "PVECLEAN_CONFIG"


def locate(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """--config PATH, else $PVECLEAN_CONFIG, else /etc/pveclean/pveclean.yaml if present."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return DEFAULT_PATH if DEFAULT_PATH.exists() else None


def check_permissions(path: Path, st: os.stat_result) -> None:
    """Like sshd's StrictModes: as root, a file others can change is not trusted."""
    if os.geteuid() != 0:
        return
    if st.st_uid != 0:
        raise ConfigError(f"{path}: not owned by root (uid {st.st_uid}); refusing to use it")
    if st.st_mode & 0o022:
        raise ConfigError(
            f"{path}: writable by group or others (mode {st.st_mode & 0o777:o}); "
            f"run 'chmod go-w {path}'"
        )


def untrusted(path: str | os.PathLike[str], what: str, in_own_dir: bool = True
              ) -> str | None:
    """Why root must not trust `path` (None: it may). The file and every directory above
    it, as written and as resolved, must be root's and not writable by group or others; a
    directory above the file's own may be a sticky one like /tmp (others cannot replace
    root's entries in it). A file someone else could change would run as root in every
    hook (pct_command, nvml_library) or steer what it kills (the config). `in_own_dir` False:
    `path` is itself the directory a file would be in (a missing nvml_library's)."""
    p = os.path.abspath(path)
    for candidate in dict.fromkeys([p, os.path.realpath(p)]):
        try:
            st = os.stat(candidate)
        except OSError as exc:
            return f"{what} {candidate}: {exc.strerror}"
        if st.st_uid != 0:
            return f"{what} {candidate} is not owned by root (uid {st.st_uid})"
        if st.st_mode & 0o022:
            return (f"{what} {candidate} is writable by group or others (mode "
                    f"{st.st_mode & 0o777:o}); run 'chmod go-w {candidate}'")
        d, own_dir = os.path.dirname(candidate), in_own_dir
        while True:
            try:
                dst = os.lstat(d)
            except OSError as exc:
                return f"{what}: directory {d}: {exc.strerror}"
            if os.path.islink(d):
                pass  # only its directory can replace it (checked next); its target is
                # checked as part of the resolved path
            elif dst.st_uid != 0:
                return f"{what} {candidate}: directory {d} is not owned by root"
            sticky = bool(dst.st_mode & 0o1000)
            if dst.st_mode & 0o022 and (own_dir or not sticky) and not os.path.islink(d):
                return (f"{what} {candidate}: directory {d} is writable by group or others "
                        f"(mode {dst.st_mode & 0o7777:o})")
            if d == "/":
                break
            d, own_dir = os.path.dirname(d), False
    return None


def _executable(command: str) -> str | None:
    """The file `command` (a pct_command) runs, looked up as start_pct looks it up (exec
    searches the PATH of pct's environment): shutil.which, without importing shutil (and
    its compression modules) on every run."""

    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if not argv:
        return None
    if "/" in argv[0]:
        return argv[0]
    for d in HOOK_DIRS:
        path = os.path.join(d, argv[0])
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def check_trusted(cfg: Config, path: Path | None = None) -> None:
    """As root, whatever the file says: the config and the programs it makes root run
    must be root's. Raises ConfigError with the reason."""
    if os.geteuid() != 0:
        return
    checks: list[tuple[str | None, str]] = [
        (str(path) if path else None, "config file"),
        (_executable(cfg.pct_command), "pct_command"),
        (cfg.nvml_library if cfg.nvml_library and "/" in cfg.nvml_library else None,
         "nvml_library"),
    ]
    for target, what in checks:
        orig = target
        if target is not None and what == "nvml_library" and not os.path.exists(target):
            target = _missing_library(target)  # who could put one there before it loads?
        if target is None or (what != "config file" and not os.path.exists(target)):
            continue  # a missing pct fails later, with its own message
        # a missing library's directory stands for the file: the one above may be sticky
        why = untrusted(target, what, in_own_dir=target == orig)
        if why:
            raise ConfigError(f"{why}; refusing to use it")


def _missing_library(path: str) -> str:
    """An nvml_library path that does not exist (yet): the nearest directory above it that
    does is checked as the library itself would be (root's, writable by root only, sticky
    or not), since a file put there after the check would be loaded by root."""
    d = os.path.dirname(path)
    while d != "/" and not os.path.isdir(d):
        d = os.path.dirname(d)
    return d


def load(explicit: str | os.PathLike[str] | None = None) -> Config:
    path = locate(explicit)
    if path is None:
        return Config()
    try:
        with open(path, encoding="utf-8") as fh:
            st = os.fstat(fh.fileno())
            text = fh.read(1 << 20)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    check_permissions(path, st)  # always: `strict_permissions: false` cannot vouch for itself
    cfg = parse(text, str(path))
    check_trusted(cfg, path)
    return cfg
