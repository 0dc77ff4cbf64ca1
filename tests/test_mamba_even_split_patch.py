"""Patch 0011: each backward launcher's 32 kernels compiled in two files, by kIsEvenLen.

Static checks only (no nvcc), as tests/test_mamba_split_patch.py does for 0008: the whole
series is applied to the pinned commit and compared with the tree before 0011.  The
patch must move code, never change it: the body of upstream's backward launcher moved
unchanged into selective_scan_bwd_launch_len (one kIsEvenLen), the kernels untouched,
each half explicitly instantiated exactly once in a file of its own and declared extern
(and hidden) in its launcher's file, and every file compiled exactly once by the units
setup.py generates, a launcher before its halves.  That the built extension is the same
(every kernel's SASS, exported symbols) is scripts/compare-wheels.py's job on real builds
(docs/performance.md, stop 47).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO, assert_units_stable, setup_py_function, tree_files
from test_mamba_split_patch import CONFIGS, DISPATCHERS, EXTERN, HIDDEN, INSTANTIATION
from test_mamba_ssm_patches import MAMBA_URL, mirror
from wheelforge.builder.patch import apply_series
from wheelforge.builder.source import extract, fetch
from wheelforge.recipe.format import RecipeBook

BOOK = RecipeBook(REPO / "recipes", REPO / "patches")
EVEN = "0011-split-backward-launchers-by-even-length.patch"
SRC = "csrc/selective_scan"
HEADER = "selective_scan_bwd_kernel.cuh"
TYPES = {"fp32": "float", "fp16": "at::Half", "bf16": "at::BFloat16"}
WEIGHTS = {"real": "float", "complex": "complex_t"}
# setup.py's COSTS for the backward launchers (CPU-s beyond the headers, as CONFIGS)
BWD_COSTS = {"complex": [7.2, 9.4, 16.3, 20.0, 20.8], "real": [6.1, 7.5, 11.5, 13.5, 13.8]}
# MAX_JOBS -> units: as after 0008 up to 16 jobs, one fewer from 32 on
EXPECTED_UNITS = {1: 8, 2: 8, 4: 11, 8: 13, 12: 11, 16: 15, 32: 26, 64: 26}
UPSTREAM_LAUNCHER = (
    "template<int kNThreads, int kNItems, typename input_t, typename weight_t>\n"
    "void selective_scan_bwd_launch(SSMParamsBwd &params, cudaStream_t stream) {\n")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    recipe = BOOK.load("mamba-ssm")
    names = [p.name for p in recipe.patches]
    assert names[-1] == EVEN, "the recipe does not end with the kIsEvenLen split"
    fetched = fetch(recipe, tmp_path_factory.mktemp("cache"),
                    git_mirrors={MAMBA_URL: mirror()})
    base = tmp_path_factory.mktemp("mamba-even")
    before = extract(fetched.archive, base / "before")
    apply_series(before, recipe.patches[:-1], project="mamba-ssm")
    after = extract(fetched.archive, base / "after")
    apply_series(after, recipe.patches, project="mamba-ssm")
    return {"before": before, "after": after}


def launchers() -> list[tuple[str, str, str, int, int]]:
    """(file stem, input type, weight type, threads, items) of every backward launcher."""
    return [(f"selective_scan_bwd_{t}_{w}_{c[0]}x{c[1]}", TYPES[t], WEIGHTS[w], *c)
            for t in TYPES for w in WEIGHTS for c in CONFIGS]


def half(inp: str, weight: str, threads: int, items: int, even: bool) -> str:
    return (f"template {HIDDEN} void selective_scan_bwd_launch_len<{threads}, {items}, "
            f"{'true' if even else 'false'}, {inp}, {weight}>(SSMParamsBwd &params, "
            "cudaStream_t stream);")


def found(tree: Path, pattern: re.Pattern[str] = INSTANTIATION) -> dict[str, list[str]]:
    return {p.name: [" ".join(m.split()) for m in pattern.findall(p.read_text())]
            for p in sorted((tree / SRC).glob("*.cu"))}


def code(text: str) -> str:
    return "\n".join(ln for ln in re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.DOTALL)
                     .splitlines() if ln.strip())


def test_the_launcher_body_moved_unchanged_and_the_kernels_untouched(
        trees: dict[str, Path]) -> None:
    old = (trees["before"] / SRC / HEADER).read_text()
    new = (trees["after"] / SRC / HEADER).read_text()
    start = old.index(UPSTREAM_LAUNCHER)
    # everything before the launcher (the kernels and their traits) byte for byte
    assert new.startswith(old[:start] + "// wheelforge:")
    # upstream's launcher: its kIsEvenLen switch around a body, then the rest of the file
    switch = "    BOOL_SWITCH(params.seqlen % (kNThreads * kNItems) == 0, kIsEvenLen, [&] {\n"
    body_start = start + len(UPSTREAM_LAUNCHER) + len(switch)
    assert old[start + len(UPSTREAM_LAUNCHER):body_start] == switch
    body_end = old.index("    });\n}\n", body_start)
    body, rest = old[body_start:body_end], old[body_end + len("    });\n}\n"):]
    assert body.count("selective_scan_bwd_kernel<Ktraits>") == 1
    # now: the body, unchanged, in the half launcher; upstream's is the switch alone
    signature = ("template<int kNThreads, int kNItems, bool kIsEvenLen, typename input_t, "
                 "typename weight_t>\nvoid selective_scan_bwd_launch_len(SSMParamsBwd &params, "
                 "cudaStream_t stream) {\n")
    wrapper = (UPSTREAM_LAUNCHER + switch + "        selective_scan_bwd_launch_len<kNThreads, "
               "kNItems, kIsEvenLen, input_t, weight_t>(params, stream);\n    });\n}\n")
    assert new.endswith(signature + body + "}\n\n" + wrapper + rest)
    assert code(new) == code(old[:start] + signature + body + "}\n" + wrapper + rest)


def test_each_half_instantiated_once_in_its_file_and_declared_in_its_launcher(
        trees: dict[str, Path]) -> None:
    after = found(trees["after"])
    externs = found(trees["after"], EXTERN)
    halves = Counter(i for lines in after.values() for i in lines if "_launch_len<" in i)
    assert len(halves) == 60 and max(halves.values()) == 1
    for stem, inp, weight, threads, items in launchers():
        for even in (True, False):
            text = half(inp, weight, threads, items, even)
            assert after[f"{stem}_{'even' if even else 'uneven'}.cu"] == [text]
            assert externs[f"{stem}.cu"].count("extern " + text) == 1
        assert len(externs[f"{stem}.cu"]) == 2
    # nothing else declares a half extern; the dispatchers' declarations are 0008's
    before = found(trees["before"], EXTERN)
    assert {f for f, lines in externs.items() if lines} == (
        {f for f, lines in before.items() if lines} | {f"{s}.cu" for s, *_ in launchers()})
    for f in DISPATCHERS:
        assert externs[f] == before[f]


def test_the_launchers_changed_by_the_extern_block_alone(trees: dict[str, Path]) -> None:
    for stem, inp, weight, threads, items in launchers():
        old = (trees["before"] / SRC / f"{stem}.cu").read_text()
        new = (trees["after"] / SRC / f"{stem}.cu").read_text()
        block = "\n".join("extern " + half(inp, weight, threads, items, even)
                          for even in (True, False))
        launcher = (f"template {HIDDEN} void selective_scan_bwd_launch<{threads}, {items}, "
                    f"{inp}, {weight}>(SSMParamsBwd &params, cudaStream_t stream);")
        assert code(old).count(launcher) == 1
        assert code(new) == code(old).replace(launcher, block + "\n" + launcher), stem
        rest = code((trees["after"] / SRC / f"{stem}_even.cu").read_text()).splitlines()
        assert rest == [f'#include "{HEADER}"', "#ifndef USE_ROCM",
                        half(inp, weight, threads, items, True), "#endif"]


def test_other_files_untouched(trees: dict[str, Path]) -> None:
    old, new = tree_files(trees["before"]), tree_files(trees["after"])
    changed = {n for n in old.keys() & new.keys() if old[n] != new[n]}
    assert changed == {"setup.py", f"{SRC}/{HEADER}"} | {
        f"{SRC}/{s}.cu" for s, *_ in launchers()}
    assert set(old) - set(new) == set()
    assert set(new) - set(old) == {f"{SRC}/{s}_{h}.cu" for s, *_ in launchers()
                                   for h in ("even", "uneven")}


def units_function(tree: Path) -> Callable[[], list[str]]:
    return setup_py_function(tree, "selective_scan_units", HIP_BUILD=False)


def included(unit: Path) -> list[str]:
    return [ln.split('"')[1] for ln in unit.read_text().splitlines() if ln.startswith("#")]


def cost(name: str) -> float:
    """The model's CPU-s of a backward half beyond the headers (a launcher's: 0)."""
    match = re.fullmatch(r"selective_scan_bwd_\w+?_(real|complex)_(\d+x\d+)_(even|uneven)\.cu",
                         name)
    if not match:
        return 0.0
    return BWD_COSTS[match[1]][[f"{t}x{i}" for t, i in CONFIGS].index(match[2])] / 2


@pytest.mark.parametrize("jobs", sorted(EXPECTED_UNITS))
def test_units_include_every_file_once_a_launcher_before_its_halves(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        jobs: int) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", str(jobs))
    monkeypatch.delenv("MAMBA_SELECTIVE_SCAN_UNITS", raising=False)
    monkeypatch.delenv("WHEELFORGE_UNIT_COSTS", raising=False)
    units = units_function(trees["after"])()
    assert len(units) == EXPECTED_UNITS[jobs]
    seen = []
    for unit in units:
        files = included(tmp_path / unit)
        assert len({f.split("_")[2] for f in files}) == 1, (unit, files)
        for i, f in enumerate(files):  # what a file declares extern comes before it
            owner = re.sub(r"_(even|uneven)\.cu$", ".cu", f)
            if owner != f and owner in files:
                assert files.index(owner) < i, files
        dispatchers = [f for f in files if f in DISPATCHERS]
        assert files[:len(dispatchers)] == dispatchers, files
        if "_bwd_" in files[0]:
            assert any(cost(f) > 0 for f in files), f"{unit} compiles no kernel"
        seen += files
    everything = sorted(p.name for p in (trees["after"] / SRC).glob("*.cu"))
    assert sorted(seen) == everything


def test_sixteen_jobs_even_out_the_backward_units(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """16 jobs, by the model: the backward units' kernels cost within the smallest half's
    cost of each other (2.95 CPU-s apart; after 0008 alone, with the whole launchers, 6.4
    CPU-s apart, more than twice the smallest half)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", "16")
    monkeypatch.delenv("MAMBA_SELECTIVE_SCAN_UNITS", raising=False)
    monkeypatch.delenv("WHEELFORGE_UNIT_COSTS", raising=False)
    loads = [sum(map(cost, files)) for files in
             (included(tmp_path / u) for u in units_function(trees["after"])())
             if "_bwd_" in files[0]]
    smallest = min(c for w in BWD_COSTS.values() for c in w) / 2
    assert max(loads) - min(loads) <= smallest, loads


def test_units_override_up_to_one_per_costly_file(
        trees: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", "16")
    for n in ("2", "60", "90"):
        monkeypatch.setenv("MAMBA_SELECTIVE_SCAN_UNITS", n)
        assert len(units_function(trees["after"])()) == int(n)
    monkeypatch.setenv("MAMBA_SELECTIVE_SCAN_UNITS", "91")
    with pytest.raises(RuntimeError, match="from 2 to 90"):
        units_function(trees["after"])()


def test_units_rewritten_only_when_changed(trees: dict[str, Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.delenv("MAMBA_SELECTIVE_SCAN_UNITS", raising=False)
    monkeypatch.delenv("WHEELFORGE_UNIT_COSTS", raising=False)
    assert_units_stable(units_function(trees["after"]), tmp_path, EXPECTED_UNITS)
