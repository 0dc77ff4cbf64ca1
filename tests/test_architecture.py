"""The house keeps its shape: no import cycle between modules of src/wheelforge, no import
from a lower layer up to a higher one, and no import inside a function outside the command
line (whose commands import their packages when they run, to keep `--help` fast).
docs/architecture.md names every module and draws builder/'s rooms in the layers' order.

Read from the source with ast (nothing is imported), module-level and function-level imports
alike, so an import moved into a function to dodge a cycle is still an arrow here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

SRC = REPO / "src"
PACKAGE = SRC / "wheelforge"
DOC = REPO / "docs" / "architecture.md"

#: Bottom to top. A module may import its own layer and the layers below it, never above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("wheelforge", "wheelforge.errors", "wheelforge._proc", "wheelforge._fs",
     "wheelforge._log", "wheelforge._yaml", "wheelforge.arch", "wheelforge.wheel",
     "wheelforge.workdirs"),
    ("wheelforge.recipe",),
    ("wheelforge.index",),
    # builder/ in rooms: the source and the build environment, compiling, the settings,
    # the artifact's checks, the machine's checks, then the pipeline over them all
    ("wheelforge.builder.source", "wheelforge.builder.env"),
    ("wheelforge.builder.compiling",),
    ("wheelforge.builder.config",),
    ("wheelforge.builder.artifact",),
    ("wheelforge.builder.checks",),
    ("wheelforge.builder",),
    ("wheelforge.consume", "wheelforge.maintain"),  # the nightly checks the stack
    ("wheelforge.nightly",),
    ("wheelforge.cli", "wheelforge.__main__"),
)
#: Packages of one layer that must not import each other.
SIBLINGS: set[tuple[str, str]] = {("wheelforge.consume", "wheelforge.maintain"),
                                   ("wheelforge.builder.source", "wheelforge.builder.env")}
LAZY_IMPORTS_ALLOWED = ("wheelforge.cli",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every wheelforge import of ``path``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                if source.split(".")[0] != "wheelforge":
                    continue
                for alias in child.names:  # `from . import index` imports a module
                    target = f"{source}.{alias.name}"
                    found.append((target if target in known else source, child.lineno,
                                  in_function))
            elif isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names
                             if a.name.split(".")[0] == "wheelforge")
            visit(child, nested)

    visit(tree, False)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: {t for t, _, _ in imports(p, known) if t != m} for m, p in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def layer_of(module: str) -> tuple[int, str]:
    best: tuple[int, str] | None = None
    for level, names in enumerate(LAYERS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and (
                    best is None or len(n) > len(best[1])):
                best = (level, n)
    assert best is not None, f"{module} is in no layer of this test: add it to LAYERS"
    return best


def test_every_module_has_a_layer() -> None:
    for m in modules():
        layer_of(m)


def test_no_import_cycle_between_modules() -> None:
    assert cycles(graph()) == []


def test_no_import_runs_up_a_layer_or_across_siblings() -> None:
    wrong = []
    for m, targets in graph().items():
        (mine, my_pkg) = layer_of(m)
        for t in targets:
            (theirs, their_pkg) = layer_of(t)
            if theirs > mine:
                wrong.append(f"{m} -> {t} (layer {mine} imports layer {theirs})")
            elif (my_pkg, their_pkg) in SIBLINGS or (their_pkg, my_pkg) in SIBLINGS:
                wrong.append(f"{m} -> {t} (sibling packages)")
    assert wrong == []


def test_no_function_level_import_outside_the_command_line() -> None:
    known = set(modules())
    lazy = [f"{m}:{line} imports {t}" for m, p in modules().items()
            if not m.startswith(LAZY_IMPORTS_ALLOWED)
            for t, line, inside in imports(p, known) if inside]
    assert lazy == []


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]],
                                       expected: list[list[str]]) -> None:
    assert cycles(edges) == expected


def test_the_reader_sees_a_function_level_import(tmp_path: Path) -> None:
    """The checks above would pass vacuously if function-level imports were not read."""
    known = set(modules())
    path = PACKAGE / "nightly" / "rayexec.py"
    assert any(t == "wheelforge.nightly.fanout" for t, _, _ in imports(path, known))
    cli_main = PACKAGE / "cli" / "main.py"
    assert any(inside for _, _, inside in imports(cli_main, known))


def unnamed_modules(doc: str) -> list[str]:
    """The modules of src/wheelforge (``__init__`` left out) that ``doc`` does not name by
    their paths under src/wheelforge (``builder/compiling/jobserver.py``, ``wheel.py``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name != "__init__.py" and not re.search(
                r"(?<![\w/.])" + re.escape(rel) + r"(?!\w)", doc):
            found.append(rel)
    return found


def test_architecture_md_names_every_module() -> None:
    assert unnamed_modules(DOC.read_text(encoding="utf-8")) == []


def test_the_naming_check_wants_the_whole_path() -> None:
    named = unnamed_modules("`builder/compiling/jobserver.py` and `store.py`")
    assert "builder/compiling/jobserver.py" not in named
    assert "index/store.py" in named and "wheel.py" in named


def test_architecture_md_draws_builder_rooms_in_the_layers_order() -> None:
    """The layer diagram's indented lines (builder/'s rooms, top to bottom) go down the
    layers of LAYERS, and draw every one of builder/'s."""
    diagram = DOC.read_text(encoding="utf-8").split("```")[1]
    drawn = []
    for line in diagram.splitlines():
        if line.startswith("  "):
            rooms = [w for w in line.split() if w.endswith(("/", ".py"))]
            levels = {layer_of("wheelforge.builder." + w.rstrip("/").removesuffix(".py"))[0]
                      for w in rooms}
            assert len(levels) == 1, line
            drawn.append(levels.pop())
    assert drawn == sorted(drawn, reverse=True)
    assert set(drawn) == {i for i, names in enumerate(LAYERS)
                          if any(n.startswith("wheelforge.builder") for n in names)}
