#!/usr/bin/env python3
"""`make deb-check`: the source package built the Debian way in fresh debootstrapped bookworm
(Proxmox VE 8) and trixie (Proxmox VE 9) roots, lintian on it, the package installed there with
apt as an admin would, and a bookworm root with it upgraded to trixie.

For each release (the roots: packaging/deb_roots.py):
  - build: a clean checkout (the committed tree plus uncommitted changes to tracked files, as
    `git archive` gives it) in a fresh root; `apt-get build-dep` installs Debian's build
    dependencies and nothing else; `dpkg-buildpackage -us -uc` builds the source and the binary
    package without network (a network namespace of its own: nothing from PyPI); its smoke test
    runs the CLI with that release's python3-click, -typing-extensions and -shellingham and the
    vendored typer; and a test build <version>~debcheck to upgrade from;
  - that release's lintian --pedantic, in that root, on the .changes (the .dsc, the source and
    the .deb): no error, no warning;
  - apt in a fresh root: installs <version>~debcheck from scratch (the dependencies from Debian),
    a hookscript is stamped as `pveclean install` stamps it, apt upgrades to the real package:
    the stamped hookscript still runs pveclean; pveclean --version, config check, hook 129
    pre-start/pre-stop (no Proxmox here: exit 0), bash completion through bash, byte-compiled
    modules (dh_python3's postinst, and its runtime.d hook that python3 runs when its default
    version changes), nothing under /etc/pve; apt-get remove keeps a changed conffile (and the
    hookscript then still exits 0), apt-get purge removes it and pveclean's systemd drop-ins
    (not another's) and leaves nothing of the package behind.
Then bookworm -> trixie: a bookworm root with the bookworm build installed and a hookscript
stamped, apt full-upgrade to trixie (Python 3.11 -> 3.13): pveclean and the hookscript work.

Needs root, git and debootstrap (installed with apt-get if missing) and Debian's archive
($PVECLEAN_DEB_MIRROR, default http://deb.debian.org/debian).

Usage: deb_check.py [--releases bookworm,trixie] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deb_roots import Root, fresh_root, log, remove_tree

REPO = Path(__file__).resolve().parent.parent
RELEASES = ("bookworm", "trixie")
# Proxmox runs hookscripts with this environment (see docs/proxmox.md)
HOOK_ENV = {"PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "LC_ALL": "C"}
HOOK = "/var/lib/vz/snippets/pveclean-hook"
FROM_DEBIAN = ("python3 python3-yaml python3-requests python3-click python3-typing-extensions "
               "python3-shellingham")

failures: list[str] = []
passed = 0


def said(r: subprocess.CompletedProcess[str]) -> str:
    """The first line a command printed, for the log."""
    lines = (r.stdout + r.stderr).strip().splitlines()
    return repr(lines[0][:100]) if lines else "(nothing)"


def check(release: str, what: str, ok: bool, detail: str = "") -> bool:
    global passed
    passed += ok
    log(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(f"{release}: {what}")
        if detail:
            log("       " + detail.strip().replace("\n", "\n       ")[-3000:])
    return ok


def host_tools() -> None:
    missing = [p for p, exe in (("debootstrap", "debootstrap"),) if shutil.which(exe) is None]
    if not missing:
        return
    log(f"installing {' '.join(missing)}")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL,
                       check=True)
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)


def source_tar(work: Path) -> Path:
    """The tree a clean checkout has (uncommitted changes to tracked files included), as a
    tarball with the top directory pveclean/."""
    git = ["git", "-C", str(REPO)]
    stash = subprocess.run([*git, "stash", "create"], capture_output=True, text=True,
                           check=True).stdout.strip()
    tar = work / "pveclean-src.tar"
    subprocess.run([*git, "archive", "--format=tar", "--prefix=pveclean/", "-o", str(tar),
                    stash or "HEAD"], check=True)
    return tar


def apt_update(root: Root) -> bool:
    r = root.apt("update")
    if r.returncode != 0:  # a mirror sync in progress: once more
        time.sleep(10)
        r = root.apt("update")
    return check(root.release, "apt-get update", r.returncode == 0, r.stdout + r.stderr)


def prepend_test_entry(changelog: Path) -> None:
    """A changelog entry <version>~debcheck on top: the version the apt check upgrades from."""
    text = changelog.read_text()
    m = re.match(r"pveclean \(([^)]+)\)", text)
    trailer = re.search(r"^ -- .+$", text, re.M)
    assert m and trailer, "debian/changelog has no valid first entry"
    changelog.write_text(f"pveclean ({m.group(1)}~debcheck) unstable; urgency=medium\n\n"
                         "  * Test build, the version deb-check upgrades from.\n\n"
                         f"{trailer.group(0)}\n\n{text}")


def build_in_root(release: str, src: Path, work: Path, out: Path) -> list[Path]:
    """Build the source and binary package in a fresh root of release: the files it made
    (.dsc, .tar.xz, .deb, .buildinfo, .changes, and the ~debcheck ones) copied to out."""
    t0 = time.monotonic()
    log(f"== {release}: build")
    with fresh_root(release, work, f"{release}-build") as root:
        root.file("/build").mkdir()
        subprocess.run(["tar", "-C", str(root.file("/build")), "-xf", str(src)], check=True)
        if not apt_update(root):
            return []
        r = root.apt("build-dep /build/pveclean")
        if not check(release, "apt-get build-dep: Debian's build dependencies only",
                     r.returncode == 0, r.stdout + r.stderr):
            return []
        r = root.sh(f"dpkg-query -W -f '${{Package}} ${{Version}}, ' {FROM_DEBIAN} debhelper "
                    "dh-python")
        log(f"       from {release}: {r.stdout.strip(', ')}")
        shutil.copytree(root.file("/build/pveclean"), root.file("/build/prev/pveclean"),
                        symlinks=True)
        r = root.sh("cd /build/pveclean && dpkg-buildpackage -us -uc", network=False)
        check(release, "dpkg-buildpackage -us -uc without network: source and binary package "
              "(its smoke test: this release's click, typing-extensions, shellingham)",
              r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:])
        prepend_test_entry(root.file("/build/prev/pveclean/debian/changelog"))
        r2 = root.sh("cd /build/prev/pveclean && DEB_BUILD_OPTIONS=nocheck "
                     "dpkg-buildpackage -us -uc -b", network=False)
        check(release, "a test build <version>~debcheck to upgrade from", r2.returncode == 0,
              r2.stdout[-3000:] + r2.stderr[-3000:])
        if r.returncode == 0:
            version = root.sh("cd /build/pveclean && dpkg-parsechangelog -S Version").stdout
            lintian(root, f"pveclean_{version.strip()}_*.changes")
        made = sorted(p for d in ("/build", "/build/prev") for p in root.file(d).iterdir()
                      if p.is_file())
        out.mkdir(parents=True, exist_ok=True)
        for p in made:
            shutil.copy2(p, out / p.name)
    log(f"== {release}: build {time.monotonic() - t0:.0f} s")
    return [out / p.name for p in made] if r.returncode == r2.returncode == 0 else []


def lintian(root: Root, changes: str) -> None:
    """The release's own lintian on what its build made (the .dsc, the source and the .deb)."""
    log(f"== {root.release}: lintian {changes}")
    r = root.apt("install --no-install-recommends lintian")
    if not check(root.release, "apt-get install lintian", r.returncode == 0, r.stdout + r.stderr):
        return
    r = root.sh(f"cd /build && lintian --version && lintian --pedantic --fail-on error,warning "
                f"{changes}")
    out = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines()
                    if "running with root privileges" not in ln)
    log("  " + out.replace("\n", "\n  "))
    check(root.release, "lintian: no errors or warnings (pedantic), source and binary",
          r.returncode == 0, out)


