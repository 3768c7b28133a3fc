"""The typing counts of issue 36, read from pveclean's own AST: `python -m tests.typing_counts`.

Prints what the issue's closing note asks for (`dict[str, Any]` and `Any` occurrences, the
functions over 60 lines, the parameters of the largest functions) and the text calls that
tests/unit/test_typing_rules.py limits. That test checks the same scan against its tables;
nothing here imports pveclean, so a module that does not import still counts.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "pveclean"

# `X[str, Any]` for these X is a "dict[str, Any]" (typing's and collections.abc's spellings too).
MAPPINGS = frozenset({"dict", "Dict", "Mapping", "MutableMapping"})
# the calls that take text apart; rule 2 allows them only in the parsers of outside text
TEXT_METHODS = frozenset({"startswith", "removeprefix", "removesuffix", "split", "rsplit",
                          "partition", "rpartition"})
# the limits, for the report (tests/unit/test_typing_rules.py holds the ones it checks)
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 7


@dataclass(frozen=True)
class Site:
    """One occurrence: module ("core.report"), place (its def/class, dotted, or "<module>")."""

    module: str
    place: str
    line: int
    what: str = ""

    @property
    def key(self) -> str:
        return f"{self.module}:{self.place}"

    @property
    def where(self) -> str:
        return f"{module_path(self.module)}:{self.line}"


@dataclass(frozen=True)
class Function:
    """A def: its length in lines (def line to last line) and parameters (self/cls aside)."""

    site: Site
    lines: int
    params: int
    is_command: bool  # a typer command of commands/cli.py: each option is a parameter


@dataclass
class Scan:
    """What the rules look at, for one module or all of pveclean."""

    dict_any: list[Site] = field(default_factory=list)
    dict_any_params: list[Site] = field(default_factory=list)  # what: the parameter's name
    any_uses: list[Site] = field(default_factory=list)
    text_calls: list[Site] = field(default_factory=list)  # what: the method's name
    functions: list[Function] = field(default_factory=list)
    places: set[str] = field(default_factory=set)  # every module, class and def, as "m:place"

    def add(self, other: Scan) -> None:
        self.dict_any += other.dict_any
        self.dict_any_params += other.dict_any_params
        self.any_uses += other.any_uses
        self.text_calls += other.text_calls
        self.functions += other.functions
        self.places |= other.places


def module_path(module: str) -> str:
    return f"pveclean/{module.replace('.', '/')}.py"


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any")


def _is_dict_any(node: ast.AST) -> bool:
    if not isinstance(node, ast.Subscript):
        return False
    base = node.value
    name = base.id if isinstance(base, ast.Name) else (
        base.attr if isinstance(base, ast.Attribute) else "")
    args = node.slice
    return (name in MAPPINGS and isinstance(args, ast.Tuple) and len(args.elts) == 2
            and isinstance(args.elts[0], ast.Name) and args.elts[0].id == "str"
            and _is_any(args.elts[1]))


def _quoted(annotation: ast.expr | None) -> Iterator[ast.AST]:
    """The nodes of the string annotations inside an annotation ("dict[str, Any]" in quotes)."""
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                yield from ast.walk(ast.parse(node.value, mode="eval"))
            except SyntaxError:
                continue


def _all_nodes(annotation: ast.expr | None) -> Iterator[ast.AST]:
    if annotation is not None:
        yield from ast.walk(annotation)
        yield from _quoted(annotation)


def _module_chain(node: ast.expr, modules: frozenset[str]) -> bool:
    """`shlex`, `os.path`: a receiver that is an imported module, not text."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in modules


