"""The Debian source package in debian/: version and maintainer from one place, what comes
from Debian and what is vendored (debian/vendor, with its licences in debian/copyright), the
maintainer scripts (run against a scratch root), the man page and completion the build makes.
Building it in bookworm and trixie roots, lintian, and apt install, upgrade, remove, purge and
the bookworm -> trixie upgrade are `make deb-check` (packaging/deb_check.py)."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

DEBIAN = REPO / "debian"
VENDOR = DEBIAN / "vendor"
# distribution -> (directory prefix, what of it the package installs, its licence short name)
VENDORED = {
    "typer": ("typer-", "typer", "Expat"),
    "proxmoxer": ("proxmoxer-", "proxmoxer", "Expat"),
    "nvidia-ml-py": ("nvidia-ml-py-", "pynvml.py", "BSD-3-clause"),
}


def deb822(text: str) -> list[dict[str, str]]:
    """Paragraphs of a control-style file (continuation lines joined with newlines)."""
    paras = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields: dict[str, str] = {}
        key = ""
        for ln in block.splitlines():
            if ln.startswith("#"):
                continue
            if ln.startswith((" ", "\t")):
                fields[key] += "\n" + ln
            else:
                key, _, value = ln.partition(":")
                fields[key] = value.strip()
        paras.append(fields)
    return paras


def control() -> tuple[dict[str, str], dict[str, str]]:
    source, binary = deb822((DEBIAN / "control").read_text())
    return source, binary


def vendor_dir(dist: str) -> Path:
    found = sorted(VENDOR.glob(VENDORED[dist][0] + "[0-9]*"))
    assert len(found) == 1, f"one directory per vendored distribution: {found}"
    return found[0]


def test_version_and_maintainer_come_from_one_place() -> None:
    from pveclean import __version__

    source, _ = control()
    changelog = (DEBIAN / "changelog").read_text()
    assert changelog.startswith(f"pveclean ({__version__}) ")
    assert re.match(r"[^<>]+ <[^@\s]+@[^@\s]+\.[a-z]+>$", source["Maintainer"])
    trailer = re.search(r"^ -- (.+?)  ", changelog, re.M)
    assert trailer and trailer.group(1) == source["Maintainer"]
    assert source["Homepage"].startswith("https://")
    copyright_head = deb822((DEBIAN / "copyright").read_text())[0]
    assert copyright_head["Upstream-Contact"] == source["Maintainer"]
    assert copyright_head["Source"] == source["Homepage"]


def test_debian_supplies_what_it_ships_new_enough_and_only_the_rest_is_vendored() -> None:
    source, binary = control()
    depends = {d.strip().split()[0] for d in binary["Depends"].replace("\n", "").split(",")
               if d.strip()}
    for pkg in ("python3-yaml", "python3-requests", "python3-click",
                "python3-typing-extensions", "python3-shellingham"):
        assert pkg in depends
        assert pkg in source["Build-Depends"]  # the build runs the CLI for man page and tests
    assert not {"python3-typer", "python3-proxmoxer", "python3-pynvml"} & depends
    # pyproject's bound on click (typer < 0.20 uses APIs that click 8.5 changes) holds here too
    assert re.search(r'"click>=8\.0,<8\.5"', (REPO / "pyproject.toml").read_text())
    assert "python3-click (<< 8.5)" in binary["Depends"]
    assert binary["Architecture"] == "all"


def test_each_vendored_distribution_is_one_pinned_directory_the_package_installs() -> None:
    readme = (VENDOR / "README").read_text()
    install = (DEBIAN / "pveclean.install").read_text()
    assert {p.name.rsplit("-", 1)[0] for p in VENDOR.iterdir() if p.is_dir()} == set(VENDORED)
    for dist, (_, shipped, _) in VENDORED.items():
        d = vendor_dir(dist)
        version = d.name.rsplit("-", 1)[1]
        assert re.search(rf"^  {re.escape(d.name)}/\s+\S+-{re.escape(version)}\.tar\.gz\s+"
                         r"[0-9a-f]{64}$", readme, re.M), d.name
        assert (d / shipped).exists()
        line = f"debian/vendor/{VENDORED[dist][0]}*/{shipped} usr/lib/pveclean"
        assert line in install.splitlines(), line
        code = d / shipped / "__init__.py" if (d / shipped).is_dir() else d / shipped
        m = re.search(r'^__version__ = "([^"]+)"', code.read_text(), re.M)
        assert m is None or m.group(1) == version, d.name
        compiled = [p for p in d.rglob("*") if p.suffix in (".pyc", ".so", ".pyd")
                    or p.name == "__pycache__"]
        assert compiled == []
    typer_version = vendor_dir("typer").name.rsplit("-", 1)[1]
    assert re.search(r'"typer>=0\.12,<0\.20"', (REPO / "pyproject.toml").read_text())
    assert typer_version.startswith("0.") and 12 <= int(typer_version.split(".")[1]) < 20


def test_copyright_covers_every_vendored_file_with_its_own_licence() -> None:
    paras = deb822((DEBIAN / "copyright").read_text())
    assert paras[0]["Format"] == ("https://www.debian.org/doc/packaging-manuals/"
                                  "copyright-format/1.0/")
    files = [p for p in paras if "Files" in p]
    texts = {p["License"].split("\n")[0]: p["License"] for p in paras
             if "Files" not in p and "License" in p}
    for dist, (_, _, short) in VENDORED.items():
        d = vendor_dir(dist)
        rel = str(d.relative_to(REPO))
        covering = [p for p in files if any(fnmatch.fnmatch(f"{rel}/x", g)
                                            for g in p["Files"].split())]
        assert covering, rel
        para = covering[-1]  # the last matching paragraph wins (DEP-5)
        assert para["License"].split("\n")[0] == short and para["Copyright"], rel
        text = para["License"] if "\n" in para["License"] else texts[short]
        flat = " ".join(re.sub(r"^ \.$", "", text, flags=re.M).split())
        lic = [p for p in d.iterdir() if p.name.startswith("LICENSE")]
        if lic:  # the licence file's terms (not its title or copyright line) are the text
            body = [ln for ln in lic[0].read_text().splitlines()
                    if not ln.startswith(("The MIT License", "Copyright"))]
            assert " ".join(" ".join(body).split()) in flat, rel
            holder = re.search(r"^Copyright \(c\) (\d+) (.+)$", lic[0].read_text(), re.M)
            assert holder and f"{holder.group(1)} {holder.group(2)}" in para["Copyright"]
        else:  # nvidia-ml-py: its licence is pynvml.py's header
            assert "Neither the name of the NVIDIA Corporation" in flat
    assert "GNU AFFERO GENERAL PUBLIC LICENSE" in texts["AGPL-3+"]


def test_maintainer_scripts_leave_proxmox_alone() -> None:
    for name in ("prerm", "postrm"):
        path = DEBIAN / f"pveclean.{name}"
        text = path.read_text()
        code = "\n".join(re.sub(r'"[^"]*"', '""', ln) for ln in text.splitlines()
                         if not ln.lstrip().startswith("#"))  # no comments, no strings
        assert "/etc/pve" not in code, name
        assert not re.search(r"\b(pct|pvesh)\b|(^|[;&|(]\s*)(\S*/)?pveclean\b", code, re.M)
        assert text.startswith("#!/bin/sh\n") and "set -e" in text and "#DEBHELPER#" in text
        assert subprocess.run(["sh", "-n", str(path)], check=False).returncode == 0, name
    assert not (DEBIAN / "pveclean.postinst").exists()  # dh_python3, dh_installtmpfiles


def postrm(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "DPKG_ROOT": str(root)}
    return subprocess.run(["sh", str(DEBIAN / "pveclean.postrm"), *args], env=env,
                          capture_output=True, text=True, timeout=30, check=False)


def test_purge_removes_pveclean_drop_ins_and_state_and_says_what_stays(tmp_path: Path) -> None:
    from pveclean.core.config import Config
    from pveclean.proxmox import dropin

    systemd = tmp_path / "etc/systemd/system"
    cfg = Config(systemd_dir=str(systemd))
    ours = [dropin.dropin_path(cfg, 129, unit) for unit in dropin.UNITS]
    for path in ours:  # what `pveclean install --systemd` writes
        dropin.write_file(path, dropin.dropin_text(129, "/usr/sbin/pveclean", None))
    theirs = systemd / "pve-container@130.service.d/pveclean.conf"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("[Service]\nExecStartPre=/bin/true\n")
    (tmp_path / "var/log/pveclean").mkdir(parents=True)
    (tmp_path / "var/log/pveclean/129-x.yaml").write_text("{}\n")
    chain = tmp_path / "var/lib/pveclean/chain"
    chain.mkdir(parents=True)
    (chain / "129").write_text("local:snippets/other.sh\n")
    (tmp_path / "var/lib/pveclean/locks").mkdir()

    r = postrm(tmp_path, "remove")
    assert r.returncode == 0 and all(p.is_file() for p in ours)  # remove keeps configuration
    r = postrm(tmp_path, "purge")
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() or p.parent.exists() for p in ours)
    assert theirs.is_file()  # not pveclean's
    assert not (tmp_path / "var/log/pveclean").exists()
    assert (chain / "129").is_file() and not (tmp_path / "var/lib/pveclean/locks").exists()
    assert "kept /var/lib/pveclean/chain" in r.stderr and "hookscripts registered" in r.stderr
    shutil.rmtree(chain)
    assert postrm(tmp_path, "purge").returncode == 0
    assert not (tmp_path / "var/lib/pveclean").exists()


def staged_env() -> dict[str, str]:
    """The tree debian/rules runs the CLI from: the checkout and the vendored code."""
    path = [str(REPO), *(str(vendor_dir(d)) for d in VENDORED)]
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(path), "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1"}


def test_the_vendored_typer_serves_the_cli() -> None:
    code = ("import typer, proxmoxer, pynvml, pveclean.commands.cli as c; "
            "print(typer.__file__, proxmoxer.__file__, pynvml.__file__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=staged_env(), check=False, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    assert all(p.startswith(str(VENDOR)) for p in r.stdout.split())


def test_man_page_and_completion_as_the_build_makes_them(tmp_path: Path) -> None:
    man = tmp_path / "pveclean.8"
    subprocess.run([sys.executable, str(REPO / "packaging/manpage.py"), "--date", "2026-12-02",
                    str(man)], env=staged_env(), check=True, timeout=120)
    text = man.read_text()
    assert text.startswith(".TH PVECLEAN 8 ")
    for cmd in ("ct", "hook", "install", "config check"):
        assert f"\n.SS {cmd}\n" in text, cmd
    rules = (DEBIAN / "rules").read_text()
    assert "packaging/manpage.py --date" in rules
    m = re.search(r"python3 -c '(from typer._completion_shared .*?)'", rules.replace(
        "\\\n\t", ""), re.S)
    assert m, "debian/rules makes the bash completion"
    r = subprocess.run([sys.executable, "-c", m.group(1)], capture_output=True, text=True,
                       env=staged_env(), check=True)
    assert "_PVECLEAN_COMPLETE=complete_bash" in r.stdout
    assert re.search(r"^complete .*-F _pveclean_completion pveclean$", r.stdout, re.M)


def test_install_finds_the_packaged_hookscript() -> None:
    """pveclean install copies the template from where the package puts it."""
    from pveclean.proxmox import hookscript

    assert Path("/usr/share/pveclean/hookscripts/pveclean-hook") in hookscript.TEMPLATES
    assert "hookscripts/pveclean-hook usr/share/pveclean/hookscripts" in (
        DEBIAN / "pveclean.install").read_text().splitlines()


@pytest.mark.skipif(shutil.which("dpkg-parsechangelog") is None, reason="not a Debian system")
def test_dpkg_reads_the_changelog_and_control() -> None:
    from pveclean import __version__

    r = subprocess.run(["dpkg-parsechangelog", "-S", "Version"], cwd=REPO, capture_output=True,
                       text=True, check=True)
    assert r.stdout.strip() == __version__


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


def test_the_metrics_timer_ships_disabled_once_the_tree_has_it() -> None:
    """dh_installsystemd installs config/systemd/pveclean-metrics.{service,timer} when they
    exist (a missing one is skipped), neither enabled nor started."""
    for unit in ("service", "timer"):
        link = DEBIAN / f"pveclean.pveclean-metrics.{unit}"
        assert link.is_symlink()
        assert os.readlink(link) == f"../config/systemd/pveclean-metrics.{unit}"
    rules = (DEBIAN / "rules").read_text()
    assert re.search(r"^\tdh_installsystemd --no-enable --no-start --name=pveclean-metrics$",
                     rules, re.M)


@pytest.mark.skipif(shutil.which("systemd-tmpfiles") is None, reason="no systemd-tmpfiles")
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the directories are root's)")
def test_tmpfiles_make_the_report_and_state_directories_root_only(tmp_path: Path) -> None:
    """What dh_installtmpfiles' postinst creates: the config's report and state directories,
    0700 root (retention stays pveclean's own: no age field)."""
    from pveclean.core.config import Config

    conf = DEBIAN / "pveclean.tmpfiles"
    r = subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create", str(conf)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    for d in (Config().report_dir, Config().state_dir):
        st = (tmp_path / d.lstrip("/")).stat()
        assert st.st_mode & 0o777 == 0o700 and st.st_uid == 0, d
    lines = [ln.split() for ln in conf.read_text().splitlines() if ln and ln[0] != "#"]
    assert all(len(f) == 6 and f[5] == "-" for f in lines)
