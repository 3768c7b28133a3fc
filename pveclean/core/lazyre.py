"""A regular expression compiled where it is first used, not when its module is imported.

`_KEY = lazy(r"...")` in place of `_KEY = re.compile(r"...")`: the same calls (match,
fullmatch, search, sub), the same results. A module on every command's path may hold patterns
that only some paths use (a VM's config lines, a report's file names); compiling each at import
cost every run its time (issue 42: 75 patterns at import, 30 ms of a 179 ms dry run)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import AnyStr, Generic


class Lazy(Generic[AnyStr]):
    """re.compile(pattern, flags), done on the first call and kept."""

    __slots__ = ("_compiled", "_flags", "_pattern")

    def __init__(self, pattern: AnyStr, flags: int = 0) -> None:
        self._pattern: AnyStr = pattern
        self._flags = flags
        self._compiled: re.Pattern[AnyStr] | None = None

    @property
    def compiled(self) -> re.Pattern[AnyStr]:
        if self._compiled is None:
            self._compiled = re.compile(self._pattern, self._flags)
        return self._compiled

    @property
    def pattern(self) -> AnyStr:
        return self._pattern

    def match(self, string: AnyStr, pos: int = 0) -> re.Match[AnyStr] | None:
        return self.compiled.match(string, pos)

    def fullmatch(self, string: AnyStr) -> re.Match[AnyStr] | None:
        return self.compiled.fullmatch(string)

    def search(self, string: AnyStr) -> re.Match[AnyStr] | None:
        return self.compiled.search(string)

    def sub(self, repl: AnyStr | Callable[[re.Match[AnyStr]], AnyStr], string: AnyStr,
            count: int = 0) -> AnyStr:
        return self.compiled.sub(repl, string, count)


def lazy(pattern: AnyStr, flags: int = 0) -> Lazy[AnyStr]:
    """A pattern compiled on its first use (see the module's doc)."""
    return Lazy(pattern, flags)
