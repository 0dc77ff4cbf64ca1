"""Kernel subsets in the nightly matrix (``matrix.subsets``), through the real nightly:
each subset a cell of its own, with its own build key, label and wheel, built into a
stage and published into a real index; the plan carries the subset to another builder.

No CUDA is compiled: the fixture recipe ``subext`` declares a subset dimension whose
switch (SUBEXT_KERNELS) the stand-in builder writes into the wheel, as a recipe's patch
would read it, and the toolkit is a fake nvcc.  Nothing installs a build environment, so
the check of the environment's torch flavour (which would install torch) is not run.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from conftest import PACKAGES, make_sdist, make_wheel, write_recipe
from setup_py_runs import make_fake_cuda
from test_nightly import wheelforge
from wheelforge import index, nightly
from wheelforge._log import Reporter
from wheelforge.builder import pipeline
from wheelforge.builder.artifact import identity
from wheelforge.builder.compiling import toolchain
from wheelforge.builder.config import BuildConfig
from wheelforge.errors import PublishError
from wheelforge.nightly import fanout, publishing
from wheelforge.nightly.durations import estimate, read_durations
from wheelforge.nightly.state import CellRunner
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.matrix import load_matrix
from wheelforge.recipe.model import Recipe
from wheelforge.recipe.subsets import subset_environment, subset_label

SUBEXT = """format: 1
name: subext
version: "0.1.0"
sources:
  - sdist: {{filename: subext-0.1.0.tar.gz, sha256: "{sha}"}}
build:
  kind: extension
subsets:
  kernels:
    env: SUBEXT_KERNELS
    values: [a, b]
    labels: {{a: ka, b: kb}}
verify:
  imports: [subext]
"""
SUB = (("kernels", ("a",)),)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, RecipeBook]:
    _, sha = make_sdist(PACKAGES / "tinypure", tmp_path / "sdists", "subext", "0.1.0")
    write_recipe(tmp_path, "subext", SUBEXT.format(sha=sha))
    (tmp_path / "wheelforge.yaml").write_text(yaml.safe_dump({"matrix": {
        "recipes": ["subext"], "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}],
        "archs": ["12.0"], "subsets": {"subext": ["full", {"kernels": "a"}]}}}))
    make_fake_cuda(tmp_path / "cuda")
    # no build environment (torch) is installed by these tests: see the module's docstring
    monkeypatch.setattr(CellRunner, "check_torch_cuda", lambda self, plan: None)
    return tmp_path, RecipeBook(tmp_path / "recipes", tmp_path / "patches")


def environ(root: Path) -> dict[str, str]:
    return {"CUDA_HOME": str(root / "cuda"), "PATH": os.environ.get("PATH", "")}


def settings(root: Path) -> nightly.Settings:
    return nightly.Settings(index_dir=root / "index", cache_dir=root / "cache",
                            work_dir=root / "work", project_file=root / "wheelforge.yaml",
                            environ=environ(root), stack_check=False)


def subset_builder(root: Path, book: RecipeBook, built: list[str]
                   ) -> Callable[[Recipe, BuildConfig, Reporter], pipeline.BuildResult]:
    """Stands in for the compile: the wheel holds the kernels the subset's switch selects
    and carries the subset's label, published under the real build key."""
    def build(recipe: Recipe, config: BuildConfig, reporter: Reporter) -> pipeline.BuildResult:
        subset = identity.recipe_subset(recipe, config)
        kernels = subset_environment(recipe, subset)["SUBEXT_KERNELS"]
        built.append(kernels)
        key = identity.planned_key(recipe, config, book, toolchain.find_cuda(environ(root)))
        version = f"{recipe.version}+cu130sm120{subset_label(recipe, subset)}"
        wheel = make_wheel(config.work_dir / "dist" / key[:12],
                           {"subext/__init__.py": "", "subext/kernels.txt": kernels},
                           name="subext", version=version, tag="cp311-cp311-linux_x86_64")
        res = index.publish(config.index_dir, wheel, channel=None, cuda="13.0", torch="2.14",
                            archs=("sm_120",), build_key=key)
        return pipeline.BuildResult(recipe, res.path, ("sm_120",), None, key)
    return build


