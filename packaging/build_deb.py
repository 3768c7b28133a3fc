#!/usr/bin/env python3
"""`make deb`: dist/pveclean_<version>_all.deb, one package for Proxmox VE 8 (bookworm,
Python 3.11) and 9 (trixie, Python 3.13).

Debian's own python3-yaml and python3-requests serve (bookworm has 6.0 and 2.28, trixie 6.0.2
and 2.32). What Debian lacks or ships too old is vendored as pure-Python wheels into the private
directory /usr/lib/pveclean, next to pveclean itself: typer (bookworm: 0.7, no Annotated
parameters), click and typing_extensions (the versions that typer was tested with here),
proxmoxer (bookworm: 1.2, pveclean needs 2.x), nvidia-ml-py (not in Debian main) and shellingham
(typer's shell detection, so `--help` reads the same on every host). The vendored versions are
the ones installed in the build environment, i.e. the ones the test suite ran against; every
wheel must be `py3-none-any` and is checked to hold no compiled file.

/usr/sbin/pveclean runs /usr/bin/python3 -I with /usr/lib/pveclean first on sys.path. The
hookscripts that `pveclean install` stamps call /usr/sbin/pveclean, a path every version of the
package keeps. The man page pveclean(8) and the bash completion are generated from the staged
CLI at build time. postinst byte-compiles the private directory with py3compile, and a
python3 runtime.d hook compiles it again when Debian's default Python changes (the upgrade from
Proxmox VE 8 to 9).

Usage: build_deb.py OUT_DIR [--version V] [--wheels DIR]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "packaging"
LIB = "usr/lib/pveclean"

# distribution -> (Debian licence short name (DEP-5), what of the wheel to ship, copyright
# holders where the licence file does not name them); the licence text comes from the wheel.
# nvidia-ml-py's wheel also has a top-level example.py: not shipped.
VENDORED: dict[str, tuple[str, tuple[str, ...], str | None]] = {
    "typer": ("Expat", ("typer",), None),
    "click": ("BSD-3-clause", ("click",), None),
    "typing_extensions": ("PSF-2.0", ("typing_extensions.py",), "Python Software Foundation"),
    "shellingham": ("ISC", ("shellingham",), None),
    "proxmoxer": ("Expat", ("proxmoxer",), None),
    "nvidia-ml-py": ("BSD-3-clause", ("pynvml.py",), None),
}
DEPENDS = "python3 (>= 3.11), python3-yaml (>= 6.0), python3-requests (>= 2.28)"

LAUNCHER = """#!/usr/bin/python3 -I
# pveclean: the package's private library directory first; -I keeps PYTHONPATH and
# user site-packages out (pveclean runs as root from Proxmox hooks).
import os
import sys

sys.path.insert(0, os.path.normpath(os.path.join(os.path.realpath(__file__), "..", "..", "lib",
                                                 "pveclean")))
from pveclean.__main__ import entry

entry()
"""

CONTROL = """Package: pveclean
Version: {version}
Architecture: all
Maintainer: {maintainer}
Installed-Size: {size}
Depends: {depends}
Enhances: pve-container
Section: admin
Priority: optional
Description: stop the GPU holders of a Proxmox LXC container
 pveclean finds exactly the processes of one container that hold NVIDIA device
 nodes or GPU memory, stops them with escalation through pidfds, verifies
 through NVML that the memory is free and writes a YAML report. It runs by hand
 (pveclean ct VMID) and as a guest hookscript on pct stop/start; register it
 with: pveclean install --all-gpu
"""


def changelog_head(text: str) -> tuple[str, str]:
    """(version, maintainer) of the changelog's newest entry."""
    m = re.match(r"pveclean \(([^)]+)\)", text)
    who = re.search(r"^ -- (.+?)  ", text, re.M)
    if not m or not who:
        raise SystemExit("build_deb: packaging/debian/changelog has no valid first entry")
    return m.group(1), who.group(1)


