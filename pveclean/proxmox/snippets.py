"""Where a snippet volume lives: `<storage>:snippets/<file>` as a path, the way Proxmox
resolves it for a directory storage (PVE::Storage::path, PVE::Storage::Plugin::get_subdir).

One resolver for install (the storage as the API gives it), the hook's chained script (the
storage as storage.cfg says it, no API on the hook path) and status."""

from __future__ import annotations

from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def parse_volid(volid: str) -> tuple[str, str] | None:
    """(storage, file name) of a snippet volume id; None for anything else (another content
    type, a name with a directory in it)."""
    storage, _, volname = volid.partition(":")
    name = volname.removeprefix("snippets/")
    if not storage or name == volname or not name or "/" in name:
        return None
    return storage, name


def content_dirs(value: Any) -> tuple[tuple[str, str], ...]:
    """A storage's `content-dirs` (`snippets=hooks,iso=isos`, or the API's dict form) as
    (content type, sub-directory) pairs."""
    if isinstance(value, dict):
        return tuple((str(k), str(v).strip("/")) for k, v in value.items() if v)
    out = []
    for item in str(value or "").split(","):
        vtype, _, sub = item.partition("=")
        if vtype.strip() and sub.strip().strip("/"):
            out.append((vtype.strip(), sub.strip().strip("/")))
    return tuple(out)


def snippets_dir(path: str | None, dirs: tuple[tuple[str, str], ...]) -> Path | None:
    """get_subdir for snippets: `<path>/snippets`, or the storage's `content-dirs snippets=`
    (PVE >= 7.3); None for a storage without a path."""
    if not path:
        return None
    return Path(path) / dict(dirs).get("snippets", "snippets")


def storage_options(storage_cfg: str, storage: str) -> dict[str, str] | None:
    """The options of one storage's section of storage.cfg's text; None if it has none."""
    opts: dict[str, str] | None = None
    for line in storage_cfg.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] not in " \t":
            if opts is not None:
                break  # the section of this storage is over
            if line.partition(":")[2].strip() == storage:
                opts = {}
        elif opts is not None:
            key, _, value = line.strip().partition(" ")
            opts[key] = value.strip()
    return opts


def path_in_storage_cfg(storage_cfg: str, volid: str) -> Path | None:
    """The path of a snippet volume as storage.cfg's text places it; None if unknown."""
    parsed = parse_volid(volid)
    if parsed is None:
        return None
    storage, name = parsed
    opts = storage_options(storage_cfg, storage)
    sdir = snippets_dir(opts.get("path"), content_dirs(opts.get("content-dirs"))) if opts \
        else None
    return sdir / name if sdir else None
