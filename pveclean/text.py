"""Container-controlled text made safe for terminals and logs."""
from __future__ import annotations


def safe(value: object, limit: int | None = 80) -> str:
    s = str(value)
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)
    if limit is not None and len(out) > limit:
        out = out[: max(limit - 1, 0)] + "…"
    return out