def _command_names(tree: ast.Module) -> set[str]:
    """Functions registered as typer commands by a call: `app.command(...)(fn)`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Call) \
                and _is_command_decorator(node.func):
            names.update(a.id for a in node.args if isinstance(a, ast.Name))
    return names


def _is_command_decorator(node: ast.expr) -> bool:
    """`@command()`, `@app.command(...)`, `@app.callback()` (typer's command registrations)."""
    func = node.func if isinstance(node, ast.Call) else node
    return (isinstance(func, ast.Name) and func.id == "command") or (
        isinstance(func, ast.Attribute) and func.attr in ("command", "callback"))


class _Scanner(ast.NodeVisitor):
    def __init__(self, module: str, tree: ast.Module) -> None:
        self.module = module
        self.scan = Scan(places={f"{module}:<module>"})
        self.stack: list[str] = []
        self.in_class: list[bool] = []
        self.modules = frozenset(
            (alias.asname or alias.name).split(".")[0]
            for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names)
        self.commands = _command_names(tree) if module == "commands.cli" else set()

    def site(self, line: int, what: str = "") -> Site:
        return Site(self.module, ".".join(self.stack) or "<module>", line, what)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.scan.places.add(self.site(node.lineno).key)
        self.in_class.append(True)
        self.generic_visit(node)
        self.stack.pop()
        self.in_class.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        method = bool(self.in_class and self.in_class[-1])
        self.stack.append(node.name)
        self.scan.places.add(self.site(node.lineno).key)
        self.in_class.append(False)
        args = node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs,
                  *([args.vararg] if args.vararg else []), *([args.kwarg] if args.kwarg else [])]
        counted = params[1:] if method and params and params[0].arg in ("self", "cls") \
            else params
        is_command = self.module == "commands.cli" and (
            node.name in self.commands or any(map(_is_command_decorator, node.decorator_list)))
        self.scan.functions.append(Function(
            self.site(node.lineno), (node.end_lineno or node.lineno) - node.lineno + 1,
            len(counted), is_command))
        for arg in params:
            if any(_is_dict_any(n) for n in _all_nodes(arg.annotation)):
                self.scan.dict_any_params.append(self.site(arg.lineno, arg.arg))
        for annotation in [*(a.annotation for a in params), node.returns]:
            self._quoted_annotation(annotation)
        self.generic_visit(node)
        self.stack.pop()
        self.in_class.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._quoted_annotation(node.annotation)
        self.generic_visit(node)

    def _quoted_annotation(self, annotation: ast.expr | None) -> None:
        line = annotation.lineno if annotation is not None else 0
        for n in _quoted(annotation):
            self._count(n, line)

    def _count(self, node: ast.AST, line: int) -> None:
        if _is_dict_any(node):
            self.scan.dict_any.append(self.site(line))
        if _is_any(node):
            self.scan.any_uses.append(self.site(line))

    def visit_Name(self, node: ast.Name) -> None:
        self._count(node, node.lineno)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._count(node, node.lineno)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._count(node, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in TEXT_METHODS \
                and not _module_chain(func.value, self.modules):
            self.scan.text_calls.append(self.site(node.lineno, func.attr))
        self.generic_visit(node)


def scan_source(module: str, source: str) -> Scan:
    """The scan of one module's source (`module` is its name under pveclean: "core.report")."""
    tree = ast.parse(source)
    scanner = _Scanner(module, tree)
    scanner.visit(tree)
    return scanner.scan


def modules() -> dict[str, Path]:
    """pveclean's modules by name under the package ("cleanup", "core.report", "core.__init__")."""
    return {".".join(p.relative_to(PKG).with_suffix("").parts): p
            for p in sorted(PKG.rglob("*.py"))}


def scan_pveclean() -> Scan:
    total = Scan()
    for module, path in modules().items():
        total.add(scan_source(module, path.read_text(encoding="utf-8")))
    return total


def _text_count(pattern: str) -> int:
    return sum(len(re.findall(pattern, p.read_text(encoding="utf-8")))
               for p in modules().values())


def _summary(scan: Scan) -> list[str]:
    funcs = scan.functions
    long = [f for f in funcs if f.lines > MAX_FUNCTION_LINES]
    wide = [f for f in funcs if f.params > MAX_PARAMETERS]
    calls = Counter(s.what for s in scan.text_calls)
    as_text = [_text_count(r"dict\[str, Any\]"), _text_count(r"\bAny\b")]
    return [f"dict[str, Any] occurrences: {len(scan.dict_any)}"
            f" (as parameters: {len(scan.dict_any_params)})",
            f"Any occurrences: {len(scan.any_uses)}",
            f"as text, as the issue counted them (imports, docstrings): {as_text[0]}"
            f" 'dict[str, Any]', {as_text[1]} 'Any'",
            f"functions: {len(funcs)}; over {MAX_FUNCTION_LINES} lines: {len(long)}; over"
            f" {MAX_PARAMETERS} parameters: {len(wide)}"
            f" ({sum(not f.is_command for f in wide)} of them not typer commands)",
            f"text calls ({', '.join(sorted(TEXT_METHODS))}): {len(scan.text_calls)} ("
            + ", ".join(f"{m} {n}" for m, n in calls.most_common()) + ")"]


def _details(scan: Scan) -> list[str]:
    funcs = scan.functions
    long = sorted((f for f in funcs if f.lines > MAX_FUNCTION_LINES), key=lambda f: -f.lines)
    out = [f"\nfunctions over {MAX_FUNCTION_LINES} lines:"]
    out += [f"  {f.lines:4} lines {f.params:3} params  {f.site.key}" for f in long]
    largest = sorted(funcs, key=lambda f: (-f.lines, f.site.key))[:10]
    out.append("\nthe 10 largest functions (lines, parameters):")
    out += [f"  {f.lines:4} lines {f.params:3} params  {f.site.key}" for f in largest]
    widest = sorted(funcs, key=lambda f: (-f.params, f.site.key))[:10]
    out.append("\nthe 10 functions with the most parameters (typer commands marked *):")
    out += [f"  {f.params:3} params {f.lines:4} lines  {f.site.key}{' *' if f.is_command else ''}"
            for f in widest]
    return out


def main(argv: list[str]) -> int:
    """`--summary`: the count lines only (what `make lint` prints)."""
    scan = scan_pveclean()
    out = [f"pveclean/: {len(modules())} modules", *_summary(scan)]
    if "--summary" not in argv:
        out += _details(scan)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