def fetch_wheels(dest: Path, python: str) -> list[Path]:
    """The vendored distributions as wheels, at the versions installed here."""
    pins = [f"{d}=={metadata.version(d)}" for d in VENDORED]
    subprocess.run([python, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "--dest", str(dest), *pins], check=True)
    return sorted(dest.glob("*.whl"))


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def vendored_entry(dist: str) -> tuple[str, tuple[str, ...], str | None]:
    for d, entry in VENDORED.items():
        if norm(d) == norm(dist):
            return entry
    raise SystemExit(f"build_deb: {dist} is not one of the vendored distributions")


def unpack_wheel(whl: Path, lib: Path) -> tuple[str, list[str], str]:
    """Unpack a pure-Python wheel into lib: (distribution, top-level entries, licence text).
    Keeps METADATA of the dist-info (importlib.metadata still answers), drops the rest."""
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/WHEEL"))
        wheel_meta = z.read(f"{info}/WHEEL").decode()
        tags = re.findall(r"^Tag: (\S+)", wheel_meta, re.M)
        if "Root-Is-Purelib: true" not in wheel_meta or not all(
                t.endswith("-none-any") for t in tags):
            raise SystemExit(f"build_deb: {whl.name} is not pure Python ({tags})")
        found = re.search(r"^Name: (.+)$", z.read(f"{info}/METADATA").decode(), re.M)
        assert found
        dist = found.group(1).strip()
        keep = vendored_entry(dist)[1]
        lic_names = [n for n in names if n.startswith(f"{info}/")
                     and re.search(r"/(licenses/)?(LICEN[CS]E|COPYING)[^/]*$", n)]
        licence = "\n\n".join(z.read(n).decode() for n in lic_names)
        top: set[str] = set()
        for n in names:
            if n.endswith("/") or (n.startswith(f"{info}/") and not n.endswith("/METADATA")):
                continue
            if not n.startswith(f"{info}/") and n.split("/")[0] not in keep:
                continue
            if ".data/" in n.split("/")[0] + "/":
                raise SystemExit(f"build_deb: {whl.name} installs outside site-packages: {n}")
            if not (n.endswith(".py") or n.endswith("/METADATA") or n.endswith("py.typed")
                    or n.endswith(".pyi")):
                raise SystemExit(f"build_deb: {whl.name}: unexpected file {n}")
            target = lib / n
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(n))
            target.chmod(0o644)
            if not n.startswith(f"{info}/"):
                top.add(n.split("/")[0])
    return dist, [*sorted(top), info], licence


def nvml_licence(lib: Path) -> str:
    """nvidia-ml-py's wheel has no licence file: its licence is pynvml.py's header."""
    head = (lib / "pynvml.py").read_text().split("#####")[1]
    return "\n".join(ln[2:] if ln.startswith("# ") else ln.lstrip("#")
                     for ln in head.strip().splitlines())


def dep5_text(text: str) -> str:
    """Licence text as a DEP-5 continuation: each line indented, empty lines as ' .'."""
    lines = text.strip("\n").splitlines()
    return "\n".join(f" {ln.rstrip()}" if ln.strip() else " ." for ln in lines)


