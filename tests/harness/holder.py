"""Build the static ``holder`` test program (tests/harness/holder/holder.c).

``holder`` imitates a GPU workload: it opens or maps device nodes and keeps them until it is
signalled.  It is linked statically so that it runs inside bare busybox LXC containers.  Run it
through a symlink named like the process to imitate (``python3``, ``vllm-worker``...): the
kernel's comm is then the symlink's basename.

Options (all combinable; see holder.c):
  --hold PATH        open PATH (O_RDWR, else O_RDONLY) and keep the fd (inherited by children)
  --map PATH         mmap 4096 bytes of PATH (MAP_PRIVATE, PROT_READ), then close the fd
  --name NAME        set comm with prctl(PR_SET_NAME)
  --ignore-term      ignore SIGTERM (default: exit 0 on SIGTERM)
  --term-delay MS    on SIGTERM, exit after MS milliseconds
  --children N       fork N children sharing the fds/mappings (comm: --child-name if given)
  --child-name NAME  comm of the --children and of the --respawn workers
  --respawn N        supervisor holding nothing; its worker child holds and is restarted at
                     most N times after the first one exits
  --pidns            run inside a new PID namespace (needs CAP_SYS_ADMIN): outer process ->
                     init (PID 1, forwards SIGTERM) -> holder (PID 2)
  --thread-holds     a worker thread holds, the main thread exits: the leader is a zombie
                     (empty /proc/PID/fd and maps) while the process keeps the GPU
  --ready PATH       append "<getpid()> <comm>\\n" to PATH once the holder is set up
  --exit-after S     exit by itself after S seconds (default 3600)
Errors: ``holder: <what>: <strerror>`` on stderr and exit status 2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "holder" / "holder.c"
CFLAGS = ("-static", "-O2", "-Wall", "-std=gnu11")


def build_holder(out_dir: Path) -> Path:
    """Compile holder.c into ``out_dir/holder`` (skipped when newer than the source).

    Raises RuntimeError when gcc is missing or cannot link statically (install gcc and
    libc6-dev, which provides libc.a).
    """
    return build_program(SOURCE, out_dir)


def build_programs(out_dir: Path) -> dict[str, Path]:
    """Every static test program of ``holder/`` (holder.c and one file per attack a test
    plays inside a container), by name: ``holder/<name>.c`` -> ``out_dir/<name>``."""
    return {src.stem: build_program(src, out_dir)
            for src in sorted(SOURCE.parent.glob("*.c"))}


def build_program(source: Path, out_dir: Path) -> Path:
    """Compile one static program (skipped when newer than its source and the headers
    beside it, attack.h)."""
    out_dir = Path(out_dir)
    binary = out_dir / source.stem
    newest = max(p.stat().st_mtime for p in [source, *source.parent.glob("*.h")])
    if binary.exists() and binary.stat().st_mtime >= newest:
        return binary
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError(f"cannot build {source.stem}: gcc not found "
                           "(apt-get install gcc libc6-dev)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{source.stem}.{os.getpid()}.tmp"
    proc = subprocess.run(
        [gcc, *CFLAGS, "-o", str(tmp), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        hint = ""
        if "-lc" in proc.stderr or "libc.a" in proc.stderr:
            hint = " (static libc missing: apt-get install libc6-dev)"
        raise RuntimeError(f"cannot build {source.stem}: gcc -static failed{hint}:\n"
                           f"{proc.stderr.strip()}")
    tmp.replace(binary)  # atomic: a concurrent caller never sees a half-written binary
    return binary
