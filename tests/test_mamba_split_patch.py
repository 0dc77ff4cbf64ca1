"""Patch 0008: mamba-ssm's selective-scan kernels compiled as units sized by MAX_JOBS.

Static checks only (no nvcc): the series is applied to the pinned commit (from the
offline bundle, as a build fetches it) and the split tree is compared with the tree
just before 0008.  The split must move instantiations, never code: the same explicit
instantiations of the 9 dispatchers (each exactly once), every launcher declared extern
(and hidden) in its dispatcher's file and explicitly instantiated exactly once in a file
of its own, the kernel headers untouched, and every file compiled exactly once by the
units setup.py generates (as many as MAX_JOBS can use).  That the built extension is the
same (exported symbols, every kernel's SASS) is scripts/compare-wheels.py's job on real
builds (bench/build_speed.py --recipe mamba-ssm --keep).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, assert_units_stable, setup_py_function, tree_files
from test_mamba_ssm_patches import MAMBA_URL, mirror
from wheelforge.builder.source.fetch import extract, fetch
from wheelforge.builder.source.patch import apply_series
from wheelforge.recipe.format import RecipeBook

BOOK = RecipeBook(REPO / "recipes", REPO / "patches")
SPLIT = "0008-split-kernels-into-translation-units.patch"
SRC = "csrc/selective_scan"
CONFIGS = [(32, 4), (32, 8), (32, 16), (64, 16), (128, 16)]  # upstream's, for CUDA
DISPATCHERS = [f"selective_scan_fwd_{t}.cu" for t in ("fp32", "fp16", "bf16")] + [
    f"selective_scan_bwd_{t}_{w}.cu" for t in ("fp32", "fp16", "bf16")
    for w in ("real", "complex")]
HIDDEN = '__attribute__((visibility("hidden")))'
# `template void selective_scan_bwd_cuda<at::Half, float>(SSMParamsBwd &params, ...);`, or
# a launcher's `template __attribute__((visibility("hidden"))) void
# selective_scan_fwd_launch<32, 4, float, complex_t>(SSMParamsBase &params, ...);`
INSTANTIATION = re.compile(r"^template\s+(?:__attribute__\(\(visibility\(\"hidden\"\)\)\)\s+)?"
                           r"void\s+selective_scan_\w+\s*<[^;]*>\s*\([^;]*\)\s*;", re.MULTILINE)
EXTERN = re.compile(r"^extern\s+" + INSTANTIATION.pattern[1:], re.MULTILINE)

# MAX_JOBS -> units, from selective_scan_units()'s cost model (see its docstring)
EXPECTED_UNITS = {1: 8, 2: 8, 4: 11, 8: 13, 12: 11, 16: 15, 32: 27, 64: 27}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipe = BOOK.load("mamba-ssm")
    names = [p.name for p in recipe.patches]
    assert SPLIT in names, "the recipe does not apply the split"
    before = list(recipe.patches[:names.index(SPLIT)])
    fetched = fetch(recipe, tmp_path_factory.mktemp("cache"),
                    git_mirrors={MAMBA_URL: mirror()})
    base = tmp_path_factory.mktemp("mamba-split")
    unsplit = extract(fetched.archive, base / "unsplit")
    apply_series(unsplit, before, project="mamba-ssm")
    split = extract(fetched.archive, base / "split")
    apply_series(split, recipe.patches[:names.index(SPLIT) + 1], project="mamba-ssm")
    return {"unsplit": unsplit, "split": split}


def instantiations(tree: Path, pattern: re.Pattern[str] = INSTANTIATION) -> dict[str, list[str]]:
    """Every explicit instantiation (with EXTERN: declaration) in the .cu files, by file,
    whitespace-normalised."""
    return {p.name: [" ".join(m.split()) for m in pattern.findall(p.read_text())]
            for p in sorted((tree / SRC).glob("*.cu"))}


def launchers() -> list[tuple[str, str, str, str, tuple[int, int]]]:
    """(file, kind, input type, weight type, config) of every launcher file."""
    types = {"fp32": "float", "fp16": "at::Half", "bf16": "at::BFloat16"}
    weights = {"real": "float", "complex": "complex_t"}
    return [(f"selective_scan_{kind}_{t}_{w}_{c[0]}x{c[1]}.cu", kind, types[t], weights[w], c)
            for kind in ("fwd", "bwd") for t in types for w in weights for c in CONFIGS]


def units_function(tree: Path, hip: bool = False) -> Callable[[], list[str]]:
    """setup.py's selective_scan_units(), compiled on its own (setup.py needs torch)."""
    return setup_py_function(tree, "selective_scan_units", HIP_BUILD=hip)


