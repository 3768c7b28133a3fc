"""`make deb`: the package's layout, metadata, maintainer scripts, copyright, man page and
completion, and an install into a scratch root with dpkg. The install with apt into bookworm and
trixie roots, upgrade, remove and purge are `make deb-check` (packaging/deb_check.py)."""

from __future__ import annotations

import fnmatch
import gzip
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="not a Debian system")

LIB = "/usr/lib/pveclean"
VENDORED = ("typer/__init__.py", "click/__init__.py", "proxmoxer/__init__.py", "pynvml.py",
            "typing_extensions.py", "shellingham/__init__.py")


def build(out: Path, *extra: str) -> Path:
    r = subprocess.run([sys.executable, str(REPO / "packaging/build_deb.py"), str(out), *extra],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield build(tmp_path_factory.mktemp("deb"))


@pytest.fixture(scope="module")
def tree(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    subprocess.run(["dpkg-deb", "-R", str(deb), str(root)], check=True)
    return root


def listing(deb: Path) -> dict[str, str]:
    """path -> 'mode owner' of every entry in the package."""
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                         check=True).stdout
    return {ln.split()[-1].lstrip(".").rstrip("/") or "/": f"{ln.split()[0]} {ln.split()[1]}"
            for ln in out.splitlines()}


def field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_one_architecture_independent_package_named_by_the_changelog(deb: Path) -> None:
    from pveclean import __version__

    changelog = (REPO / "packaging/debian/changelog").read_text()
    assert changelog.startswith(f"pveclean ({__version__}) ")
    assert deb.name == f"pveclean_{__version__}_all.deb"
    assert field(deb, "Architecture") == "all"
    assert field(deb, "Version") == __version__
    depends = field(deb, "Depends")
    for dep in ("python3 (>= 3.11)", "python3-yaml", "python3-requests"):
        assert dep in depends
    conffiles = subprocess.run(["dpkg-deb", "-I", str(deb), "conffiles"], capture_output=True,
                               text=True, check=True).stdout
    assert conffiles.strip() == "/etc/pveclean/pveclean.yaml"


def test_layout(deb: Path) -> None:
    files = listing(deb)
    for f in ("/usr/sbin/pveclean", "/etc/pveclean/pveclean.yaml",
              "/usr/share/pveclean/hookscripts/pveclean-hook", f"{LIB}/pveclean/commands/hook.py",
              f"{LIB}/pveclean/commands/cli.py", "/usr/share/man/man8/pveclean.8.gz",
              "/usr/share/bash-completion/completions/pveclean",
              "/usr/share/doc/pveclean/copyright", "/usr/share/doc/pveclean/changelog.gz",
              *(f"{LIB}/{v}" for v in VENDORED)):
        assert f in files, f
    assert files["/usr/sbin/pveclean"] == "-rwxr-xr-x root/root"
    assert files["/usr/share/pveclean/hookscripts/pveclean-hook"] == "-rwxr-xr-x root/root"
    assert files["/etc/pveclean/pveclean.yaml"] == "-rw-r--r-- root/root"
    # byte-compiled again for the new Python when Debian's default changes (VE 8 -> 9)
    assert files["/usr/share/python3/runtime.d/pveclean.rtupdate"] == "-rwxr-xr-x root/root"
    # nothing arch-dependent or left from the old /opt layout; Debian's own yaml and requests
    bad = [f for f in files if f.startswith("/opt") or re.search(r"\.(so|pyc|pyd)$|/bin/", f)
           or f.startswith((f"{LIB}/yaml", f"{LIB}/requests", f"{LIB}/urllib3",
                            f"{LIB}/example.py", f"{LIB}/tests"))]
    assert bad == []
    # the source tree's modules, all of them and only them
    shipped = {f[len(f"{LIB}/"):] for f in files if f.startswith(f"{LIB}/pveclean/")
               and f.endswith(".py")}
    assert shipped == {str(p.relative_to(REPO)) for p in (REPO / "pveclean").rglob("*.py")}


def test_install_finds_the_packaged_hookscript() -> None:
    """pveclean install copies the template from where the package puts it."""
    from pveclean.proxmox import hookscript

    assert Path("/usr/share/pveclean/hookscripts/pveclean-hook") in hookscript.TEMPLATES


def test_maintainer_scripts_leave_proxmox_alone(tree: Path) -> None:
    scripts = {p.name: p.read_text() for p in (tree / "DEBIAN").iterdir()
               if p.name in ("preinst", "postinst", "prerm", "postrm")}
    assert set(scripts) == {"postinst", "prerm", "postrm"}
    for name, text in scripts.items():
        code = "\n".join(re.sub(r'"[^"]*"', '""', ln) for ln in text.splitlines()
                         if not ln.lstrip().startswith("#"))  # no comments, no strings
        assert "/etc/pve" not in code, name
        assert not re.search(r"\b(pct|pvesh)\b|(^|[;&|(]\s*)(\S*/)?pveclean\b", code,
                             re.M), name
        assert text.startswith("#!/bin/sh\n") and "set -e" in text, name
        r = subprocess.run(["sh", "-n", str(tree / "DEBIAN" / name)], check=False)
        assert r.returncode == 0, name


def copyright_paragraphs(tree: Path) -> list[dict[str, str]]:
    text = (tree / "usr/share/doc/pveclean/copyright").read_text()
    paras = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields: dict[str, str] = {}
        key = ""
        for ln in block.splitlines():
            if ln.startswith((" ", "\t")):
                fields[key] += "\n" + ln
            else:
                key, _, value = ln.partition(":")
                fields[key] = value.strip()
        paras.append(fields)
    return paras


def test_copyright_covers_every_vendored_file(tree: Path) -> None:
    paras = copyright_paragraphs(tree)
    assert paras[0]["Format"].startswith("https://www.debian.org/doc/packaging-manuals/"
                                         "copyright-format/1.0")
    files = [p for p in paras if "Files" in p]
    licences = {p["License"].split("\n")[0] for p in paras if "Files" not in p and "License" in p}
    vendored = [f for f in files if f["Files"] != "*"]
    for p in files:  # a licence's text is in the paragraph or in a stand-alone one
        short = p["License"].split("\n")[0]
        assert "\n" in p["License"] or short in licences, p["Files"]
        assert p["Copyright"], p["Files"]
    lib = tree / LIB.lstrip("/")
    for path in (p for p in lib.rglob("*") if p.is_file()):
        rel = "/" + str(path.relative_to(tree))
        if rel.startswith(f"{LIB}/pveclean/"):
            continue
        assert any(fnmatch.fnmatch(rel.lstrip("/"), g) for p in vendored
                   for g in p["Files"].split()), rel
    assert "GNU AFFERO GENERAL PUBLIC LICENSE" in next(
        p["License"] for p in paras if p.get("License", "").startswith("AGPL-3+\n"))


def commands() -> dict[str, list[str]]:
    """Every command of the CLI -> the help texts of its arguments."""
    import click
    import typer.main

    from pveclean.commands.cli import app

    def walk(cmd: click.Command, ctx: click.Context,
             path: list[str]) -> Iterator[tuple[str, list[str]]]:
        if path:
            yield " ".join(path), [h for p in cmd.params if isinstance(p, click.Argument)
                                   and (h := getattr(p, "help", None))]
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx),
                                [*path, name])

    top = typer.main.get_command(app)
    return dict(walk(top, click.Context(top, info_name="pveclean"), []))


