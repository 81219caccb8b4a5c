"""The imports of `tcpy/` follow the pipeline: no module imports a later stage, and no
modules import each other in a circle.

Every import counts: at the top of a module, deferred inside a function, and under
`if TYPE_CHECKING`; `from pkg import mod` imports `pkg.mod` when that is a module. The
stages, earliest first, are `LAYERS`; a module not named there is of the top layer
(targets, the engine, the tuner, the cache, the command line), which may import
anything below it but no other module of `tcpy` may import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TCPY = Path(__file__).resolve().parent.parent / "tcpy"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("tcpy.errors", "tcpy.types", "tcpy.knobs", "tcpy.log", "tcpy.naming",
              "tcpy.arrays")),
    ("front end", ("tcpy.parser", "tcpy.reference", "tcpy.inputs", "tcpy.autodiff")),
    ("options", ("tcpy.mapping.options",)),
    ("poly", ("tcpy.poly",)),
    ("mapping", ("tcpy.mapping",)),
    ("codegen", ("tcpy.codegen",)),
    ("runtime", ("tcpy.runtime",)),
)  # fmt: skip
"""The stages in pipeline order; a module is in the stage of its longest prefix here."""
TOP = len(LAYERS)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(TCPY.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in TCPY.rglob("*.py")}


def _resolved(name: str) -> str:
    """The module of `tcpy` that importing `name` loads last (its longest prefix that
    is a module)."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> Iterator[str]:
    """Every module of `tcpy` that `module` imports, wherever the import stands."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (_resolved(a.name) for a in node.names if a.name.split(".")[0] == "tcpy")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*above, *([base] if base else [])])
            if base.split(".")[0] != "tcpy":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield full if full in MODULES else _resolved(base)


GRAPH = {m: sorted(set(_imports(m)) - {m}) for m in MODULES}


def _layer(module: str) -> int:
    best, length = TOP, -1
    for k, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = k, len(prefix)
    return best


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    """The reader sees the imports it must judge (a reader that saw none would pass)."""
    assert "tcpy.parser.parse" in GRAPH["tcpy.parser.sema"]
    assert "tcpy.mapping.marks" in GRAPH["tcpy.codegen.printer"]
    assert len(MODULES) > 50


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert _circles() == []


def test_no_module_imports_a_later_stage() -> None:
    against = [
        f"{m} ({LAYERS[_layer(m)][0] if _layer(m) < TOP else 'top'}) imports {i} "
        f"({LAYERS[_layer(i)][0] if _layer(i) < TOP else 'top'})"
        for m, imported in GRAPH.items()
        for i in imported
        if _layer(i) > _layer(m)
    ]
    assert against == []


@pytest.mark.parametrize(
    "module, stage",
    [
        ("tcpy.errors", "base"),
        ("tcpy.parser.sema", "front end"),
        ("tcpy.mapping.options", "options"),
        ("tcpy.mapping.marks", "mapping"),
        ("tcpy.codegen.printer", "codegen"),
        ("tcpy.runtime.cpu", "runtime"),
    ],
)
def test_modules_are_in_their_stage(module: str, stage: str) -> None:
    assert LAYERS[_layer(module)][0] == stage


def test_functions_are_short() -> None:
    """No function over 60 lines in mapping and codegen, none over 80 anywhere in tcpy:
    a longer one is several steps that want names."""
    long = []
    for module, path in MODULES.items():
        limit = 60 if module.startswith(("tcpy.mapping", "tcpy.codegen")) else 80
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    long.append(f"{module}.{node.name}: {lines} lines (at most {limit})")
    assert not long, "\n".join(long)
