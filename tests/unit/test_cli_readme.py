"""The README is for admins: at most 250 lines, its command table complete against the CLI
(every command, every visible option, no option the CLI lacks), its exit codes the CLI's."""

from __future__ import annotations

import re

import click
import typer.main

from pveclean.commands.cli import app
from pveclean.errors import EXIT_MEANING
from tests.helpers import REPO

README = (REPO / "README.md").read_text()
GLOBAL = {"--help", "-h", "--config", "-c"}  # said once above the table, for every command


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


def commands() -> dict[str, click.Command]:
    """Every command of the CLI by its path (`config check`), groups left out."""
    out: dict[str, click.Command] = {}

    def walk(cmd: click.Command, path: list[str]) -> None:
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
        else:
            out[" ".join(path)] = cmd

    walk(typer.main.get_command(app), [])
    return out


def rows() -> dict[str, str]:
    """The command table's first column per command path (two rows for `reports`)."""
    got: dict[str, str] = {}
    for line in section("Commands").splitlines():
        m = re.match(r"\| `pveclean ([a-z ]+?)(?: [A-Z\[]|`)(.*?)\|", line)
        if m:
            path = m.group(1).removesuffix(" show")  # `reports show FILE` is reports' too
            got[path] = got.get(path, "") + " " + re.split(r"(?<!\\)\|", line)[1]
    return got


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 250


def test_the_command_table_is_complete_against_the_cli() -> None:
    table = rows()
    cli = commands()
    assert set(table) == set(cli), (set(table) ^ set(cli))
    for path, cmd in cli.items():
        visible = {o for p in cmd.params if isinstance(p, click.Option) and not p.hidden
                   for o in p.opts if o.startswith("--")} - GLOBAL
        named = set(re.findall(r"--[a-z][a-z-]*", table[path]))
        every = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        assert visible <= named, (path, visible - named)
        assert named <= every, (path, named - every)


def test_the_exit_codes_are_the_clis() -> None:
    listed = {int(c) for line in section("Commands").splitlines()
              if (m := re.match(r"\| ([\d /]+) \|", line)) for c in m.group(1).split("/")}
    assert listed == {int(c) for c in EXIT_MEANING}


def test_developer_material_lives_in_docs() -> None:
    for gone in ("## Benchmarks", "## Soak", "## The test lab", "## Real-GPU check"):
        assert gone not in README
        assert gone in (REPO / "docs/development.md").read_text()
    assert README.index("## Install") < README.index("make demo")  # the lab after installing
