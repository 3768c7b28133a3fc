"""proxmox/snippets.py: one resolver of snippet volume ids for install, the chain and status."""

from __future__ import annotations

from pathlib import Path

import pytest

from pveclean.proxmox.snippets import (
    parse_volid,
    path_in_storage_cfg,
    snippets_dir,
    storage_options,
)

STORAGE_CFG = """\
dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup,snippets

# a comment between sections
dir: hooks
\tpath /srv/pve
\tcontent snippets
\tcontent-dirs iso=isos,snippets=/hooks/

nfs: shared
\texport /export
\tserver 10.0.0.1
"""


@pytest.mark.parametrize(("volid", "parsed"), [
    ("local:snippets/pveclean-hook", ("local", "pveclean-hook")),
    ("local:snippets/", None),
    ("local:iso/x.iso", None),
    ("local:snippets/a/b", None),
    (":snippets/x", None),
    ("no-colon", None),
])
def test_parse_volid(volid: str, parsed: tuple[str, str] | None) -> None:
    assert parse_volid(volid) == parsed


def test_storage_options_reads_one_section_only() -> None:
    assert storage_options(STORAGE_CFG, "hooks") == {
        "path": "/srv/pve", "content": "snippets", "content-dirs": "iso=isos,snippets=/hooks/"}
    assert storage_options(STORAGE_CFG, "missing") is None


@pytest.mark.parametrize(("volid", "path"), [
    ("local:snippets/h", Path("/var/lib/vz/snippets/h")),
    ("hooks:snippets/h", Path("/srv/pve/hooks/h")),  # content-dirs, slashes stripped
    ("shared:snippets/h", None),  # no path: not a directory storage
    ("missing:snippets/h", None),
    ("local:iso/h", None),
])
def test_path_in_storage_cfg(volid: str, path: Path | None) -> None:
    assert path_in_storage_cfg(STORAGE_CFG, volid) == path


def test_snippets_dir_without_a_path_is_none() -> None:
    assert snippets_dir(None, ()) is None
    assert snippets_dir("/x", (("snippets", "s"),)) == Path("/x/s")
