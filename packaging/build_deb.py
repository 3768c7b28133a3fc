#!/usr/bin/env python3
"""`make deb`: a Debian package that installs pveclean and its dependencies into
/opt/pveclean (Proxmox hosts refuse system-wide pip installs), the default config as a
conffile, the hookscript, and /usr/sbin/pveclean (on the hook's PATH).

Usage: build_deb.py OUT_DIR [--python python3]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LAUNCHER = """#!/usr/bin/python3 -I
# pveclean launcher: the package's own library directory, isolated from site-packages.
import os, sys
here = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "opt", "pveclean", "lib"))
from pveclean.__main__ import main
sys.exit(main())
"""

CONTROL = """Package: pveclean
Version: {version}
Section: admin
Priority: optional
Architecture: {arch}
Depends: python3 (>= 3.11)
Maintainer: pveclean maintainers <pveclean@localhost>
Description: stop the GPU holders of a Proxmox LXC container and verify the memory is free
 pveclean finds exactly the processes of one container that hold NVIDIA device nodes or GPU
 memory, stops them with escalation through pidfds, verifies through NVML that the memory is
 free and writes a YAML report. It runs by hand (pveclean ct VMID) and as a guest hookscript
 on pct stop/start (register it with: pveclean install --all-gpu).
"""

POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
    install -d -m 0700 "$DPKG_ROOT/var/log/pveclean" "$DPKG_ROOT/var/lib/pveclean"
fi
exit 0
"""


def build(out_dir: Path, python: str) -> Path:
    sys.path.insert(0, str(REPO))
    from pveclean import __version__

    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="pveclean-deb-") as tmp:
        root = Path(tmp) / "root"
        lib = root / "opt/pveclean/lib"
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-compile",
                        "--target", str(lib), str(REPO)], check=True)
        shutil.rmtree(lib / "bin", ignore_errors=True)  # console scripts point at the builder
        for d in ("usr/sbin", "etc/pveclean", "usr/share/pveclean/hookscripts", "DEBIAN",
                  "usr/share/doc/pveclean"):
            (root / d).mkdir(parents=True, exist_ok=True)
        launcher = root / "usr/sbin/pveclean"
        launcher.write_text(LAUNCHER)
        launcher.chmod(0o755)
        shutil.copy2(REPO / "config/pveclean.yaml", root / "etc/pveclean/pveclean.yaml")
        (root / "etc/pveclean/pveclean.yaml").chmod(0o644)
        hook = root / "usr/share/pveclean/hookscripts/pveclean-hook"
        shutil.copy2(REPO / "hookscripts/pveclean-hook", hook)
        hook.chmod(0o755)
        shutil.copy2(REPO / "README.md", root / "usr/share/doc/pveclean/README.md")
        (root / "DEBIAN/control").write_text(CONTROL.format(version=__version__, arch=arch))
        (root / "DEBIAN/conffiles").write_text("/etc/pveclean/pveclean.yaml\n")
        post = root / "DEBIAN/postinst"
        post.write_text(POSTINST)
        post.chmod(0o755)
        out_dir.mkdir(parents=True, exist_ok=True)
        deb = out_dir / f"pveclean_{__version__}_{arch}.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
                       check=True, stdout=subprocess.DEVNULL)
    return deb


def main() -> int:
    ap = argparse.ArgumentParser(description="build the pveclean .deb")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    if shutil.which("dpkg-deb") is None:
        print("build_deb: dpkg-deb not found (Debian/Proxmox only)", file=sys.stderr)
        return 2
    print(build(args.out_dir, args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