def stamp(root: Root) -> bool:
    """What `pveclean install` writes to a snippets directory (install.stamp)."""
    r = root.sh(f"mkdir -p {os.path.dirname(HOOK)} && "
                f"sed 's|^PVECLEAN_BIN=\"\"$|PVECLEAN_BIN=\"/usr/sbin/pveclean\"|' "
                f"/usr/share/pveclean/hookscripts/pveclean-hook > {HOOK} && chmod 0755 {HOOK}"
                f" && grep -q '^PVECLEAN_BIN=\"/usr/sbin/pveclean\"$' {HOOK}")
    return check(root.release, "stamp a hookscript with /usr/sbin/pveclean", r.returncode == 0,
                 r.stderr)


def run_release(release: str, prev: Path, deb: Path, version: str, work: Path) -> None:
    """apt install, upgrade, remove and purge of the package built in release's root."""
    t0 = time.monotonic()
    log(f"== {release}: apt")
    with fresh_root(release, work, f"{release}-apt") as root:
        for d in (prev, deb):
            shutil.copy2(d, root.file(f"/tmp/{d.name}"))
            root.file(f"/tmp/{d.name}").chmod(0o644)
        r = root.apt("update")
        if r.returncode != 0:  # a mirror sync in progress: once more
            time.sleep(10)
            r = root.apt("update")
        check(release, "apt-get update", r.returncode == 0, r.stdout + r.stderr)
        if r.returncode != 0:
            return
        r = root.apt(f"install /tmp/{prev.name}")
        check(release, f"apt-get install {prev.name} (dependencies from Debian)",
              r.returncode == 0, r.stdout + r.stderr)
        if r.returncode != 0:
            return
        py = root.sh(f"dpkg-query -W -f '${{Package}} ${{Version}}, ' {FROM_DEBIAN}")
        log(f"       from {release}: {py.stdout.strip(', ')}")
        hook = HOOK
        stamp(root)

        r = root.apt(f"install /tmp/{deb.name}")
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
        r = root.sh("test -s /usr/share/man/man8/pveclean.8.gz && "
                    "test -s /usr/share/man/man5/pveclean.yaml.5.gz")
        check(release, "man pages pveclean(8) and pveclean.yaml(5) installed", r.returncode == 0)
        check(release, "nothing created under /etc/pve", not root.file("/etc/pve").exists())

        conf = "/etc/pveclean/pveclean.yaml"
        mark = "# changed by the admin (deb-check)"
        root.file(conf).write_text(root.file(conf).read_text() + f"{mark}\n")
        r = root.apt("remove pveclean")
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
        # what `pveclean install --systemd` writes, and a drop-in of someone else's
        ours = root.file("/etc/systemd/system/pve-container@129.service.d/pveclean.conf")
        theirs = root.file("/etc/systemd/system/pve-container@130.service.d/pveclean.conf")
        for p, text in ((ours, "# pveclean systemd drop-in: written by 'pveclean install "
                         "--systemd'\n[Service]\n"), (theirs, "[Service]\n")):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        r = root.apt("purge pveclean")
        check(release, "apt-get purge pveclean", r.returncode == 0, r.stdout + r.stderr)
        st = root.sh("dpkg-query -W -f '${db:Status-Abbrev}' pveclean").stdout.strip()
        left = [p for p in ("/etc/pveclean", "/var/log/pveclean", "/var/lib/pveclean",
                            "/usr/share/pveclean", "/usr/share/doc/pveclean")
                if root.file(p).exists()]
        check(release, "after purge: conffile and the package's directories gone"
              + (f" {left}" if left else ""),
              not left and st in ("", "un"), f"status {st!r}")
        check(release, "after purge: pveclean's systemd drop-in removed, another one kept",
              not ours.parent.exists() and theirs.is_file(), r.stderr)
        check(release, "nothing created under /etc/pve", not root.file("/etc/pve").exists())
    log(f"== {release}: apt {time.monotonic() - t0:.0f} s")