def kernels_of(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read("subext/kernels.txt").decode()


def test_the_nightly_builds_and_publishes_each_subset_as_its_own_cell(
        project: tuple[Path, RecipeBook]) -> None:
    root, book = project
    matrix = load_matrix(root / "wheelforge.yaml", book.names(), book.load)
    built: list[str] = []
    log = io.StringIO()
    report = nightly.run(matrix, book, settings(root), reporter=Reporter(log),
                         build=subset_builder(root, book, built))
    assert [(r.status, r.subset) for r in report.results] == [("built", ""),
                                                              ("built", "kernels=a")]
    assert sorted(built) == ["a", "a,b"]  # the full build sets every switch explicitly too
    full, sub = report.results
    assert full.build_key != sub.build_key
    assert full.wheel == "subext-0.1.0+cu130sm120-cp311-cp311-linux_x86_64.whl"
    assert sub.wheel == "subext-0.1.0+cu130sm120ka-cp311-cp311-linux_x86_64.whl"
    files = root / "index" / index.FILES_DIR
    assert kernels_of(files / full.wheel) == "a,b" and kernels_of(files / sub.wheel) == "a"
    assert {r.build_key for r in index.load_records(root / "index")} == {full.build_key,
                                                                        sub.build_key}
    assert "subext | python | torch==2.14.1 | cu13.0 | arch 12.0 [kernels=a]: building" in \
        log.getvalue()
    data = json.loads((root / "index" / "reports" / "nightly-latest.json").read_text())
    assert [c["subset"] for c in data["cells"]] == ["", "kernels=a"]
    page = (root / "index" / "reports" / "nightly-latest.html").read_text()
    assert "subext 0.1.0 <code>[kernels=a]</code>" in page
    # durations are kept per cell: the subset's never stands for the full build's
    durations = read_durations(root / "cache")
    assert sorted(durations) == ["subext||torch==2.14.1|12.0",
                                 "subext||torch==2.14.1|12.0|kernels=a"]
    again = nightly.run(matrix, book, settings(root), reporter=Reporter(io.StringIO()),
                        build=subset_builder(root, book, built))
    assert [r.status for r in again.results] == ["skipped", "skipped"] and len(built) == 2


def test_the_plan_carries_the_subset_to_the_builder_and_the_publisher_checks_the_key(
        project: tuple[Path, RecipeBook]) -> None:
    root, book = project
    matrix = load_matrix(root / "wheelforge.yaml", book.names(), book.load)
    plan = fanout.make_plan(matrix, book, settings(root), reporter=Reporter(io.StringIO()))
    fanout.write_plan(plan, root / "plan.json")
    loaded = fanout.load_plan(root / "plan.json")
    assert loaded.cells == plan.cells  # a round trip, the subset included
    by_subset = {c.subset: c for c in loaded.cells}
    assert set(by_subset) == {(), SUB}
    sub = by_subset[SUB]
    assert sub.label.endswith("arch 12.0 [kernels=a]")
    assert fanout.github_matrix(loaded)["include"][[c.id for c in loaded.cells].index(sub.id)][
        "name"] == "subext python torch==2.14.1 cu13.0 sm 12.0 [kernels=a]"
    # another builder: the planned cell alone says what to build
    built: list[str] = []
    rec = fanout.run_cell(sub, matrix, book, settings(root), root / "stage" / "sub",
                          reporter=Reporter(io.StringIO()),
                          build=subset_builder(root, book, built))
    assert rec.status == "built" and built == ["a"]
    assert kernels_of(root / "stage" / "sub" / str(rec.wheel)) == "a"
    assert fanout.load_stage(root / "stage" / "sub").cell.subset == SUB
    # a plan whose cell lost its subset keeps the subset's key: the builder refuses it
    stripped = dataclasses.replace(sub, subset=())
    refused = fanout.run_cell(stripped, matrix, book, settings(root), root / "stage" / "x",
                              reporter=Reporter(io.StringIO()),
                              build=subset_builder(root, book, built))
    assert refused.status == "failed" and "build key" in str(refused.error)
    assert built == ["a"]
    # the publisher: a stage is published only under its plan's cell and key
    other = dataclasses.replace(loaded, cells=tuple(
        dataclasses.replace(c, build_key="f" * 64) if c.id == sub.id else c
        for c in loaded.cells))
    with pytest.raises(PublishError, match="is not a cell of this plan"):
        publishing.publish(other, [root / "stage" / "sub"], settings(root),
                       reporter=Reporter(io.StringIO()))


def test_an_old_plan_without_subsets_loads_as_full_builds(
        project: tuple[Path, RecipeBook]) -> None:
    root, book = project
    matrix = load_matrix(root / "wheelforge.yaml", book.names(), book.load)
    plan = fanout.make_plan(matrix, book, settings(root), reporter=Reporter(io.StringIO()))
    data = json.loads(fanout.plan_to_json(plan))
    for cell in data["cells"]:
        del cell["subset"]
    (root / "old.json").write_text(json.dumps(data))
    assert {c.subset for c in fanout.load_plan(root / "old.json").cells} == {()}
    full = next(c for c in plan.cells if not c.subset)
    assert estimate({"subext||torch==2.14.1|12.0": 60.0}, full.cell) == 60.0
    sub = next(c for c in plan.cells if c.subset)
    assert estimate({"subext||torch==2.14.1|12.0": 60.0}, sub.cell) is None


def test_a_bad_subset_is_a_configuration_error_on_the_command_line(
        project: tuple[Path, RecipeBook]) -> None:
    root, _ = project
    (root / "wheelforge.yaml").write_text(yaml.safe_dump({"matrix": {
        "recipes": ["subext"], "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}],
        "archs": ["12.0"], "subsets": {"subext": [{"kernel": "a"}, {"kernels": "c"}]}}}))
    res = wheelforge("nightly", "plan", "--config", root / "wheelforge.yaml", "--recipes",
                     root / "recipes", "--cache-dir", root / "cache", "--index", root / "index",
                     cwd=root)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert f"the build matrix in {root / 'wheelforge.yaml'} has 2 problem(s)" in res.stderr
    assert ("matrix.subsets.subext[0]: unknown subset key 'kernel' (did you mean 'kernels'?) "
            "(subext declares kernels=a,b)") in res.stderr
    assert ("matrix.subsets.subext[1]: kernels: unknown value(s) c; choose from a,b") in \
        res.stderr
