"""`make deb`: the package's contents, and an install into a scratch root with dpkg."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="not a Debian system")


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("deb")
    r = subprocess.run([sys.executable, str(REPO / "packaging/build_deb.py"), str(out)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    yield Path(r.stdout.strip().splitlines()[-1])


def test_contents(deb: Path) -> None:
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    files = {ln.split()[-1].lstrip(".") for ln in listing.splitlines()}
    for f in ("/usr/sbin/pveclean", "/etc/pveclean/pveclean.yaml",
              "/usr/share/pveclean/hookscripts/pveclean-hook",
              "/opt/pveclean/lib/pveclean/hook.py", "/opt/pveclean/lib/typer/__init__.py",
              "/opt/pveclean/lib/proxmoxer/__init__.py", "/opt/pveclean/lib/yaml/__init__.py",
              "/opt/pveclean/lib/pynvml.py"):
        assert f in files, f
    modes = {ln.split()[-1].lstrip("."): ln.split()[0] for ln in listing.splitlines()}
    assert modes["/usr/sbin/pveclean"] == "-rwxr-xr-x"
    assert modes["/usr/share/pveclean/hookscripts/pveclean-hook"] == "-rwxr-xr-x"
    assert "root/root" in next(ln for ln in listing.splitlines() if "usr/sbin/pveclean" in ln)
    conffiles = subprocess.run(["dpkg-deb", "-I", str(deb), "conffiles"], capture_output=True,
                               text=True, check=True).stdout
    assert conffiles.strip() == "/etc/pveclean/pveclean.yaml"
    assert not any("/test" in f and f.endswith(".py") and "pveclean/" in f for f in files
                   if f.startswith("/opt/pveclean/lib/pveclean/"))


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
    exe = root / "usr/sbin/pveclean"
    out = subprocess.run([sys.executable, "-I", str(exe), "--version"], capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert out.strip().startswith("pveclean ")
    cfg = root / "etc/pveclean/pveclean.yaml"
    r = subprocess.run([sys.executable, "-I", str(exe), "config", "check", str(cfg)],
                       capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    # the hook path must not need typer: it runs from the package's lib only
    r = subprocess.run([sys.executable, "-I", "-X", "importtime", str(exe), "hook", "abc",
                        "pre-start"], capture_output=True, text=True, check=False,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "invalid VMID" in r.stdout
    assert "typer" not in r.stderr and "proxmoxer" not in r.stderr
