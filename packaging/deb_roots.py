"""The debootstrapped roots of `make deb-check`: one minbase root per release, made once with
debootstrap and cached as a tarball in $PVECLEAN_DEB_CACHE (default
/var/cache/pveclean-deb-check, outside the clone: CI runs in a fresh one) for up to 30 days,
with the .debs apt fetched (apt still checks them against the archive's lists); each check
gets a fresh chroot from it, /proc mounted, removed afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("PVECLEAN_DEB_CACHE", "/var/cache/pveclean-deb-check"))
MIRROR = os.environ.get("PVECLEAN_DEB_MIRROR", "http://deb.debian.org/debian")
MAX_AGE_DAYS = 30  # then debootstrap again: a fresh root should look like a fresh install
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root",
       "DEBIAN_FRONTEND": "noninteractive"}
APT = "apt-get -y -q -o Dpkg::Use-Pty=0 -o Acquire::Retries=3"


def log(msg: str) -> None:
    print(msg, flush=True)


def mounts_below(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [ln.split()[1].replace("\\040", " ") for ln in f]
    return sorted((p for p in points if (p + "/").startswith(prefix)), key=len, reverse=True)


def remove_tree(path: Path) -> None:
    """rm -rf, never through a mount (a bind or proc left inside a chroot)."""
    for m in mounts_below(path):
        if subprocess.run(["umount", m], check=False).returncode != 0:
            subprocess.run(["umount", "-l", m], check=False)
    left = mounts_below(path)
    if left:
        raise SystemExit(f"deb-check: {left} still mounted; not removing {path}")
    shutil.rmtree(path, ignore_errors=True)


def base_tarball(release: str) -> Path:
    """The debootstrapped minbase root of release, made once and cached."""
    tar = CACHE / f"{release}.tar"
    if tar.is_file() and time.time() - tar.stat().st_mtime < MAX_AGE_DAYS * 86400:
        return tar
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{release}-", dir=CACHE))
    try:
        t0 = time.monotonic()
        log(f"debootstrap {release} (cached in {tar} afterwards)")
        for attempt in (1, 2):  # a network hiccup or a mirror sync: once more
            remove_tree(tmp / "root")
            r = subprocess.run(["debootstrap", "--variant=minbase", release,
                                str(tmp / "root"), MIRROR], capture_output=True, text=True,
                               check=False)
            if r.returncode == 0 or attempt == 2:
                break
            log(f"debootstrap {release} failed, once more")
            time.sleep(10)
        if r.returncode != 0:
            raise SystemExit(f"deb-check: debootstrap {release} failed:\n{r.stdout[-3000:]}"
                             f"{r.stderr[-2000:]}")
        subprocess.run(["tar", "-C", str(tmp / "root"), "-cf", str(tmp / "root.tar"), "."],
                       check=True)
        os.replace(tmp / "root.tar", tar)
        log(f"debootstrap {release}: {time.monotonic() - t0:.0f} s")
    finally:
        remove_tree(tmp)
    return tar


class Root:
    """A fresh root from the cached tarball, as a chroot."""

    def __init__(self, release: str, path: Path) -> None:
        self.release = release
        self.path = path

    def sh(self, cmd: str, env: dict[str, str] | None = None, timeout: float = 900,
           network: bool = True) -> subprocess.CompletedProcess[str]:
        """cmd in the root; without network: in a network namespace of its own (no route
        anywhere, the loopback down)."""
        pre = [] if network else ["unshare", "--net"]
        return subprocess.run([*pre, "chroot", str(self.path), "/bin/sh", "-c", cmd],
                              env=env or ENV, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)

    def apt(self, args: str) -> subprocess.CompletedProcess[str]:
        return self.sh(f"{APT} {args}")

    def file(self, path: str) -> Path:
        return self.path / path.lstrip("/")


@contextmanager
def fresh_root(release: str, work: Path, name: str = "", debs_of: str = "") -> Iterator[Root]:
    """A fresh root of release under work/name; the .debs apt fetches are kept for the next
    run under debs_of (default: release; a root upgraded to another release: that one)."""
    path = work / (name or release)
    path.mkdir()
    debs = CACHE / f"{debs_of or release}-debs"
    try:
        subprocess.run(["tar", "-C", str(path), "-xf", str(base_tarball(release))], check=True)
        shutil.copy2("/etc/resolv.conf", path / "etc/resolv.conf", follow_symlinks=True)
        (path / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")  # start no daemon
        (path / "usr/sbin/policy-rc.d").chmod(0o755)
        archives = path / "var/cache/apt/archives"
        for d in debs.glob("*.deb") if debs.is_dir() else ():
            shutil.copy2(d, archives / d.name)
        subprocess.run(["mount", "-t", "proc", "proc", str(path / "proc")], check=True)
        yield Root(release, path)
    finally:
        if (path / "var/cache/apt/archives").is_dir():
            debs.mkdir(parents=True, exist_ok=True)
            for d in (path / "var/cache/apt/archives").glob("*.deb"):
                if not d.name.startswith("pveclean_") and not (debs / d.name).exists():
                    shutil.copy2(d, debs / d.name)
        remove_tree(path)
