"""Patch 0005: causal-conv1d's backward kernels compiled as several translation units.

Static checks only (no nvcc): the series is applied to the real upstream sdist
and the split tree is compared with the tree just before 0005.  The split must
move code, never change it: the same explicit instantiations of the dispatchers
(each exactly once), every launcher moved out of a dispatcher's file declared
extern there and instantiated exactly once elsewhere, every new .cu file compiled
exactly once by the units setup.py generates (as many as MAX_JOBS can use), and
the kernel text byte-identical to upstream's.
"""

from __future__ import annotations

import ast
import glob
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, assert_units_stable, setup_py_function, tree_files
from wheelforge.builder.source.fetch import extract, fetch
from wheelforge.builder.source.patch import apply_series
from wheelforge.recipe.format import RecipeBook

BOOK = RecipeBook(REPO / "recipes", REPO / "patches")
SPLIT = REPO / "patches" / "causal-conv1d" / "0005-split-kernels-into-translation-units.patch"
HEADER = "csrc/causal_conv1d_bwd_kernels.cuh"
UNSPLIT_BWD = "csrc/causal_conv1d_bwd.cu"

# e.g. `template void causal_conv1d_bwd_cuda<at::Half, float>(ConvParamsBwd &params, ...);`
# (a launcher moved to another unit carries `__attribute__((visibility("hidden")))`
# after `template`)
HIDDEN = '__attribute__((visibility("hidden")))'
INSTANTIATION = re.compile(r"^template\s+(?:__attribute__\(\(visibility\(\"hidden\"\)\)\)\s+)?"
                           r"void\s+causal_conv1d\w*\s*<[^;]*>\s*\([^;]*\)\s*;", re.MULTILINE)
# e.g. `extern template void causal_conv1d_channellast_bwd_launch<128, 3, float, float>(...);`
EXTERN = re.compile(r"^extern\s+" + INSTANTIATION.pattern[1:], re.MULTILINE)
LAUNCH = "causal_conv1d_channellast_bwd_launch<"


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> dict[str, Path]:
    recipe = BOOK.load("causal-conv1d")
    series = list(recipe.patches)
    if SPLIT not in series:  # until the recipe lists it
        series.append(SPLIT)
    before = series[:series.index(SPLIT)]
    fetched = fetch(recipe, shared_cache)
    base = tmp_path_factory.mktemp("cc1d-split")
    unsplit = extract(fetched.archive, base / "unsplit")
    apply_series(unsplit, before, project="causal-conv1d")
    split = extract(fetched.archive, base / "split")
    apply_series(split, series, project="causal-conv1d")
    return {"unsplit": unsplit, "split": split}


def instantiations(tree: Path, pattern: re.Pattern[str] = INSTANTIATION) -> dict[str, list[str]]:
    """Every explicit instantiation (or, with EXTERN, every explicit instantiation
    declaration) in csrc/*.cu, whitespace-normalised, by file."""
    return {p.name: [" ".join(m.split()) for m in pattern.findall(p.read_text())]
            for p in sorted((tree / "csrc").glob("*.cu"))}


def pair(instantiation: str) -> str:
    """The dtype pair of an instantiation: `<at::Half, float>` of a dispatcher,
    `<128, 3, at::Half, float>` -> `at::Half, float` of a launcher."""
    args = instantiation[instantiation.index("<") + 1:instantiation.rindex(">")].split(",")
    return ",".join(args[-2:]).strip()


def new_units(trees: dict[str, Path]) -> list[Path]:
    old = {p.name for p in (trees["unsplit"] / "csrc").glob("*.cu")}
    return sorted(p for p in (trees["split"] / "csrc").glob("*.cu") if p.name not in old)


