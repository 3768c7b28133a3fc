"""`pveclean gpus`: every GPU of this host and who uses it, attributed to its owner (what is
read and how: commands/gpulook.py).

This module is what the command's own process imports: it hands the look to a worker (the run's
worker forked at start-up when there is one, host/prelude.py, which has imported the scan's
modules meanwhile) and imports the renderer while the worker reads; the worker imports the
look itself (gpulook). So the host's readers start before the command has imported what it
shows, not after.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from pveclean.errors import ExitCode, PvecleanError
from pveclean.host import worker
from pveclean.host.nvml import Nvml
from pveclean.host.prelude import early_worker
from pveclean.host.worker import RemoteError, Worker, WorkerError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pveclean.core.config import Config
    from pveclean.core.gpumap import GpuMap
    from pveclean.host.nvml import NvmlSettings

# ---- the command ---------------------------------------------------------------------------
READERS_SHARE = 0.8  # of the deadline: the host's forked readers are given up on by then


def screen_control(stream: TextIO, env: Mapping[str, str]) -> bool:
    """Whether `stream` takes cursor and clear codes: a terminal, and not TERM=dumb (Emacs'
    shell, a serial console) or no TERM at all (cron, a unit)."""
    return stream.isatty() and env.get("TERM", "dumb") not in ("", "dumb")


def show(cfg: Config, as_json: bool = False, watch: float | None = None, count: int = 0,
         pci_root: Path | None = None) -> int:
    """`pveclean gpus`: read the host in a worker bounded by deadline_seconds (the run's,
    forked at start-up, else one of its own), print, and with `watch` do it again every
    `watch` seconds (`count` times; 0: until Ctrl-C). Exit code 0, or PvecleanError (exit 3)
    when the host could not be read in time."""
    tty = screen_control(sys.stdout, os.environ)
    shown = 0
    limit = cfg.deadline_seconds
    settings = Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)
    with Worker(**settings) as own:
        wk = early_worker() or own
        try:
            while True:
                # its forked readers are given up on first, so that the rest is still shown
                start = time.monotonic()
                wk.send(w_collect, cfg, pci_root, start + limit * READERS_SHARE, settings,
                        timeout=limit, what="gpus")
                # imported while the worker reads the host (`metrics`, `status` need neither)
                from pveclean.commands import xids
                from pveclean.commands.gpuview import render_gpus

                gmap: GpuMap = wk.receive(start + limit - time.monotonic(), "gpus")
                xtext, xdoc = xids.gpus_section(cfg, gmap)  # issue 41: the last Xids per GPU
                text = (json.dumps({**gmap.as_dict(), **({"xids": xdoc} if xdoc else {})},
                                   indent=2, default=str) if as_json else render_gpus(gmap) + xtext)
                if watch and tty and not as_json:
                    text = "\x1b[H\x1b[2J" + text  # redraw in place
                print(text, flush=True)
                shown += 1
                if not watch or (count and shown >= count):
                    break
                if not tty or as_json:
                    print(flush=True)
                time.sleep(watch)
        except KeyboardInterrupt:
            pass
        except WorkerError as exc:
            raise PvecleanError(f"gpus: reading the host did not finish within {limit:.0f} s "
                                f"({exc.why}); nothing shown",
                                ExitCode.ACCESS) from None
        except RemoteError as exc:
            raise PvecleanError(f"gpus: {exc}", ExitCode.ACCESS) from None
    return ExitCode.OK


def look_once(cfg: Config, pci_root: Path, limit: float, what: str) -> GpuMap:
    """collect() once in a worker of its own, bounded by `limit` seconds (its forked readers
    by READERS_SHARE of it); PvecleanError (exit 3) when it did not finish: for the commands
    that need the map but do not print it (status, the VM hook)."""
    with Worker(**Nvml.settings(cfg.nvml_library, cfg.deadline_seconds)) as wk:
        try:
            data: GpuMap = wk.call(w_collect, cfg, pci_root,
                                   time.monotonic() + limit * READERS_SHARE,
                                   timeout=limit, what=what)
        except (WorkerError, RemoteError) as exc:
            raise PvecleanError(str(exc), ExitCode.ACCESS) from None
    return data


def w_collect(cfg: Config, pci_root: Path | None, end: float | None = None,
              settings: NvmlSettings | None = None) -> GpuMap:
    """gpulook.look() in a worker, which imports it here. `settings`: NVML's, for a worker
    forked before the config was read (the run's, see show())."""
    from pveclean.commands import gpulook

    if settings is not None:
        worker.state().update(settings)
    return gpulook.look(cfg, pci_root, end)
