"""The code's shape, measured the way anyone could with grep: packages import one way
(cli -> deployments -> flows -> tasks -> storage -> focus), no two modules import each
other round a cycle, no module over 600 lines and no function over 80, and the
pipeline's collection path stays small with one loop.

Known exceptions are listed with the reason they exist; each must still be an
exception (so a fix removes it from the list) and the list may only shrink.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Lowest first: a package may import those before it, never those after it.
LAYERS = ("focus", "storage", "tasks", "flows", "deployments", "cli")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: Modules over the limit, and why they still are (the list may only shrink).
LONG_MODULES = {}
#: Functions over the limit, and why they still are (the list may only shrink).
LONG_FUNCTIONS = {}
#: The pipeline's collection path, between the command line and the collector: the
#: two ways in (direct, flow), the one collection function and its journal. The
#: observers of a collection (progress, the Prefect artifacts) and the lifecycles
#: around it (preflight, services) are not on it.
COLLECTION_PATH = ("flows/direct.py", "flows/collect.py", "tasks/collect.py", "tasks/journal.py")
MAX_COLLECTION_PATH_LINES = 450


def modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test) if test is not None else False


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per process for every check that reads it."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imports(path: Path, *, runtime_only: bool = False) -> Iterator[tuple[str, int]]:
    """Every module an import statement in ``path`` names, at any depth (a lazy import
    is a dependency too); ``runtime_only`` leaves out ``if TYPE_CHECKING:`` blocks."""
    yield from _imports(path, runtime_only)


@functools.cache
def _imports(path: Path, runtime_only: bool) -> tuple[tuple[str, int], ...]:
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])

    def walk(node: ast.AST) -> Iterator[tuple[str, int]]:
        if runtime_only and _type_checking(node):
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno
        for child in ast.iter_child_nodes(node):
            yield from walk(child)

    return tuple(walk(parsed(path)))


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module ``name`` is, or is inside of (``None``: not ours)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def graph(*, runtime_only: bool) -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        for name, _ in imports(path, runtime_only=runtime_only):
            target = resolve(name, known)
            if target is not None and target != mod and not mod.startswith(target + "."):
                edges[mod].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_packages_import_one_way():
    known = modules()
    bad = []
    for mod, path in known.items():
        layer = LAYERS.index(mod.split(".")[0])
        for name, line in imports(path):
            top = name.split(".")[0]
            if top in LAYERS and LAYERS.index(top) > layer:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not bad, "a package imports one above it:\n" + "\n".join(bad)


def test_no_import_cycles_between_modules():
    found = cycles(graph(runtime_only=True))
    assert not found, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def long_modules() -> dict[str, int]:
    return {
        str(p.relative_to(ROOT)): n
        for p in modules().values()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }


def long_functions() -> dict[str, int]:
    out = {}
    for path in modules().values():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out[f"{path.relative_to(ROOT)}:{node.name}"] = n
    return out


def test_no_module_over_600_lines():
    found = long_modules()
    assert set(found) <= set(LONG_MODULES), f"modules over {MAX_MODULE_LINES} lines: {found}"
    assert set(LONG_MODULES) <= set(found), (
        f"no longer over the limit (take them off the list): {set(LONG_MODULES) - set(found)}"
    )


def test_no_function_over_80_lines():
    found = long_functions()
    assert set(found) <= set(LONG_FUNCTIONS), f"functions over {MAX_FUNCTION_LINES} lines: {found}"
    assert set(LONG_FUNCTIONS) <= set(found), (
        f"no longer over the limit (take them off the list): {set(LONG_FUNCTIONS) - set(found)}"
    )


def test_the_collection_path_is_small_and_has_one_loop():
    lines = {p: len((ROOT / p).read_text(encoding="utf-8").splitlines()) for p in COLLECTION_PATH}
    assert sum(lines.values()) <= MAX_COLLECTION_PATH_LINES, lines
    # the phase and wave loops are the collector's: the path calls Collector.search, once
    calls = [p for p in COLLECTION_PATH if "collector.search(" in (ROOT / p).read_text(encoding="utf-8")]
    assert calls == ["tasks/collect.py"], calls
    for p in COLLECTION_PATH:
        tree = ast.parse((ROOT / p).read_text(encoding="utf-8"))
        loops = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.For | ast.AsyncFor | ast.While)]
        waves = [ln for ln in loops if "wave" in (ROOT / p).read_text(encoding="utf-8").splitlines()[ln - 1]]
        assert not waves, f"{p} loops over waves at lines {waves}"
