"""The man pages: pveclean(8) with EXIT STATUS, EXAMPLES, FILES, ENVIRONMENT and SEE ALSO and
without typer's --install-completion; pveclean.yaml(5) with every key of the config's schema;
both rendered by man(1) without a warning."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from pveclean.core.config import Config
from pveclean.errors import EXIT_MEANING, ExitCode
from tests.helpers import REPO


def page(tmp: Path, which: str) -> Path:
    out = tmp / ("pveclean.8" if which == "8" else "pveclean.yaml.5")
    subprocess.run([sys.executable, str(REPO / "packaging/manpage.py"), "--date", "2026-01-01",
                    "--page", which, str(out)], check=True, timeout=60)
    return out


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"(?m)^\.SH (.+)$", text)
    return {parts[i].strip('"'): parts[i + 1] for i in range(1, len(parts), 2)}


def test_pveclean_8_has_the_sections_admins_look_for(tmp_path: Path) -> None:
    text = page(tmp_path, "8").read_text()
    got = sections(text)
    for name in ("EXIT STATUS", "EXAMPLES", "FILES", "ENVIRONMENT", "SEE ALSO"):
        assert got.get(name, "").strip(), name
    assert set(EXIT_MEANING) == set(ExitCode)
    for code in ExitCode:
        assert f".B {int(code)}\n" in got["EXIT STATUS"], code
    assert ".BR pveclean.yaml (5)" in got["SEE ALSO"] and "PVECLEAN_CONFIG" in got["ENVIRONMENT"]
    assert "install\\-completion" not in text and "show\\-completion" not in text
    unit = text[text.index(".SS unit"):text.index(".SS install")]
    assert "75" in unit and "Exit 1" not in unit


def test_pveclean_yaml_5_documents_every_key(tmp_path: Path) -> None:
    text = page(tmp_path, "yaml.5").read_text()
    keys = [f.name for f in fields(Config) if f.name != "source"]
    documented = re.findall(r"(?m)^\.B (\S+)$", sections(text)["KEYS"])
    assert [k.replace("\\-", "-") for k in documented] == keys
    assert "default: 10.0." in text and "report_nothing_to_do" in text


@pytest.mark.skipif(shutil.which("man") is None, reason="man(1) is not installed")
@pytest.mark.parametrize("which", ["8", "yaml.5"])
def test_man_renders_without_warnings(tmp_path: Path, which: str) -> None:
    r = subprocess.run(["man", "--warnings", "-l", str(page(tmp_path, which))],
                       capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8",
                            "MANPAGER": "cat", "PAGER": "cat"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "pveclean" in r.stdout
