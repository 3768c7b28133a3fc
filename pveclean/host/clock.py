"""The host's clock and name, handed to the core's records (which read neither)."""

from __future__ import annotations

import os
import time

from pveclean import __version__
from pveclean.core.records import Deadline
from pveclean.core.report import Stamp


def start_deadline(seconds: float) -> Deadline:
    """A run's deadline, from now, on the host's monotonic clock."""
    return Deadline(seconds, time.monotonic)


def stamp(started: float, duration: float) -> Stamp:
    """This host, this version, when the run started (time.time()) and how long it took."""
    return Stamp(__version__, os.uname().nodename, started, round(duration, 3))