def test_man_page_documents_every_command(tree: Path) -> None:
    man = gzip.decompress((tree / "usr/share/man/man8/pveclean.8.gz").read_bytes()).decode()
    assert man.startswith(".TH PVECLEAN 8 ")
    cmds = commands()
    assert {"ct", "hook", "install", "config check"} <= set(cmds)
    for c in cmds:
        assert f"\n.SS {c.replace('-', chr(92) + '-')}\n" in man, c
    # arguments keep their help (click 8.5 drops the one typer < 0.20 sets: pyproject pins it)
    helps = [h for hs in cmds.values() for h in hs]
    assert helps, "no argument of the CLI has a help text"
    flat = " ".join(man.replace("\\-", "-").split())
    for h in helps:
        assert " ".join(h.split()) in flat, h
    assert "\\-\\-dry\\-run" in man and "\\-\\-all" in man
    if shutil.which("man") and shutil.which("groff"):
        r = subprocess.run(["man", "--warnings", "-l", "-"], input=man, capture_output=True,
                           text=True, env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin"},
                           check=False)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert "pveclean ct [OPTIONS] VMID" in r.stdout


def test_bash_completion_calls_back_into_pveclean(tree: Path) -> None:
    text = (tree / "usr/share/bash-completion/completions/pveclean").read_text()
    assert "_PVECLEAN_COMPLETE=complete_bash" in text
    assert re.search(r"^complete .*-F _pveclean_completion pveclean$", text, re.M)


