"""The layered house, checked from the code's own imports (run by `make lint`).

core is pure; host and proxmox are adapters; cleanup sequences a run; commands are the shells.
Each rule says what a layer may import; every import counts, a function-level one too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pveclean"
MAX_LINES = 450


def _settle(breaches: list[str]) -> None:
    assert not breaches, "\n".join(breaches)


# What each layer may import of pveclean (by prefix); anything else of pveclean is a breach.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "pveclean.errors": (),
    "pveclean.core": ("pveclean.core", "pveclean.errors", "pveclean.__init__"),
    "pveclean.host": ("pveclean.core", "pveclean.host", "pveclean.errors", "pveclean.__init__"),
    "pveclean.proxmox": ("pveclean.core", "pveclean.host", "pveclean.proxmox", "pveclean.errors",
                         "pveclean.__init__"),
    "pveclean.cleanup": ("pveclean.core", "pveclean.host", "pveclean.proxmox", "pveclean.errors",
                         "pveclean.__init__"),
    "pveclean.commands": ("pveclean.core", "pveclean.host", "pveclean.proxmox", "pveclean.errors",
                          "pveclean.cleanup", "pveclean.commands", "pveclean.__init__"),
    "pveclean.__main__": ("pveclean.commands", "pveclean.host", "pveclean.errors",
                          "pveclean.__init__"),
    "pveclean.__init__": (),
}
# The core does no I/O and reads no clock: none of these, at run time (type hints may name
# them under TYPE_CHECKING).
CORE_FORBIDDEN = frozenset({
    "os", "time", "subprocess", "signal", "socket", "select", "selectors", "fcntl", "resource",
    "ctypes", "pickle", "mmap", "threading", "glob", "shutil", "tempfile", "pathlib", "io",
    "pwd", "stat", "struct", "pynvml", "proxmoxer", "requests", "typer", "click",
})


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    return ".".join(rel.parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(node: ast.ImportFrom, module: str, known: dict[str, Path]) -> list[str]:
    """The pveclean modules an import-from brings in (a package's module, or the package)."""
    if node.level:
        parts = module.split(".")
        base = parts[: len(parts) - node.level]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    if target != "pveclean" and not target.startswith("pveclean."):
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if sub in known:
            out.append(sub)
        elif target in known:
            out.append(target)
        elif f"{target}.__init__" in known:
            out.append(f"{target}.__init__")
    return out


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement not inside an `if TYPE_CHECKING:` block."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) \
                    and child.test.id == "TYPE_CHECKING":
                for other in child.orelse:
                    walk(other)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """pveclean module -> the pveclean modules and the top-level outside modules it imports."""
    known = _modules()
    inner: dict[str, set[str]] = {m: set() for m in known}
    outer: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("pveclean"):
                        inner[module].add(alias.name if alias.name in known
                                          else f"{alias.name}.__init__")
                    else:
                        outer[module].add(alias.name.split(".")[0])
            elif node.level == 0 and node.module and not node.module.startswith("pveclean"):
                if node.module != "__future__":
                    outer[module].add(node.module.split(".")[0])
            else:
                inner[module].update(_resolve(node, module, known))
    return inner, outer


def _layer(module: str) -> str:
    for layer in sorted(MAY_IMPORT, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    raise AssertionError(f"{module} belongs to no layer: add it to MAY_IMPORT")


def test_every_module_belongs_to_a_layer_and_imports_only_what_it_may() -> None:
    inner, _outer = _graph()
    breaches = []
    for module, targets in inner.items():
        allowed = MAY_IMPORT[_layer(module)]
        for target in sorted(targets):
            if target != module and not any(target == a or target.startswith(a + ".")
                                            for a in allowed):
                breaches.append(f"{module} imports {target}")
    _settle(breaches)


def test_the_core_does_no_io_and_reads_no_clock() -> None:
    _inner, outer = _graph()
    breaches = [f"{m} imports {x}" for m, xs in outer.items() if _layer(m) == "pveclean.core"
                for x in sorted(xs & CORE_FORBIDDEN)]
    _settle(breaches)


def test_no_import_circle() -> None:
    inner, _outer = _graph()
    circles: set[tuple[str, ...]] = set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(inner.get(node, ())):
            if nxt in path:
                cyc = path[path.index(nxt):]
                i = cyc.index(min(cyc))
                circles.add(tuple(cyc[i:] + cyc[:i]))
            elif len(path) < 12:
                visit(nxt, [*path, nxt])

    for module in inner:
        visit(module, [module])
    assert not circles, "\n".join(" -> ".join([*c, c[0]]) for c in sorted(circles))


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: _module_name(p))
def test_each_module_is_small_and_says_what_it_is_for(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= MAX_LINES, f"{path.name}: {lines} lines (at most {MAX_LINES})"
    doc = ast.get_docstring(ast.parse(text))
    assert doc and len(doc.splitlines()[0]) > 20, f"{path.name}: no first docstring line"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