def setup_sources(tree: Path) -> list[ast.expr]:
    """The sources=[...] list of the CUDAExtension call in setup.py, as expressions."""
    found = []
    for node in ast.walk(ast.parse((tree / "setup.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CUDAExtension":
            for kw in node.keywords:
                if kw.arg == "sources":
                    assert isinstance(kw.value, ast.List), "sources is no longer a list"
                    found.append(kw.value.elts)
    assert len(found) == 1, f"expected one CUDAExtension(sources=[...]), found {len(found)}"
    return found[0]


def bwd_units_function(tree: Path) -> Callable[[], list[str]]:
    """setup.py's bwd_units(), compiled on its own (setup.py as a whole needs torch)."""
    return setup_py_function(tree, "bwd_units", glob=glob)


# MAX_JOBS -> backward units, from bwd_units()'s cost model (see its docstring)
EXPECTED_UNITS = {1: 1, 2: 2, 3: 3, 4: 4, 6: 5, 8: 7, 12: 9, 15: 12, 16: 14, 24: 20, 30: 20,
                  64: 20}


def test_same_instantiations_each_exactly_once(trees: dict[str, Path]) -> None:
    before = instantiations(trees["unsplit"])
    after = instantiations(trees["split"])
    assert len(before[Path(UNSPLIT_BWD).name]) == 18  # 9 dtype pairs x channel-first/last
    old = Counter(i for lines in before.values() for i in lines)
    new = Counter(i for lines in after.values() for i in lines if LAUNCH not in i)
    assert max(old.values()) == 1
    duplicated = {i: n for i, n in new.items() if n > 1}
    assert not duplicated, f"instantiated more than once: {duplicated}"
    assert set(new) == set(old), (f"missing: {sorted(set(old) - set(new))}; "
                                  f"added: {sorted(set(new) - set(old))}")
    assert UNSPLIT_BWD not in {f"csrc/{n}" for n in after}, "the unsplit file is still there"
    units = new_units(trees)
    assert len(units) >= 2
    assert all(after[u.name] for u in units), "a new unit instantiates nothing"


def test_moved_launchers_compiled_exactly_once(trees: dict[str, Path]) -> None:
    """A launcher that a dispatcher's unit declares extern (so does not compile) is
    explicitly instantiated, hidden, in exactly one other unit, and no launcher is
    explicitly instantiated unless its dispatcher's unit declares it extern (it would
    be compiled twice)."""
    after = instantiations(trees["split"])
    externs = instantiations(trees["split"], EXTERN)
    defined = Counter(i for lines in after.values() for i in lines if LAUNCH in i)
    declared = {i[len("extern "):]: unit for unit, lines in externs.items() for i in lines}
    assert declared, "no launcher is moved out of its dispatcher's unit"
    assert all(LAUNCH in i for i in declared), sorted(declared)
    assert set(defined) == set(declared), (
        f"defined, never extern: {set(defined) - set(declared)}; "
        f"extern, never defined: {set(declared) - set(defined)}")
    assert max(defined.values()) == 1, defined
    for launcher, unit in declared.items():
        # hidden: upstream inlines them and exports no symbol for them
        assert HIDDEN in launcher, launcher
        assert launcher not in after[unit]
        # declared extern where its own dispatcher is instantiated
        assert any("channellast_bwd_cuda<" in i and pair(i) == pair(launcher)
                   for i in after[unit]), f"{unit}: {launcher}"


def test_new_units_hold_only_instantiations(trees: dict[str, Path]) -> None:
    for unit in new_units(trees):
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", unit.read_text(), flags=re.DOTALL)
        code = EXTERN.sub("", code)
        code = INSTANTIATION.sub("", code)
        rest = [ln.strip() for ln in code.splitlines() if ln.strip()]
        assert rest == [f'#include "{Path(HEADER).name}"'], f"{unit.name}: {rest}"


def test_setup_lists_the_other_sources_as_before(trees: dict[str, Path]) -> None:
    old = [ast.literal_eval(e) for e in setup_sources(trees["unsplit"])]
    new = setup_sources(trees["split"])
    # the backward file replaced by the generated units, in the same place
    i = old.index(UNSPLIT_BWD)
    assert [ast.unparse(e) for e in new] == [
        *map(repr, old[:i]), "*bwd_units()", *map(repr, old[i + 1:])]


@pytest.mark.parametrize("jobs", sorted(EXPECTED_UNITS))
def test_bwd_units_include_every_part_once_in_order(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        jobs: int) -> None:
    """The units setup.py generates for MAX_JOBS=jobs: as many as the cost model
    says, each including kernel files in sorted order (a pair's _w2 file, which
    declares the _w3/_w4 launchers extern, before those files when they share a
    unit), none empty, together every file exactly once."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", str(jobs))
    units = bwd_units_function(trees["split"])()
    assert len(units) == EXPECTED_UNITS[jobs]
    # ninja starts the sources in sorted order: the binding unit, then these, longest
    # first, then the forward and update units
    assert all(u.startswith("csrc/causal_conv1d_bwd_units/unit_") for u in units), units
    assert units == sorted(units)
    order = sorted(["csrc/causal_conv1d.cpp", "csrc/causal_conv1d_fwd.cu",
                    "csrc/causal_conv1d_update.cu", *units])
    assert order == ["csrc/causal_conv1d.cpp", *units, "csrc/causal_conv1d_fwd.cu",
                     "csrc/causal_conv1d_update.cu"]
    parts = sorted(u.name for u in new_units(trees))
    assert len(parts) == 27  # 9 dtype pairs x channel-last widths 2, 3, 4
    runs = []
    for unit in units:
        lines = [ln for ln in (tmp_path / unit).read_text().splitlines()
                 if not ln.startswith("//")]
        assert lines and all(ln.startswith('#include "') for ln in lines), lines
        run = [ln.split('"')[1] for ln in lines]
        assert run == sorted(run)
        runs.append(run)
    assert sorted(name for run in runs for name in run) == parts  # every file exactly once


def test_bwd_units_spread_the_heavy_files(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """16 jobs: 14 units of at most two files, the costliest (_w2 of a 16-bit input,
    ~2x a float input's) never two in one unit, and the heaviest units first (ninja
    starts them first), by the costs bwd_units()'s docstring gives."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", "16")
    runs = [[ln.split('"')[1] for ln in (tmp_path / u).read_text().splitlines()
             if ln.startswith("#include")] for u in bwd_units_function(trees["split"])()]
    assert len(runs) == 14
    assert max(map(len, runs)) == 2
    heavy = [sum(1 for f in run if f.endswith("_w2.cu") and "_bwd_fp32_" not in f)
             for run in runs]
    assert sum(heavy) == 6 and max(heavy) == 1

    def cost(name: str) -> int:  # CPU-s beyond the headers: causal_conv1d_bwd_<in>_<wt>_w<k>
        width = int(name[-len("2.cu")])
        return ({2: 9, 3: 9, 4: 10} if "_bwd_fp32_" in name else {2: 18, 3: 13, 4: 16})[width]

    loads = [sum(map(cost, run)) for run in runs]
    assert loads == sorted(loads, reverse=True)


def test_bwd_units_override(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", "16")
    monkeypatch.setenv("CAUSAL_CONV1D_BWD_UNITS", "27")
    assert len(bwd_units_function(trees["split"])()) == 27
    for bad in ("0", "28", "many"):
        monkeypatch.setenv("CAUSAL_CONV1D_BWD_UNITS", bad)
        with pytest.raises(RuntimeError, match="CAUSAL_CONV1D_BWD_UNITS"):
            bwd_units_function(trees["split"])()


def test_bwd_units_rewritten_only_when_changed(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run of setup.py (pip runs it twice) leaves the units as they are, so
    ninja does not compile them again; MAX_JOBS unset means one job per usable core."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.delenv("WHEELFORGE_UNIT_JOBS", raising=False)
    assert_units_stable(bwd_units_function(trees["split"]), tmp_path, EXPECTED_UNITS)


def test_the_builders_unit_jobs_win_over_max_jobs(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wheelforge sets WHEELFORGE_UNIT_JOBS to the jobs the user chose, else the cores; its
    automatic MAX_JOBS (memory, an earlier build's recorded peak) sizes no unit: the same
    units, hence the same bytes, whatever the machine's history."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CAUSAL_CONV1D_BWD_UNITS", raising=False)
    monkeypatch.setenv("WHEELFORGE_UNIT_JOBS", "16")
    for jobs in ("1", "2", "16"):
        monkeypatch.setenv("MAX_JOBS", jobs)
        assert len(bwd_units_function(trees["split"])()) == EXPECTED_UNITS[16]


def test_kernel_code_byte_identical(trees: dict[str, Path]) -> None:
    upstream = (trees["unsplit"] / UNSPLIT_BWD).read_text()
    first = INSTANTIATION.search(upstream)
    assert first is not None
    body, tail = upstream[:first.start()].rstrip("\n") + "\n", upstream[first.start():]
    # what was cut from upstream is the instantiations and blank lines, nothing else
    assert INSTANTIATION.sub("", tail).strip() == ""
    header = (trees["split"] / HEADER).read_text()
    prelude, sep, rest = header.partition("#pragma once\n\n")
    assert sep, "the header has no #pragma once"
    assert all(ln.startswith("//") for ln in prelude.splitlines()), prelude
    assert rest == body, "the kernel code in the header differs from upstream"


def test_other_files_untouched(trees: dict[str, Path]) -> None:
    old, new = tree_files(trees["unsplit"]), tree_files(trees["split"])
    changed = {n for n in old.keys() & new.keys() if old[n] != new[n]}
    assert changed == {"setup.py"}
    assert set(old) - set(new) == {UNSPLIT_BWD}
    assert set(new) - set(old) == {HEADER} | {f"csrc/{u.name}" for u in new_units(trees)}


def test_binding_unit_without_debug_info(trees: dict[str, Path]) -> None:
    """Patch 0006: -g0 for C++ sources (the binding unit) in the CUDA build, after the
    interpreter's CFLAGS (-g); nvcc's flags untouched."""
    def cxx_flags(tree: Path) -> list[list[str]]:
        found = []
        for node in ast.walk(ast.parse((tree / "setup.py").read_text())):
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                if "cxx" in keys:
                    found.append(ast.literal_eval(node.values[keys.index("cxx")]))
        return found
    before, after = cxx_flags(trees["unsplit"]), cxx_flags(trees["split"])
    assert len(before) == len(after) == 2  # ROCm and CUDA branches
    assert after[0] == before[0]  # ROCm: as it was
    assert after[1] == [*before[1], "-g0"]


def test_every_fatbin_compressed(trees: dict[str, Path]) -> None:
    """Patch 0007: setup.py passes fatbinary one flag, -compress-all, where upstream
    passed none (the small units' SASS is otherwise stored raw)."""
    def fatbin_flags(tree: Path) -> list[str]:
        return re.findall(r'"(-Xfatbin[^"]*)"', (tree / "setup.py").read_text())
    assert fatbin_flags(trees["unsplit"]) == []
    assert fatbin_flags(trees["split"]) == ["-Xfatbin=-compress-all"]