def included(unit: Path) -> list[str]:
    lines = [ln for ln in unit.read_text().splitlines() if not ln.startswith("//")]
    assert lines and all(ln.startswith('#include "') for ln in lines), lines
    return [ln.split('"')[1] for ln in lines]


def test_upstream_compiles_every_configuration_in_the_dispatchers_unit(
        trees: dict[str, Path]) -> None:
    """The failure the split fixes: upstream's 9 units each instantiate a dispatcher,
    which compiles all 5 launch configurations x 16 or 32 kernels in one nvcc."""
    before = instantiations(trees["unsplit"])
    assert sorted(before) == sorted(DISPATCHERS)
    assert all(len(before[f]) == (2 if "_fwd_" in f else 1) for f in DISPATCHERS)
    assert not any(EXTERN.findall((trees["unsplit"] / SRC / f).read_text())
                   for f in DISPATCHERS)


def test_same_dispatchers_each_exactly_once(trees: dict[str, Path]) -> None:
    before = instantiations(trees["unsplit"])
    after = instantiations(trees["split"])
    old = Counter(i for lines in before.values() for i in lines)
    new = Counter(i for lines in after.values() for i in lines if "_launch<" not in i)
    assert len(old) == 12 and max(old.values()) == 1  # 3 inputs x 2 weights, fwd and bwd
    assert new == old
    for f in DISPATCHERS:  # where they were
        assert [i for i in after[f] if "_launch<" not in i] == before[f]


def test_every_launcher_extern_in_its_dispatcher_and_compiled_once(
        trees: dict[str, Path]) -> None:
    after = instantiations(trees["split"])
    externs = instantiations(trees["split"], EXTERN)
    defined = Counter(i for lines in after.values() for i in lines if "_launch<" in i)
    assert len(defined) == 60 and max(defined.values()) == 1
    for name, kind, inp, weight, (threads, items) in launchers():
        params = "SSMParamsBwd" if kind == "bwd" else "SSMParamsBase"
        text = (f"template {HIDDEN} void selective_scan_{kind}_launch<{threads}, {items}, "
                f"{inp}, {weight}>({params} &params, cudaStream_t stream);")
        assert after[name] == [text], name
        dtype = name.split("_")[3]
        dispatcher = (f"selective_scan_fwd_{dtype}.cu" if kind == "fwd"
                      else f"selective_scan_bwd_{dtype}_{name.split('_')[4]}.cu")
        assert externs[dispatcher].count("extern " + text) == 1, (dispatcher, text)
    declared = [i for lines in externs.values() for i in lines]
    assert len(declared) == 60 and all(i[len("extern "):] in defined for i in declared)
    # nothing but dispatchers declares a launcher extern
    assert {f for f, lines in externs.items() if lines} == set(DISPATCHERS)


def test_new_files_hold_only_one_instantiation_each(trees: dict[str, Path]) -> None:
    for name, kind, *_ in launchers():
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", (trees["split"] / SRC / name).read_text(),
                      flags=re.DOTALL)
        code = INSTANTIATION.sub("", code)
        rest = [ln.strip() for ln in code.splitlines() if ln.strip()]
        # ROCm builds keep upstream's (other) configurations in the dispatchers
        assert rest == [f'#include "selective_scan_{kind}_kernel.cuh"', "#ifndef USE_ROCM",
                        "#endif"], f"{name}: {rest}"


def test_dispatchers_changed_by_the_extern_block_alone(trees: dict[str, Path]) -> None:
    for f in DISPATCHERS:
        old = (trees["unsplit"] / SRC / f).read_text()
        new = (trees["split"] / SRC / f).read_text()
        block = re.search(r"\n// wheelforge:[^\n]*\n(?://[^\n]*\n)*#ifndef USE_ROCM\n"
                          r"(?:extern template [^\n]*\n)+#endif\n", new)
        assert block, f
        assert new[:block.start()] + new[block.end():] == old, f


def test_other_files_untouched(trees: dict[str, Path]) -> None:
    old, new = tree_files(trees["unsplit"]), tree_files(trees["split"])
    changed = {n for n in old.keys() & new.keys() if old[n] != new[n]}
    assert changed == {"setup.py"} | {f"{SRC}/{f}" for f in DISPATCHERS}
    assert set(old) - set(new) == set()
    assert set(new) - set(old) == {f"{SRC}/{name}" for name, *_ in launchers()}


