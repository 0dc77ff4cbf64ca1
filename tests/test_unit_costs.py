"""Unit costs recorded from ninja's log, and the split patches' units, which never depend
on them (issue 53).

ninja is real (a tiny manifest in torch's form; a real CUDA build for the pipeline), the
patched setup.py functions are the shipped series' (causal-conv1d 0005, mamba-ssm 0008).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import REPO, require_tool, setup_py_function, tinyext_project
from test_mamba_ssm_patches import MAMBA_URL, mirror
from wheelforge.builder.artifact.identity import tree_id
from wheelforge.builder.compiling import jobserver, unitcosts
from wheelforge.builder.source.fetch import extract, fetch
from wheelforge.builder.source.patch import apply_series
from wheelforge.recipe.format import RecipeBook

BOOK = RecipeBook(REPO / "recipes", REPO / "patches")


@pytest.mark.integration
def test_read_from_a_real_ninja_log(tmp_path: Path) -> None:
    """A manifest as torch writes it (absolute paths, one build line per unit): the
    seconds ninja logged per unit, longest first, and the files a generated unit
    includes; the record is found again for the same arch list only."""
    ninja = require_tool("ninja")
    tree = tmp_path / "tree"
    (tree / "csrc" / "units").mkdir(parents=True)
    (tree / "csrc" / "a.cpp").write_text("int a;\n")
    (tree / "csrc" / "units" / "unit_01_of_01.cu").write_text(
        '// generated\n#include "k_w2.cu"\n#include "k_w3.cu"\n')
    build = tree / "build" / "temp.linux-x86_64-cpython-311"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text(
        "rule compile\n  command = sleep $secs && touch $out\n"
        f"build {build}/csrc/a.o: compile {tree}/csrc/a.cpp\n  secs = 0.1\n"
        f"build {build}/csrc/units/unit_01_of_01.o: compile "
        f"{tree}/csrc/units/unit_01_of_01.cu\n  secs = 0.6\n")
    subprocess.run([ninja, "-C", str(build)], check=True, capture_output=True)
    long, short = unitcosts.read_ninja_costs(tree)
    assert (long.source, long.members) == ("csrc/units/unit_01_of_01.cu",
                                           ("k_w2.cu", "k_w3.cu"))
    assert (short.source, short.members) == ("csrc/a.cpp", ())
    assert 0.5 <= long.seconds < 3 and 0.05 <= short.seconds < long.seconds
    path = unitcosts.record(tmp_path / "cache", "demo", tree="t1", arch_list="12.0",
                            jobs=2, threads=1, costs=[long, short])
    assert path is not None
    assert unitcosts.recorded(tmp_path / "cache", "demo", "12.0", "t1") == path
    assert unitcosts.recorded(tmp_path / "cache", "demo", "10.0;12.0", "t1") is None
    assert unitcosts.read_ninja_costs(tmp_path / "no-build") == []
    assert unitcosts.total_seconds(path) == long.seconds + short.seconds
    # a unit that waited at the pool's gate: the seconds it ran, as its gate wrote them
    Path(f"{build}/csrc/units/unit_01_of_01.o{jobserver.SECONDS_SUFFIX}").write_text("0.25\n")
    gated = {c.source: c.seconds for c in unitcosts.read_ninja_costs(tree)}
    assert gated["csrc/units/unit_01_of_01.cu"] == 0.25


def included(unit: Path) -> list[str]:
    return [ln.split('"')[1] for ln in unit.read_text().splitlines()
            if ln.startswith("#include")]


def record_units(root: Path, units: list[str],
                 seconds: Callable[[list[str]], float]) -> list[dict[str, object]]:
    return [{"source": u, "seconds": seconds(included(root / u)),
             "members": included(root / u)} for u in units]


def write_record(path: Path, root: Path, units: list[str],
                 seconds: Callable[[list[str]], float],
                 earlier: list[list[dict[str, object]]] | None = None) -> Path:
    """A record as wheelforge writes it, of ``units`` (generated under ``root``), with
    ``earlier`` builds' units."""
    path.write_text(json.dumps({"arch_list": "12.0", "units": record_units(root, units, seconds),
                                **({"earlier": earlier} if earlier is not None else {})}))
    return path