def copyright_file(vendored: list[tuple[str, list[str], str]]) -> str:
    out = [
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/",
        "Upstream-Name: pveclean",
        "",
        "Files: *",
        "Copyright: 2026 pveclean developers",
        "License: AGPL-3+",
        "",
    ]
    for dist, top, licence in vendored:
        short, _, named = vendored_entry(dist)
        holders = [named] if named else sorted(
            {m.strip() for m in re.findall(r"^\s*(Copyright.*\S)", licence, re.M)
             if not re.search(r"notice|holders? (and|nor)", m, re.I)})
        if not holders:
            raise SystemExit(f"build_deb: no copyright line in {dist}'s licence")
        files = " ".join(f"{LIB}/{t}" if t.endswith(".py") else f"{LIB}/{t}/*" for t in top)
        out += [f"Files: {files}", "Copyright: " + "\n ".join(
            re.sub(r"^Copyright\s*(\([cC]\)|©)?\s*", "", h) for h in holders),
            f"Comment: vendored from the {dist} wheel, with its own licence text.",
            f"License: {short}", dep5_text(licence), ""]
    agpl = (HERE / "debian/AGPL-3.0").read_text()
    out += ["License: AGPL-3+", dep5_text(
        "This program is free software: you can redistribute it and/or modify it under the "
        "terms of the GNU Affero General Public License as published by the Free Software "
        "Foundation, either version 3 of the License, or (at your option) any later "
        "version.\n\nThe full text of the licence follows.\n\n" + agpl), ""]
    return "\n".join(out)


def gz(data: bytes) -> bytes:
    """gzip -9n: no name, no time stamp (reproducible, and what lintian wants)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buf, mtime=0) as f:
        f.write(data)
    return buf.getvalue()


def put(root: Path, rel: str, data: bytes | str, mode: int = 0o644) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    p.chmod(mode)
    return p


def staged_python(lib: Path, python: str, code: list[str]) -> str:
    """Run python with the staged private directory first on sys.path (what the launcher
    does) and return its stdout."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(lib), "LC_ALL": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([python, *code], capture_output=False, stdout=subprocess.PIPE,
                          text=True, check=True, env=env, cwd=str(lib)).stdout