def test_setup_lists_the_binding_unit_then_the_units(trees: dict[str, Path]) -> None:
    def sources(tree: Path) -> list[str]:
        for node in ast.walk(ast.parse((tree / "setup.py").read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CUDAExtension":
                (kw,) = [k for k in node.keywords if k.arg == "sources"]
                assert isinstance(kw.value, ast.List)
                return [ast.unparse(e) for e in kw.value.elts]
        raise AssertionError("no CUDAExtension")
    old = sources(trees["unsplit"])
    upstream = [ast.literal_eval(e) for e in old[1:]]
    assert sorted(upstream) == sorted(f"{SRC}/{f}" for f in DISPATCHERS)
    assert sources(trees["split"]) == [old[0], "*selective_scan_units()"]
    # a HIP build (hipify rewrites what it is given) keeps upstream's layout
    assert units_function(trees["split"], hip=True)() == upstream


@pytest.mark.parametrize("jobs", sorted(EXPECTED_UNITS))
def test_units_include_every_file_once_dispatchers_first(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        jobs: int) -> None:
    """The units for MAX_JOBS=jobs: as many as the cost model says, none empty, forward
    and backward files never together, a unit's dispatchers before its launchers (an
    extern declaration must precede the instantiation it names), every file exactly
    once, the names in the order ninja should start them."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", str(jobs))
    monkeypatch.delenv("MAMBA_SELECTIVE_SCAN_UNITS", raising=False)
    units = units_function(trees["split"])()
    assert len(units) == EXPECTED_UNITS[jobs]
    assert units == sorted(units)
    assert all(u.startswith("csrc/selective_scan_units/unit_") for u in units), units
    seen = []
    for unit in units:
        files = included(tmp_path / unit)
        kinds = {f.split("_")[2] for f in files}
        assert len(kinds) == 1, (unit, files)
        dispatchers = [f for f in files if f in DISPATCHERS]
        assert files[:len(dispatchers)] == dispatchers, files
        assert len(dispatchers) < len(files), f"{unit} compiles no launcher"
        seen += files
    assert sorted(seen) == sorted([*DISPATCHERS, *(name for name, *_ in launchers())])


def test_sixteen_jobs_spread_the_complex_backward_launchers(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """16 jobs: no unit holds more than two of the costliest launchers (complex backward
    with 16 items per thread; upstream's units held three each)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", "16")
    for unit in units_function(trees["split"])():
        heavy = [f for f in included(tmp_path / unit)
                 if "_bwd_" in f and "_complex_" in f and f.endswith("x16.cu")]
        assert len(heavy) <= 2, (unit, heavy)


def test_units_override(trees: dict[str, Path], tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", "16")
    for n in ("2", "9", "60"):
        monkeypatch.setenv("MAMBA_SELECTIVE_SCAN_UNITS", n)
        assert len(units_function(trees["split"])()) == int(n)
    for bad in ("0", "1", "61", "many"):
        monkeypatch.setenv("MAMBA_SELECTIVE_SCAN_UNITS", bad)
        with pytest.raises(RuntimeError, match="MAMBA_SELECTIVE_SCAN_UNITS"):
            units_function(trees["split"])()


def test_units_rewritten_only_when_changed(trees: dict[str, Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run of setup.py (pip runs it twice) leaves the units as they are, so
    ninja does not compile them again; MAX_JOBS unset means one job per usable core."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.delenv("WHEELFORGE_UNIT_JOBS", raising=False)
    monkeypatch.delenv("MAMBA_SELECTIVE_SCAN_UNITS", raising=False)
    assert_units_stable(units_function(trees["split"]), tmp_path, EXPECTED_UNITS)


def test_the_builders_unit_jobs_win_over_max_jobs(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wheelforge sets WHEELFORGE_UNIT_JOBS to the jobs the user chose, else the cores; its
    automatic MAX_JOBS (memory, an earlier build's recorded peak) sizes no unit: the same
    units, hence the same bytes, whatever the machine's history."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MAMBA_SELECTIVE_SCAN_UNITS", raising=False)
    monkeypatch.setenv("WHEELFORGE_UNIT_JOBS", "16")
    for jobs in ("1", "4", "16"):
        monkeypatch.setenv("MAX_JOBS", jobs)
        assert len(units_function(trees["split"])()) == EXPECTED_UNITS[16]