@pytest.fixture(scope="module")
def causal_tree(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    recipe = BOOK.load("causal-conv1d")
    tree = extract(fetch(recipe, shared_cache).archive,
                   tmp_path_factory.mktemp("cc1d") / "src")
    apply_series(tree, recipe.patches, project="causal-conv1d")
    return tree


@pytest.fixture(scope="module")
def mamba_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    recipe = BOOK.load("mamba-ssm")
    fetched = fetch(recipe, tmp_path_factory.mktemp("cache"), git_mirrors={MAMBA_URL: mirror()})
    tree = extract(fetched.archive, tmp_path_factory.mktemp("mamba") / "src")
    apply_series(tree, recipe.patches, project="mamba-ssm")
    return tree


def _cost_causal(name: str) -> float:  # bwd_units()'s model, CPU-s beyond the headers
    width = int(name[-len("2.cu")])
    return ({2: 9, 3: 9, 4: 10} if "_bwd_fp32_" in name else {2: 18, 3: 13, 4: 16})[width]


_MAMBA = {("bwd", "complex"): [7.2, 9.4, 16.3, 20.0, 20.8],
          ("bwd", "real"): [6.1, 7.5, 11.5, 13.5, 13.8],
          ("fwd", "complex"): [2.8, 3.8, 5.5, 6.5, 7.0],
          ("fwd", "real"): [2.6, 3.4, 5.0, 5.4, 5.6]}
_CONFIGS = ["32x4", "32x8", "32x16", "64x16", "128x16"]


def _cost_mamba(name: str) -> float:  # selective_scan_units()'s COSTS; a dispatcher 0
    parts = name[:-len(".cu")].split("_")  # selective_scan_<kind>_<t>_<w>[_<config>]
    if len(parts) < 6:
        return 0.0
    return _MAMBA[(parts[2], parts[4])][_CONFIGS.index(parts[5])]


def _headers_mamba(files: list[str]) -> float:  # a forward unit parses fewer headers
    return 7.5 if "_fwd_" in files[0] else 9.0


CASES = {
    "causal-conv1d": ("causal_tree", "bwd_units", {"glob": glob}, lambda _f: 9.0,
                      _cost_causal, "CAUSAL_CONV1D_BWD_UNITS"),
    "mamba-ssm": ("mamba_tree", "selective_scan_units", {"HIP_BUILD": False}, _headers_mamba,
                  _cost_mamba, "MAMBA_SELECTIVE_SCAN_UNITS"),
}


#: the variable through which wheelforge once gave the split patches the record (issue 53)
RECORD_VAR = "WHEELFORGE_UNIT_COSTS"


def packer(recipe: str, request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch
           ) -> tuple[Callable[[], list[str]], Callable[[list[str]], float],
                      Callable[[str], float]]:
    """The recipe's unit generator, run for 16 jobs in ``tmp_path`` without a record, and
    its model's headers and file costs."""
    fixture, function, scope, headers, cost, override = CASES[recipe]
    tree: Path = request.getfixturevalue(fixture)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAX_JOBS", "16")
    monkeypatch.delenv(override, raising=False)
    monkeypatch.delenv(RECORD_VAR, raising=False)
    return setup_py_function(tree, function, **scope), headers, cost


@pytest.mark.integration
@pytest.mark.parametrize("recipe", sorted(CASES))
def test_the_units_are_the_same_whatever_the_machine_built_before(
        recipe: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 53: one build key, one set of bytes.  The shipped series' unit generator, for
    16 jobs, with no history and with the histories a machine could have recorded (every
    unit twice its model: a slower machine; the heaviest unit four times its model, alone
    and as the earlier of two builds) writes the same unit files, byte for byte: which
    kernel files share a translation unit depends on the source and MAX_JOBS alone.
    (The dropped patches 0008 and 0010 repacked the heavy unit's files by such a record:
    another .so, and units the compile cache had never seen.)"""
    units, headers, cost = packer(recipe, request, tmp_path, monkeypatch)

    def written() -> dict[str, bytes]:
        return {u: (tmp_path / u).read_bytes() for u in units()}

    clean = written()
    model = sorted(clean)
    layout = [included(tmp_path / u) for u in model]
    heavy = max(layout, key=lambda f: (sum(map(cost, f)), f))
    assert len([f for f in heavy if cost(f) > 0]) >= 2  # a unit a record could split

    def modelled(files: list[str]) -> float:
        return headers(files) + sum(map(cost, files))

    def scaled(factor: float) -> Callable[[list[str]], float]:
        return lambda f: (factor if f == heavy else 1) * modelled(f)

    histories = {  # each written before any run could rewrite the unit files
        "slower": write_record(tmp_path / "slower.json", tmp_path, model,
                               lambda f: 2 * modelled(f)),
        "heavy": write_record(tmp_path / "heavy.json", tmp_path, model, scaled(4)),
        "two builds": write_record(tmp_path / "both.json", tmp_path, model, scaled(1),
                                   earlier=[record_units(tmp_path, model, scaled(4))]),
    }
    for what, record in histories.items():
        monkeypatch.setenv(RECORD_VAR, str(record))
        assert written() == clean, f"{recipe}: the history '{what}' regrouped the units"


def test_a_record_keeps_the_builds_before_it(tmp_path: Path) -> None:
    """Each record keeps the units of up to KEEP - 1 builds before it, newest first, of
    the same source tree, arch list, jobs and threads; another job count or tree starts
    the history again, as does a record that cannot be read."""
    def record(seconds: float, jobs: int = 16, tree: str = "t1") -> dict[str, object]:
        unitcosts.record(tmp_path, "demo", tree=tree, arch_list="12.0", jobs=jobs,
                         threads=1, costs=[unitcosts.UnitCost("csrc/a.cu", seconds)])
        data: dict[str, object] = json.loads((tmp_path / "stats" / "demo.units.json")
                                             .read_text())
        return data

    def seconds(builds: object) -> list[float]:
        assert isinstance(builds, list)
        return [b[0]["seconds"] for b in builds]

    assert record(1.0)["earlier"] == []
    for n in range(2, unitcosts.KEEP + 3):
        data = record(float(n))
    assert seconds([data["units"]]) == [float(unitcosts.KEEP + 2)]
    assert seconds(data["earlier"]) == [float(unitcosts.KEEP + 2 - i)
                                        for i in range(1, unitcosts.KEEP)]
    assert record(9.0, jobs=8)["earlier"] == []
    assert seconds(record(9.5, jobs=8)["earlier"]) == [9.0]
    assert record(9.7, jobs=8, tree="t2")["earlier"] == []
    (tmp_path / "stats" / "demo.units.json").write_text("{not json")
    assert record(10.0, jobs=8)["earlier"] == []


def test_a_record_is_given_only_to_a_build_of_the_same_tree_and_archs(
        tmp_path: Path) -> None:
    """The next build gets the record of the same source tree (version, sources, patches)
    and arch list, whatever its job count; another tree's record may name files that no
    longer exist or hold other kernels (a patch that splits a file keeps its name for
    part of it), another arch list's units cost otherwise: the model alone."""
    unitcosts.record(tmp_path, "demo", tree="t1", arch_list="12.0", jobs=16, threads=1,
                     costs=[unitcosts.UnitCost("csrc/a.cu", 3.0)])
    path = tmp_path / "stats" / "demo.units.json"
    assert unitcosts.recorded(tmp_path, "demo", "12.0", "t1") == path
    assert unitcosts.recorded(tmp_path, "demo", "12.0", "t2") is None
    assert unitcosts.recorded(tmp_path, "demo", "9.0", "t1") is None
    assert unitcosts.recorded(tmp_path, "other", "12.0", "t1") is None
    for bad in ("[1, 2]", "{not json", json.dumps({"arch_list": "12.0", "tree": "t1"})):
        path.write_text(bad)
        assert unitcosts.recorded(tmp_path, "demo", "12.0", "t1") is None


def test_the_tree_is_the_version_the_sources_and_the_patches(tmp_path: Path) -> None:
    recipe = BOOK.load("mamba-ssm")
    assert tree_id(recipe) == tree_id(BOOK.load("mamba-ssm"))
    copy = tmp_path / recipe.patches[-1].name
    copy.write_bytes(recipe.patches[-1].read_bytes() + b"\n")
    changed = [
        dataclasses.replace(recipe, patches=recipe.patches[:-1]),
        dataclasses.replace(recipe, patches=(*recipe.patches[:-1], copy)),
        dataclasses.replace(recipe, version=Version("2.3.3")),
        dataclasses.replace(recipe, sources=tuple(
            dataclasses.replace(s, commit="0" * 40) for s in recipe.sources)),
    ]
    ids = {tree_id(r) for r in changed}
    assert len(ids) == len(changed) and tree_id(recipe) not in ids
    # what does not change the tree does not change the record's key
    assert tree_id(dataclasses.replace(recipe, summary="another summary")) == tree_id(recipe)


@pytest.mark.nvcc
def test_a_cold_build_records_its_units_and_the_next_build_reads_them(
        tmp_path: Path, shared_cache: Path, nvcc: str) -> None:
    """A real build without the compile cache records what ninja logged; the next build
    of the recipe finds the record (for the order of its compile slots) and says so."""
    sdists = tinyext_project(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir(parents=True)
    # the torch environments, not copied: the folder linked, so that each lock file in it is
    # a plain file opened without following a link (a linked lock file is refused, issue 52)
    (shared_cache / "envs").mkdir(parents=True, exist_ok=True)
    (cache / "envs").symlink_to(shared_cache / "envs", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env["WHEELFORGE_COMPILE_CACHE"] = "off"
    argv = [sys.executable, "-m", "wheelforge", "build", "tinyext", "--arch", "12.0",
            "--recipes", str(tmp_path / "recipes"), "--sources", str(sdists),
            "--index", str(tmp_path / "index"), "--cache-dir", str(cache),
            "--no-stack-check"]
    first = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=1200)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "unit costs recorded: " in first.stderr
    data = json.loads((cache / "stats" / "tinyext.units.json").read_text())
    assert data["arch_list"] == "12.0" and data["units"]
    assert all(u["seconds"] > 0 and not u["source"].startswith("/") for u in data["units"])
    again = subprocess.run([*argv, "--force"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=1200)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "unit costs recorded by an earlier build (the compile slots' order only): " \
        in again.stderr
