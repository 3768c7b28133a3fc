"""The one table every terminal view prints: columns two spaces apart, measured by displayed
width, and how a MiB figure is written."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pveclean.core.text import ljust, width


def mib_text(mib: int | None) -> str:
    """A MiB figure as every command prints it: digits only (18000), as in reports."""
    return "-" if mib is None else str(mib)


def table(rows: Sequence[tuple[str, ...]], indent: str = "",
          right: Collection[int] = ()) -> list[str]:
    """Columns two spaces apart, each as wide as its widest cell in displayed columns (a wide
    character takes two); the columns in `right` aligned right; no trailing spaces."""
    widths = [max(width(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(" " * (w - width(c)) + c if i in right else ljust(c, w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]
