"""Files written whole: a fresh temp file beside the target, renamed over it. Imports nothing
of pveclean's, so a hook phase's small records (the chain, the start record) cost no more
than this."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


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


def replace_whole(path: Path, text: str, prefix: str, mode: int = 0o600) -> None:
    """`path` replaced whole by `text`, atomically: a fresh temp file beside it (`prefix`...
    `.tmp`, never a name that follows a symlink) renamed over it, which replaces a symlink
    there, never its target; the temp file removed when that fails. A missing directory is
    made 0700."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = exclusive_temp(path.parent, prefix, ".tmp", mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