def test_build_is_reproducible(deb: Path, tmp_path: Path) -> None:
    assert build(tmp_path).read_bytes() == deb.read_bytes()


def test_install_into_scratch_root(deb: Path, tmp_path: Path) -> None:
    if shutil.which("dpkg") is None:
        pytest.skip("no dpkg")
    root = tmp_path / "root"
    (root / "var/lib/dpkg/info").mkdir(parents=True)
    (root / "var/lib/dpkg/updates").mkdir()
    (root / "var/lib/dpkg/status").write_text("")
    r = subprocess.run(["dpkg", f"--root={root}", "--force-depends", "--force-not-root",
                        "--force-script-chrootless", "--log=/dev/null", "-i", str(deb)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert (root / "var/log/pveclean").stat().st_mode & 0o777 == 0o700  # postinst, in root
    assert not (root / "etc/pve").exists()
    exe = root / "usr/sbin/pveclean"
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-I", str(exe), "--version"], capture_output=True,
                         text=True, check=True, env=env).stdout
    assert out.strip().startswith("pveclean ")
    cfg = root / "etc/pveclean/pveclean.yaml"
    r = subprocess.run([sys.executable, "-I", str(exe), "config", "check", str(cfg)],
                       capture_output=True, text=True, check=False, env=env)
    assert r.returncode == 0, r.stderr
    # the modules come from the package's private directory (python -v names each source)
    # (--help goes through typer; --version alone no longer imports it, issue 16)
    r = subprocess.run([sys.executable, "-I", "-B", "-v", str(exe), "--help"],
                       capture_output=True, text=True, check=False, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    for mod in ("pveclean/commands/cli.py", "typer/__init__.py", "click/__init__.py"):
        sources = re.findall(rf"(/[^\s']*/{mod})\b", r.stderr)
        assert sources and all(p.startswith(f"{root}/usr/lib/pveclean/") for p in sources), mod
    # the hook path must not need typer: it runs from the package's lib only
    r = subprocess.run([sys.executable, "-I", "-X", "importtime", str(exe), "hook", "abc",
                        "pre-start"], capture_output=True, text=True, check=False, env=env)
    assert r.returncode == 2 and "invalid VMID" in r.stderr
    assert "typer" not in r.stderr and "proxmoxer" not in r.stderr


def test_wheel_install_ships_the_hookscript(tmp_path: Path) -> None:
    """A non-editable install (the README's way onto a host) carries the hookscript where
    `pveclean install` looks for it: <prefix>/share/pveclean/hookscripts/."""
    from pveclean.proxmox import hookscript

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    r = subprocess.run([str(venv / "bin/pip"), "install", "-q", "--no-deps", str(REPO)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    prefix = subprocess.run([str(venv / "bin/python"), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    shipped = Path(prefix) / "share/pveclean/hookscripts/pveclean-hook"
    assert shipped.read_text() == (REPO / "hookscripts/pveclean-hook").read_text()
    assert shipped.stat().st_mode & 0o111
    rel = [t.relative_to(sys.prefix) for t in hookscript.TEMPLATES if t.is_relative_to(sys.prefix)]
    assert Path("share/pveclean/hookscripts/pveclean-hook") in rel