def build(out_dir: Path, python: str, version: str | None, wheels: Path | None) -> Path:
    changelog = (HERE / "debian/changelog").read_text()
    cl_version, maintainer = changelog_head(changelog)
    sys.path.insert(0, str(REPO))
    from pveclean import __version__

    if cl_version != __version__:
        raise SystemExit(f"build_deb: packaging/debian/changelog's newest entry is {cl_version},"
                         f" pveclean is {__version__}: add a changelog entry")
    if version and version != cl_version:  # a test build (deb-check's upgrade from it)
        changelog = (f"pveclean ({version}) unstable; urgency=medium\n\n  * Test build of "
                     f"{cl_version}.\n\n -- {maintainer}  "
                     f"{re.search(r'^ -- .+?  (.+)$', changelog, re.M).group(1)}\n\n"  # type: ignore[union-attr]
                     + changelog)
    version = version or cl_version
    with tempfile.TemporaryDirectory(prefix="pveclean-deb-") as tmp:
        root = Path(tmp) / "root"
        lib = root / LIB
        lib.mkdir(parents=True)
        for src in sorted((REPO / "pveclean").rglob("*.py")):
            put(lib, str(src.relative_to(REPO)), src.read_bytes())
        wheel_dir = wheels or Path(tmp) / "wheels"
        whls = sorted(wheel_dir.glob("*.whl")) if wheels else fetch_wheels(wheel_dir, python)
        vendored = []
        for whl in whls:
            dist, top, licence = unpack_wheel(whl, lib)
            if norm(dist) == "nvidia_ml_py":
                licence = nvml_licence(lib)
            vendored.append((dist, top, licence))
        missing = {norm(d) for d in VENDORED} - {norm(d) for d, _, _ in vendored}
        if missing:
            raise SystemExit(f"build_deb: no wheel for {sorted(missing)}")
        compiled = [p for p in root.rglob("*") if p.suffix in (".so", ".pyd", ".pyc")]
        if compiled:
            raise SystemExit(f"build_deb: compiled files staged: {compiled}")
        for p in lib.rglob("*.py"):  # vendored modules are imported, never run
            if p.read_bytes().startswith(b"#!"):
                p.write_bytes(p.read_bytes().split(b"\n", 1)[1])

        put(root, "usr/sbin/pveclean", LAUNCHER, 0o755)
        put(root, "etc/pveclean/pveclean.yaml", (REPO / "config/pveclean.yaml").read_bytes())
        put(root, "usr/share/pveclean/hookscripts/pveclean-hook",
            (REPO / "hookscripts/pveclean-hook").read_bytes(), 0o755)
        doc = "usr/share/doc/pveclean"
        put(root, f"{doc}/README.md.gz", gz((REPO / "README.md").read_bytes()))
        put(root, f"{doc}/changelog.gz", gz(changelog.encode()))
        put(root, f"{doc}/copyright", copyright_file(vendored))
        put(root, "usr/share/python3/runtime.d/pveclean.rtupdate",
            (HERE / "debian/rtupdate").read_bytes(), 0o755)
        overrides = HERE / "debian/lintian-overrides"
        if overrides.is_file():
            put(root, "usr/share/lintian/overrides/pveclean", overrides.read_bytes())
        date = re.search(r"^ -- .+?  \w+, (\d+ \w+ \d+)", changelog, re.M)
        assert date
        man_date = subprocess.run(["date", "-u", "-d", date.group(1), "+%Y-%m-%d"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        man = staged_python(lib, python, [str(HERE / "manpage.py"), "--date", man_date])
        put(root, "usr/share/man/man8/pveclean.8.gz", gz(man.encode()))
        # what `pveclean --show-completion` prints in bash (without guessing the shell)
        completion = staged_python(lib, python, ["-c", "import sys; "
                                   "from typer._completion_shared import get_completion_script;"
                                   " print(get_completion_script(prog_name='pveclean', "
                                   "complete_var='_PVECLEAN_COMPLETE', shell='bash'))"])
        if "_PVECLEAN_COMPLETE" not in completion:
            raise SystemExit("build_deb: the CLI gave no bash completion script")
        put(root, "usr/share/bash-completion/completions/pveclean", completion)

        debian = root / "DEBIAN"
        for script in ("postinst", "prerm", "postrm"):
            put(root, f"DEBIAN/{script}", (HERE / "debian" / script).read_bytes(), 0o755)
        put(root, "DEBIAN/conffiles", "/etc/pveclean/pveclean.yaml\n")
        sums = []
        size = 0
        for p in sorted(root.rglob("*")):
            if p.is_dir():
                p.chmod(0o755)
                size += 1
            elif debian not in p.parents:
                sums.append(f"{hashlib.md5(p.read_bytes()).hexdigest()}  "
                            f"{p.relative_to(root)}")
                size += (p.stat().st_size + 1023) // 1024
        put(root, "DEBIAN/md5sums", "\n".join(sums) + "\n")
        put(root, "DEBIAN/control", CONTROL.format(version=version, maintainer=maintainer,
                                                   size=size, depends=DEPENDS))
        epoch = os.environ.get("SOURCE_DATE_EPOCH")
        if epoch is None:
            epoch = subprocess.run(["date", "-u", "-d", date.group(1), "+%s"],
                                   capture_output=True, text=True, check=True).stdout.strip()
        for p in root.rglob("*"):
            os.utime(p, (int(epoch), int(epoch)), follow_symlinks=False)
        out_dir.mkdir(parents=True, exist_ok=True)
        deb = out_dir / f"pveclean_{version}_all.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root),
                        str(deb)], check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "SOURCE_DATE_EPOCH": epoch})
    return deb


def main() -> int:
    ap = argparse.ArgumentParser(description="build the pveclean .deb")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--python", default=sys.executable,
                    help="Python with pip, and the vendored packages installed at the versions "
                    "to ship (default: this one)")
    ap.add_argument("--version", help="package version (default: the changelog's)")
    ap.add_argument("--wheels", type=Path, help="use these wheels instead of pip download")
    args = ap.parse_args()
    if shutil.which("dpkg-deb") is None:
        print("build_deb: dpkg-deb not found (Debian/Proxmox only)", file=sys.stderr)
        return 2
    print(build(args.out_dir, args.python, args.version, args.wheels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
