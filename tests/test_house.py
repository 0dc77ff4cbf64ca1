"""The house's measures, read from the source with ast (nothing is imported): no function
of builder/ over 80 lines (read at once), and no helper program kept as Python source in a
string constant anywhere in src/wheelforge (ruff and mypy never see those): they are modules
of their own, run by their file paths (builder/compiling/_gate.py, _hookrun.py,
builder/artifact/_imports.py, _tagchild.py, builder/env/_probe.py; nvccsteps.py;
_watchdog.py, consume/_gpuprobe.py, consume/_stackimports.py)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "src" / "wheelforge"
BUILDER = PACKAGE / "builder"
MAX_LINES = 80


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} "
                                 f"({lines} lines)")
    return found


def is_program(text: str) -> bool:
    """A string that is Python source of a program: several lines that parse, with an
    import among its statements (a docstring's prose does not parse), or a template of
    one (lines that start with ``import`` and ``def``)."""
    if text.count("\n") < 2:
        return False
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return bool(re.search(r"^import \w", text, re.M) and re.search(r"^def \w", text, re.M))
    return len(tree.body) > 1 and any(isinstance(n, (ast.Import, ast.ImportFrom))
                                      for n in ast.walk(tree))


def programs_in_strings(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and is_program(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_builder_function_is_over_80_lines() -> None:
    assert long_functions(BUILDER) == []


def test_no_helper_program_is_a_string_constant() -> None:
    assert programs_in_strings(PACKAGE) == []


def test_the_measures_find_what_they_look_for(tmp_path: Path) -> None:
    """(the old build_one's shape, and the old gate as a string)"""
    body = "".join(f"    x = {i}\n" for i in range(81))
    (tmp_path / "m.py").write_text(
        f"def long():\n{body}\n\ndef short():\n    return 1\n\n"
        "GATE = '''\\\nimport os, sys\n\ndef forward(signum, frame):\n    pass\n'''\n"
        "DOC = '''A docstring: it names import sys and def f,\nbut it is prose,\nnot code.'''\n")
    assert long_functions(tmp_path) == ["m.py:1 long (82 lines)"]
    assert programs_in_strings(tmp_path) == ["m.py:88"]  # the GATE, not the DOC


def programs(root: Path) -> list[Path]:
    """The modules that are also programs (``if __name__ == "__main__"``)."""
    return sorted(path for path in root.rglob("*.py")
                  if '__name__ == "__main__"' in path.read_text())


def test_helper_programs_imported_as_modules_leave_sys_path_alone() -> None:
    """wheelforge imports its helper programs to find their paths: a program changes its own
    ``sys.path`` only when it runs as one (a fresh copy of each is executed here)."""
    found = programs(PACKAGE)
    assert {p.name for p in found} >= {"_watchdog.py", "_gpuprobe.py", "_stackimports.py",
                                       "_probe.py", "_imports.py", "_tagchild.py"}
    for path in found:
        name = ".".join(("wheelforge", *path.relative_to(PACKAGE).with_suffix("").parts))
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        before = list(sys.path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert sys.path == before, path.relative_to(PACKAGE)