def dist_upgrade(deb: Path, version: str, work: Path) -> None:
    """bookworm with the package and a stamped hookscript, upgraded to trixie (Proxmox VE 8 ->
    9): python3 3.11 -> 3.13, the package itself unchanged."""
    t0 = time.monotonic()
    what = "bookworm->trixie"
    log(f"== {what}: apt full-upgrade with {deb.name} installed")
    with fresh_root("bookworm", work, "upgrade", debs_of="trixie") as root:
        shutil.copy2(deb, root.file(f"/tmp/{deb.name}"))
        root.file(f"/tmp/{deb.name}").chmod(0o644)
        if not apt_update(root):
            return
        r = root.apt(f"install /tmp/{deb.name}")
        if not check(what, f"bookworm: apt-get install {deb.name}", r.returncode == 0,
                     r.stdout + r.stderr) or not stamp(root):
            return
        sources = root.file("/etc/apt/sources.list")
        sources.write_text(sources.read_text().replace("bookworm", "trixie"))
        if not apt_update(root):
            return
        r = root.apt("-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
                     "full-upgrade")
        check(what, "apt-get full-upgrade to trixie", r.returncode == 0,
              r.stdout[-3000:] + r.stderr)
        r = root.sh("python3 -c 'import sys; print(sys.version_info[:2])'; "
                    "dpkg-query -W -f '${Version} ${db:Status-Abbrev}' pveclean")
        check(what, f"python3 {r.stdout.splitlines()[0] if r.stdout else '?'}, pveclean still "
              "installed", r.stdout.startswith("(3, 13)")
              and f"{deb.name.split('_')[1]} ii" in r.stdout, r.stdout + r.stderr)
        r = root.sh("pveclean --version")
        check(what, f"pveclean --version: {r.stdout.strip()}",
              r.returncode == 0 and r.stdout.strip() == f"pveclean {version}",
              r.stdout + r.stderr)
        r = root.sh("pveclean --help")
        check(what, "pveclean --help with trixie's click",
              r.returncode == 0 and "Usage: pveclean" in r.stdout, r.stdout + r.stderr)
        r = root.sh(f"{HOOK} 129 pre-start", env=HOOK_ENV)
        check(what, f"the stamped hookscript runs pveclean: exit {r.returncode}, {said(r)}",
              r.returncode == 0 and "not found" not in r.stdout, r.stdout + r.stderr)
        r = root.sh("ls /usr/lib/pveclean/pveclean/commands/__pycache__/")
        check(what, "modules byte-compiled for Python 3.13 (dh_python3's rtupdate hook)",
              "hook.cpython-313.pyc" in r.stdout, r.stdout + r.stderr)
    log(f"== {what}: {time.monotonic() - t0:.0f} s")


