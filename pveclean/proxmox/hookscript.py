"""The guest hookscript pveclean registers: its template, and the paths stamped into it."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from pveclean.core.config import Config
from pveclean.errors import ExitCode, PvecleanError
from pveclean.host.configfile import DEFAULT_PATH, untrusted

TYPE_CHECKING = False



HOOK_NAME = "pveclean-hook"
VM_HOOK_NAME = "pveclean-vm-hook"  # the same script: by this name it runs `pveclean vmhook`
TEMPLATES = (  # a checkout or editable install; a wheel's data files; the .deb's copy
    Path(__file__).resolve().parents[2] / "hookscripts" / HOOK_NAME,
    Path(sys.prefix) / "share/pveclean/hookscripts" / HOOK_NAME,
    Path("/usr/share/pveclean/hookscripts") / HOOK_NAME,
)
MARKER = "# pveclean guest hookscript"
_UNSAFE = set('"$`\\\n')


def stamp(text: str, bin_path: str, config_file: str | None) -> str:
    """The hookscript with the pveclean command (and a non-default config) filled in."""
    for value in (bin_path, config_file or ""):
        if _UNSAFE & set(value):
            raise PvecleanError(f"path {value!r} cannot go into a shell script", ExitCode.USAGE)
    text = text.replace('PVECLEAN_BIN=""', f'PVECLEAN_BIN="{bin_path}"', 1)
    if config_file:
        text = text.replace('PVECLEAN_CONFIG_FILE=""', f'PVECLEAN_CONFIG_FILE="{config_file}"', 1)
    return text


def pveclean_bin() -> str:
    """Absolute path of the running pveclean console script."""
    argv0 = Path(sys.argv[0])
    candidates = [argv0] if argv0.name == "pveclean" else []
    candidates.append(Path(sys.executable).parent / "pveclean")
    found = shutil.which("pveclean")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c.absolute())
    raise PvecleanError("cannot find the pveclean command to put into the hookscript",
                        ExitCode.ACCESS)


def config_file(cfg: Config) -> str | None:
    """The config file to stamp: None for the built-in defaults and the default path."""
    if cfg.source == Config().source:
        return None
    path = Path(cfg.source).absolute()
    return None if path == DEFAULT_PATH else str(path)


def trusted(bin_path: str, conf: str | None) -> None:
    """As root, refuse to stamp into a hookscript (run as root on every start and stop) a
    program, its interpreter or a config that someone else could change."""
    if os.geteuid() != 0:
        return
    targets = [(bin_path, "pveclean command"), (conf, "config file")]
    try:
        with open(bin_path, "rb") as fh:
            first = fh.readline(256)
        if first.startswith(b"#!"):
            targets.append((first[2:].split()[0].decode(), "pveclean's interpreter"))
    except (OSError, IndexError, UnicodeDecodeError):
        pass
    for target, what in targets:
        why = untrusted(target, what) if target else None
        if why:
            raise PvecleanError(f"{why}; not stamping it into the hookscript", ExitCode.USAGE)


def hook_text(cfg: Config) -> str:
    for template in TEMPLATES:
        if template.is_file():
            try:
                text = template.read_text(encoding="utf-8")
            except OSError as exc:
                raise PvecleanError(f"cannot read {template}: {exc.strerror}",
                                    ExitCode.ACCESS) from None
            bin_path, conf = pveclean_bin(), config_file(cfg)
            trusted(bin_path, conf)
            return stamp(text, bin_path, conf)
    looked = ", ".join(map(str, TEMPLATES))
    raise PvecleanError(f"hookscript template not found (looked at {looked})", ExitCode.ACCESS)


def is_pveclean(volid: str | None) -> bool:
    return bool(volid) and str(volid).rsplit("/", 1)[-1] in (HOOK_NAME, VM_HOOK_NAME)
