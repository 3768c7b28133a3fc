"""Each command's path imports only what it uses (issue 42): a dry run and every hook phase
with nothing to clean never import `gpus`' map and renderer, the API client (proxmoxer,
requests), the metrics exposition or the install commands; a hook never imports typer or
click, a dry run not the report writer (reportfiles, notify); `--version` neither the config's
YAML nor the cleanup. A module moved back to the top of a shared one fails here, named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.importpaths import PATHS, USES, VMID, run_path, stopped_ct

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pveclean's commands need root")


@pytest.mark.parametrize("name", list(PATHS))
def test_a_path_imports_none_of_its_heavy_modules(tmp_path: Path, name: str) -> None:
    argv, heavy = PATHS[name]
    r = run_path(argv, stopped_ct(tmp_path))
    assert r.code == 0, r
    assert sorted(m for m in heavy if m in r.modules) == [], r.stdout
    if name == "ct --dry-run":  # the run went all the way: found the container, judged it
        assert f"CT {VMID}: dry run" in r.stdout and "would stop nothing" in r.stdout, r
    # and the heavy modules are ones a path can import at all: it imports its own work's
    assert sorted(m for m in USES.get(name, ()) if m not in r.modules) == [], sorted(r.modules)
    if name.startswith("metrics"):  # the run went all the way: the textfile is written
        text = (tmp_path / "textfile" / "pveclean_gpus.prom").read_text()
        assert "pveclean_gpus_up 1" in text, text


def test_the_pins_name_modules_that_exist() -> None:
    """A pin on a misspelt or removed module would pass for ever."""
    import importlib.util

    for _, heavy in PATHS.values():
        for mod in heavy:
            assert importlib.util.find_spec(mod) is not None, mod