def the(made: list[Path], name: str) -> Path:
    found = [p for p in made if re.fullmatch(name, p.name)]
    assert len(found) == 1, f"{name}: {[p.name for p in made]}"
    return found[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--releases", default=",".join(RELEASES))
    ap.add_argument("--keep", type=Path, help="copy what the builds made to KEEP/<release>/")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("deb-check: needs root (debootstrap, chroot)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    host_tools()
    sys.path.insert(0, str(REPO))
    from pveclean import __version__

    releases = args.releases.split(",")
    v = re.escape(__version__)
    with tempfile.TemporaryDirectory(prefix="pveclean-deb-check-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        built: dict[str, list[Path]] = {}
        try:
            src = source_tar(work)
            for release in releases:
                made = built[release] = build_in_root(release, src, work, work / "out" / release)
                if not made:
                    continue
                run_release(release, the(made, rf"pveclean_{v}~debcheck_all\.deb"),
                            the(made, rf"pveclean_{v}_all\.deb"), __version__, work)
            if {"bookworm", "trixie"} <= set(releases) and built.get("bookworm"):
                dist_upgrade(the(built["bookworm"], rf"pveclean_{v}_all\.deb"), __version__,
                             work)
            if args.keep:
                for release, made in built.items():
                    (args.keep / release).mkdir(parents=True, exist_ok=True)
                    for p in made:
                        shutil.copy2(p, args.keep / release / p.name)
        finally:
            for p in work.iterdir():
                if p.is_dir():
                    remove_tree(p)
    log(f"deb-check: {time.monotonic() - t0:.0f} s on {args.releases}; build, lintian and apt "
        f"{'FAILED: ' + '; '.join(failures) if failures else 'clean'}")
    log(f"deb-check: {passed} passed, {len(failures)} failed")  # the closing line CI reads
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
