"""pveconf against the shared corpus of real-world GPU container configs and their careful reading
(../shared/corpus/lxc-gpu-configs/expected.tsv): NVIDIA access, the NVIDIA nodes, the GPU indices.

Rows where pveconf reads a config differently are marked xfail(strict=True) with what differs:
the disagreement stays visible, and the test fails once pveconf's reading is mended.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pveclean.proxmox import pveconf

REPO_ROOT = Path(__file__).resolve().parents[2]


def _corpus_dir() -> Path | None:
    """The corpus beside the checkout (CI clones shared/ next to the repository); for a git
    worktree, beside the main checkout too."""
    roots = [REPO_ROOT.parent, REPO_ROOT]
    git = REPO_ROOT / ".git"
    if git.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        gitdir = Path(git.read_text().partition("gitdir:")[2].strip())
        if gitdir.parent.name == "worktrees":
            roots.append(gitdir.parent.parent.parent.parent)
    for root in roots:
        d = root / "shared" / "corpus" / "lxc-gpu-configs"
        if (d / "expected.tsv").is_file():
            return d
    return None


CORPUS = _corpus_dir()
MISSING = ("corpus not found: clone the shared data beside the repository "
           f"({REPO_ROOT.parent / 'shared/corpus/lxc-gpu-configs'})")

# What pveconf reads differently from expected.tsv (main reading and alt alike): none now;
# an entry here marks its row xfail(strict=True), so a disagreement stays visible.
DISAGREES: dict[str, str] = {}


@dataclass(frozen=True)
class Reading:
    nvidia: str  # yes / no
    nodes: frozenset[str] | str  # '*' for every node the host has
    gpus: frozenset[int] | str

    @staticmethod
    def of(nvidia: str, nodes: str, gpus: str) -> Reading:
        def many(v: str) -> frozenset[str] | str:
            return v if v == "*" else frozenset() if v == "-" else frozenset(v.split(","))

        g = many(gpus)
        return Reading(nvidia, many(nodes), g if isinstance(g, str) else frozenset(map(int, g)))


@dataclass(frozen=True)
class Row:
    file: str
    expected: Reading
    alt: Reading | None
    notes: str


def _rows() -> list[Row]:
    if CORPUS is None:
        return []
    rows = []
    for line in (CORPUS / "expected.tsv").read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#") or line.startswith("file\t"):
            continue
        file, nvidia, nodes, gpus, _other, alt, notes = line.split("\t")
        main = Reading.of(nvidia, nodes, gpus)
        other = None
        if alt != "-":
            fields = dict(item.split("=", 1) for item in alt.split(";"))
            other = Reading.of(fields.get("nvidia", nvidia), fields.get("nodes", nodes),
                               fields.get("gpus", gpus))
        rows.append(Row(file, main, other, notes))
    return rows


ROWS = _rows()


def pveclean_reading(cfg: pveconf.CtConfig) -> Reading:
    """What pveconf says: access from its GPU lines or an allow-all rule (no dynamic majors
    known: the corpus's hosts differ), nodes as the container's paths (relative to /dev),
    GPU indices as the minors of the host's /dev/nvidiaN the config binds."""
    majors: frozenset[int] = frozenset()
    grant = cfg.gpu(majors)
    access = grant.any or pveconf.may_use_gpus(cfg, majors)
    nodes: frozenset[str] | str = "*" if grant.nodes is None else frozenset(
        p.removeprefix("/dev/") if p.startswith("/dev/") else p for p in grant.nodes)
    gpus: frozenset[int] | str = "*" if grant.minors is None else grant.minors
    return Reading("yes" if access else "no", nodes, gpus)


def _params() -> list[object]:
    if CORPUS is None:
        return [pytest.param(None, marks=pytest.mark.skip(reason=MISSING), id="no-corpus")]
    out: list[object] = []
    for row in ROWS:
        marks = []
        if row.file in DISAGREES:
            marks.append(pytest.mark.xfail(strict=True, reason=DISAGREES[row.file]))
        out.append(pytest.param(row, marks=marks, id=row.file.removesuffix(".conf")))
    return out


@pytest.mark.parametrize("row", _params())
def test_pveconf_reads_the_config_as_the_corpus_does(row: Row) -> None:
    assert CORPUS is not None
    text = (CORPUS / "configs" / row.file).read_text(encoding="utf-8")
    got = pveclean_reading(pveconf.parse_config(text, 100))
    accepted = [r for r in (row.expected, row.alt) if r is not None]
    assert got in accepted, f"{row.file}: pveconf reads {got}, expected {accepted} ({row.notes})"


def test_every_config_has_a_row_and_every_disagreement_a_config() -> None:
    if CORPUS is None:
        pytest.skip(MISSING)
    files = sorted(p.name for p in (CORPUS / "configs").glob("*.conf"))
    assert files == sorted(r.file for r in ROWS)
    assert len(files) >= 41
    assert set(DISAGREES) <= set(files)


def test_the_nvidia_rows_are_the_ones_with_nodes() -> None:
    """The table's own consistency, which the comparison above relies on."""
    if CORPUS is None:
        pytest.skip(MISSING)
    for row in ROWS:
        has_nodes = row.expected.nodes == "*" or bool(row.expected.nodes)
        assert (row.expected.nvidia == "yes") is has_nodes, row.file
