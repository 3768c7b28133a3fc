#!/usr/bin/env python3
"""`make deb-check`: install the .deb with apt, as an admin would, into fresh debootstrapped
bookworm (Proxmox VE 8) and trixie (Proxmox VE 9) roots, and check it there; then lintian.

In each root (a chroot with /proc mounted, removed afterwards):
  - apt installs a test build <version>~debcheck from scratch (Debian's python3, python3-yaml,
    python3-requests come from the archive), a hookscript is stamped as `pveclean install`
    stamps it, then apt upgrades to the real package: the stamped hookscript still runs pveclean;
  - pveclean --version, config check, hook 129 pre-start/pre-stop (no Proxmox here: exit 0),
    bash completion through bash, byte-compiled modules (by postinst, and by the runtime.d
    hook that python3 runs when its default version changes), nothing under /etc/pve;
  - apt-get remove keeps a changed conffile (and the hookscript then still exits 0),
    apt-get purge removes it and leaves nothing of the package behind.

The debootstrapped roots are cached as tarballs in $PVECLEAN_DEB_CACHE
(default /var/cache/pveclean-deb-check, outside the clone: CI runs in a fresh one) for up to
30 days, with the .debs apt fetched (apt still checks them against the archive's lists).
Needs root, debootstrap and lintian (installed with apt-get if missing) and Debian's archive
($PVECLEAN_DEB_MIRROR, default http://deb.debian.org/debian).

Usage: deb_check.py DEB [--releases bookworm,trixie]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PVECLEAN_DEB_CACHE", "/var/cache/pveclean-deb-check"))
MIRROR = os.environ.get("PVECLEAN_DEB_MIRROR", "http://deb.debian.org/debian")
RELEASES = ("bookworm", "trixie")
MAX_AGE_DAYS = 30  # then debootstrap again: a fresh root should look like a fresh install
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root",
       "DEBIAN_FRONTEND": "noninteractive"}
# Proxmox runs hookscripts with this environment (see docs/proxmox.md)
HOOK_ENV = {"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"}
APT = "apt-get -y -q -o Dpkg::Use-Pty=0 -o Acquire::Retries=3"

failures: list[str] = []
passed = 0


def said(r: subprocess.CompletedProcess[str]) -> str:
    """The first line a command printed, for the log."""
    lines = (r.stdout + r.stderr).strip().splitlines()
    return repr(lines[0][:100]) if lines else "(nothing)"


def log(msg: str) -> None:
    print(msg, flush=True)


def check(release: str, what: str, ok: bool, detail: str = "") -> None:
    global passed
    passed += ok
    log(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(f"{release}: {what}")
        if detail:
            log("       " + detail.strip().replace("\n", "\n       ")[-3000:])


def host_tools() -> None:
    missing = [p for p, exe in (("debootstrap", "debootstrap"), ("lintian", "lintian"))
               if shutil.which(exe) is None]
    if not missing:
        return
    log(f"installing {' '.join(missing)}")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL,
                       check=True)
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)


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

    def sh(self, cmd: str, env: dict[str, str] | None = None,
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["chroot", str(self.path), "/bin/sh", "-c", cmd],
                              env=env or ENV, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)

    def file(self, path: str) -> Path:
        return self.path / path.lstrip("/")


@contextmanager
def fresh_root(release: str, work: Path) -> Iterator[Root]:
    path = work / release
    path.mkdir()
    debs = CACHE / f"{release}-debs"
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


def apt(root: Root, args: str) -> subprocess.CompletedProcess[str]:
    return root.sh(f"{APT} {args}")


def run_release(release: str, prev: Path, deb: Path, version: str, work: Path) -> None:
    t0 = time.monotonic()
    log(f"== {release}")
    with fresh_root(release, work) as root:
        for d in (prev, deb):
            shutil.copy2(d, root.file(f"/tmp/{d.name}"))
            root.file(f"/tmp/{d.name}").chmod(0o644)
        r = apt(root, "update")
        if r.returncode != 0:  # a mirror sync in progress: once more
            time.sleep(10)
            r = apt(root, "update")
        check(release, "apt-get update", r.returncode == 0, r.stdout + r.stderr)
        if r.returncode != 0:
            return
        r = apt(root, f"install /tmp/{prev.name}")
        check(release, f"apt-get install {prev.name} (dependencies from Debian)",
              r.returncode == 0, r.stdout + r.stderr)
        if r.returncode != 0:
            return
        py = root.sh("dpkg-query -W -f '${Package} ${Version}, ' python3 python3-yaml "
                     "python3-requests")
        log(f"       from {release}: {py.stdout.strip(', ')}")
        # what `pveclean install` writes to a snippets directory (install.stamp)
        hook = "/var/lib/vz/snippets/pveclean-hook"
        r = root.sh(f"mkdir -p {os.path.dirname(hook)} && "
                    f"sed 's|^PVECLEAN_BIN=\"\"$|PVECLEAN_BIN=\"/usr/sbin/pveclean\"|' "
                    f"/usr/share/pveclean/hookscripts/pveclean-hook > {hook} && chmod 0755 {hook}"
                    f" && grep -q '^PVECLEAN_BIN=\"/usr/sbin/pveclean\"$' {hook}")
        check(release, "stamp a hookscript with /usr/sbin/pveclean", r.returncode == 0,
              r.stderr)

        r = apt(root, f"install /tmp/{deb.name}")
        check(release, f"apt-get install {deb.name} (upgrade)", r.returncode == 0,
              r.stdout + r.stderr)
        r = root.sh("dpkg-query -W -f '${Version} ${db:Status-Abbrev}' pveclean")
        check(release, f"installed: {r.stdout.strip()}", r.stdout.split()[:2] == [
            deb.name.split("_")[1], "ii"], r.stderr)
        r = root.sh(f"{hook} 129 pre-start", env=HOOK_ENV)
        check(release, f"the stamped hookscript runs pveclean after the upgrade: exit "
              f"{r.returncode}, {said(r)}",
              r.returncode == 0 and "not found" not in r.stdout, r.stdout + r.stderr)

        r = root.sh("pveclean --version")
        check(release, f"pveclean --version: {r.stdout.strip()}",
              r.returncode == 0 and r.stdout.strip() == f"pveclean {version}",
              r.stdout + r.stderr)
        r = root.sh("pveclean config check")
        check(release, "pveclean config check", r.returncode == 0, r.stdout + r.stderr)
        for phase in ("pre-start", "pre-stop"):
            r = root.sh(f"pveclean hook 129 {phase}", env=HOOK_ENV)
            check(release, f"pveclean hook 129 {phase} without Proxmox: exit {r.returncode}, "
                  f"{said(r)}",
                  r.returncode == 0, r.stdout + r.stderr)
        r = root.sh("pveclean ct abc")
        check(release, f"pveclean ct abc: exit {r.returncode}, {said(r)}",
                       r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr)
        r = root.sh("pveclean --help")
        check(release, "pveclean --help", r.returncode == 0 and "Usage: pveclean" in r.stdout,
              r.stdout + r.stderr)
        pycache = "/usr/lib/pveclean/pveclean/commands/__pycache__"  # the package's rooms too
        r = root.sh(f"ls /usr/lib/pveclean/pveclean/__pycache__/ {pycache}/")
        check(release, "modules byte-compiled by postinst",
              all(f"{m}.cpython-3" in r.stdout for m in ("__main__", "cleanup", "hook", "cli")),
              r.stdout + r.stderr)
        r = root.sh(f"py3clean -p pveclean && ! ls {pycache} 2>&1 "
                    "&& /usr/share/python3/runtime.d/pveclean.rtupdate rtupdate python3 python3"
                    f" && ls {pycache}/")
        check(release, "the python3 runtime.d hook compiles them again (default Python changed)",
              r.returncode == 0 and "hook.cpython-3" in r.stdout, r.stdout + r.stderr)
        r = root.sh("bash -c '. /usr/share/bash-completion/completions/pveclean; "
                    "COMP_WORDS=(pveclean con); COMP_CWORD=1; _pveclean_completion pveclean; "
                    "echo \"${COMPREPLY[*]}\"'")
        check(release, f"bash completion of 'pveclean con': {r.stdout.strip()!r}",
              r.stdout.split() == ["config"], r.stdout + r.stderr)
        r = root.sh("test -s /usr/share/man/man8/pveclean.8.gz")
        check(release, "man page installed", r.returncode == 0)
        check(release, "nothing created under /etc/pve", not root.file("/etc/pve").exists())

        conf = "/etc/pveclean/pveclean.yaml"
        mark = "# changed by the admin (deb-check)"
        root.file(conf).write_text(root.file(conf).read_text() + f"{mark}\n")
        r = apt(root, "remove pveclean")
        check(release, "apt-get remove pveclean", r.returncode == 0, r.stdout + r.stderr)
        st = root.sh("dpkg-query -W -f '${db:Status-Abbrev}' pveclean").stdout.strip()
        check(release, f"after remove: changed conffile kept (status {st})",
              root.file(conf).is_file() and mark in root.file(conf).read_text() and st == "rc")
        check(release, "after remove: /usr/sbin/pveclean and /usr/lib/pveclean gone",
              not root.file("/usr/sbin/pveclean").exists()
              and not root.file("/usr/lib/pveclean").exists())
        r = root.sh(f"{hook} 129 pre-start", env=HOOK_ENV)
        check(release, f"after remove: the registered hookscript exits {r.returncode}, "
              f"{said(r)}",
              r.returncode == 0 and "not found" in r.stdout, r.stdout + r.stderr)
        r = apt(root, "purge pveclean")
        check(release, "apt-get purge pveclean", r.returncode == 0, r.stdout + r.stderr)
        st = root.sh("dpkg-query -W -f '${db:Status-Abbrev}' pveclean").stdout.strip()
        left = [p for p in ("/etc/pveclean", "/var/log/pveclean", "/var/lib/pveclean",
                            "/usr/share/pveclean", "/usr/share/doc/pveclean")
                if root.file(p).exists()]
        check(release, "after purge: conffile and the package's directories gone"
              + (f" {left}" if left else ""),
              not left and st in ("", "un"), f"status {st!r}")
        check(release, "nothing created under /etc/pve", not root.file("/etc/pve").exists())
    log(f"== {release}: {time.monotonic() - t0:.0f} s")


def lintian(deb: Path) -> None:
    log(f"== lintian {deb.name}")
    r = subprocess.run(["lintian", "--pedantic", "--fail-on", "error,warning", str(deb)],
                       capture_output=True, text=True, check=False)
    out = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines()
                    if "running with root privileges" not in ln)
    log("  " + (out.replace("\n", "\n  ") if out.strip() else "(no tags)"))
    check("lintian", "no errors or warnings (pedantic)", r.returncode == 0, out)


def build(out: Path, *extra: str) -> Path:
    r = subprocess.run([sys.executable, str(REPO / "packaging/build_deb.py"), str(out), *extra],
                       stdout=subprocess.PIPE, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"deb-check: build_deb.py {' '.join(extra)} failed")
    deb = Path(r.stdout.strip().splitlines()[-1])
    log(f"built {deb}")
    return deb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("deb", type=Path, nargs="?",
                    help="the package to check (default: build it into dist/)")
    ap.add_argument("--releases", default=",".join(RELEASES))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("deb-check: needs root (debootstrap, chroot)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    host_tools()
    sys.path.insert(0, str(REPO))
    from pveclean import __version__

    deb = (args.deb or build(REPO / "dist")).resolve()
    version = deb.name.split("_")[1]
    with tempfile.TemporaryDirectory(prefix="pveclean-deb-check-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        # the version to upgrade from: the same tree, sorting before the real one
        prev = build(work, "--version", f"{version}~debcheck")
        try:
            lintian(deb)
            for release in args.releases.split(","):
                run_release(release, prev, deb, __version__, work)
        finally:
            for p in work.iterdir():
                if p.is_dir():
                    remove_tree(p)
    log(f"deb-check: {time.monotonic() - t0:.0f} s on {args.releases}; lintian and apt "
        f"{'FAILED: ' + '; '.join(failures) if failures else 'clean'}")
    log(f"deb-check: {passed} passed, {len(failures)} failed")  # the closing line CI reads
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
