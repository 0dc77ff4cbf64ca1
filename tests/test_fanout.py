"""The nightly in three parts: plan, run a cell into a stage, publish the stages.

Unit tests for the plan's order and the GitHub matrix (its 256-job limit), then real
`wheelforge nightly plan|run|publish` processes on the tiny pure fixtures: every cell
published once by the one publisher, a retried job a no-op, a failed or missing cell in
the report and the exit status, a builder with another toolchain refused, a tampered
stage refused before anything is published.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from conftest import IN_CI, make_wheel
from test_nightly import clean_env, pure_project, wheelforge, write_matrix
from wheelforge.builder.artifact.sbom import read_sbom
from wheelforge.errors import ConfigError
from wheelforge.nightly import fanout
from wheelforge.nightly.durations import read_durations
from wheelforge.recipe.matrix import Cell, TorchPin
from wheelforge.wheel import inspect_wheel, retag

TORCH = [{"spec": "torch==2.14.1", "cuda": "13.0"}]


def planned(i: int, estimate: float | None, recipe: str = "r") -> fanout.PlannedCell:
    return fanout.PlannedCell(id=i, recipe=recipe, version="1", python=None,
                              torch="torch==2.14.1", cuda="13.0", pip_args=(), archs="12.0",
                              build_key=f"{i:064x}", toolchain={}, estimate_s=estimate)


def plan_of(cells: list[fanout.PlannedCell]) -> fanout.Plan:
    return fanout.Plan(created="2026-12-01T00:00:00Z", config="w.yaml", index="i",
                       cells=tuple(cells))


def test_one_job_per_cell_up_to_the_limit() -> None:
    gh = fanout.github_matrix(plan_of([planned(i, 60.0) for i in range(3)]))
    assert gh == {"include": [
        {"cells": str(i), "name": "r python torch==2.14.1 cu13.0 sm 12.0",
         "runs-on": list(fanout.RUNNER_LABELS), "container": ""} for i in range(3)]}
    assert fanout.github_matrix(plan_of([])) == {"include": []}


def test_above_256_cells_are_packed_into_balanced_batches() -> None:
    cells = [planned(i, float(600 - i)) for i in range(300)]  # longest first
    gh = fanout.github_matrix(plan_of(cells))
    assert len(gh["include"]) == 256
    ids = [int(x) for job in gh["include"] for x in job["cells"].split()]
    assert sorted(ids) == list(range(300))  # every cell exactly once
    loads = [sum(600 - int(x) for x in job["cells"].split()) for job in gh["include"]]
    assert max(loads) <= 2 * 600  # no batch gets more than two cells' worth
    assert gh["include"][0]["name"].startswith("batch 1 of 256: ")


def test_estimates_come_from_the_recorded_durations(tmp_path: Path) -> None:
    pin = TorchPin(spec="torch==2.14.1", cuda="13.0")
    a = Cell(recipe="a", python=None, torch=pin, archs="12.0")
    fanout.record_durations(tmp_path, [(a, 300.0)])
    durations = read_durations(tmp_path)
    assert fanout.estimate(durations, a) == 300.0
    other_torch = Cell(recipe="a", python=None, torch=TorchPin(spec="torch==2.13.0",
                                                               cuda="12.8"), archs="12.0")
    assert fanout.estimate(durations, other_torch) == 300.0  # same recipe and arch set
    assert fanout.estimate(durations, Cell(recipe="b", python=None, torch=pin,
                                           archs="12.0")) is None


def test_select_names_the_missing_cell() -> None:
    plan = plan_of([planned(0, None), planned(4, None)])
    assert [c.id for c in fanout.select(plan, ["4 0"])] == [4, 0]
    with pytest.raises(ConfigError, match="the plan has no cell '7'"):
        fanout.select(plan, ["7"])


def test_retag_a_wheel_that_carries_its_local_label(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", {"x/__init__.py": ""}, name="x",
                       version="1.0+cu130torch2.14sm120", tag="cp311-cp311-linux_x86_64")
    out = retag(wheel, tmp_path / "out", "3")
    assert out.name == "x-1.0+cu130torch2.14sm120-3-cp311-cp311-linux_x86_64.whl"
    assert str(inspect_wheel(out).version) == "1.0+cu130torch2.14sm120"
    with zipfile.ZipFile(out) as zf:
        assert "Build: 3" in zf.read("x-1.0+cu130torch2.14sm120.dist-info/WHEEL").decode()


# --------------------------------------------------------------------------- real processes


def _project(root: Path, names: list[str]) -> None:
    for name in names:
        pure_project(root, name)
    write_matrix(root, names, TORCH, ["12.0"])


def _common(root: Path, cache: Path) -> list[str | Path]:
    return ["--config", root / "wheelforge.yaml", "--recipes", root / "recipes",
            "--cache-dir", cache]


def _plan(root: Path, cache: Path) -> dict[str, Any]:
    res = wheelforge("nightly", "plan", *_common(root, cache), "--index", root / "index",
                     "--output", root / "plan.json", "--github-matrix", root / "matrix.json",
                     cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    data: dict[str, Any] = json.loads((root / "plan.json").read_text())
    return data


def _run(root: Path, cache: Path, cell: int | str) -> Any:
    return wheelforge("nightly", "run", "--plan", root / "plan.json", "--cell", str(cell),
                      "--stage-dir", root / "stage", *_common(root, cache), "--sources",
                      root / "sdists", "--work-dir", root / "work", cwd=root)


def _publish(root: Path, *stages: Path) -> Any:
    return wheelforge("nightly", "publish", "--plan", root / "plan.json", *stages, "--index",
                      root / "index", "--cache-dir", root / "publisher-cache", cwd=root)


@pytest.mark.e2e
def test_plan_run_publish_on_pure_cells(tmp_path: Path, shared_cache: Path) -> None:
    names = ["purea", "pureb", "purec"]
    _project(tmp_path, names)
    plan = _plan(tmp_path, shared_cache)
    assert sorted(c["recipe"] for c in plan["cells"]) == names
    matrix = json.loads((tmp_path / "matrix.json").read_text())
    assert [j["cells"] for j in matrix["include"]] == [str(c["id"]) for c in plan["cells"]]
    ids = [c["id"] for c in plan["cells"]]
    for i in ids[:2]:  # the last cell's job never ran
        res = _run(tmp_path, shared_cache, i)
        assert res.returncode == 0, res.stderr[-3000:]
        assert not (tmp_path / "index").exists()  # a builder never touches the index
    record = json.loads((tmp_path / "stage" / f"cell-{ids[0]}" / "cell.json").read_text())
    assert record["status"] == "built" and record["cell"]["build_key"] == plan["cells"][0][
        "build_key"]
    assert (tmp_path / "stage" / f"cell-{ids[0]}" / record["wheel"]).is_file()

    res = _publish(tmp_path, tmp_path / "stage")
    assert res.returncode == 1, res.stderr[-3000:]  # one cell did not run
    assert "1 of 3 cell(s) failed or did not run" in res.stderr
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    assert sorted(c["status"] for c in report["cells"]) == ["built", "built", "not run"]
    wheels = sorted(p.name for p in (tmp_path / "index" / "files").glob("*.whl"))
    assert len(wheels) == 2

    # the missing job is retried and the publish job runs again: the first two are no-ops
    assert _run(tmp_path, shared_cache, ids[2]).returncode == 0
    res = _publish(tmp_path, tmp_path / "stage")
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    assert sorted(c["status"] for c in report["cells"]) == ["built", "skipped", "skipped"]
    assert sorted(p.name for p in (tmp_path / "index" / "files").glob("*.whl")) == [
        f"{n}-0.1.0+wf-py3-none-any.whl" for n in names]
    durations = json.loads((tmp_path / "publisher-cache" / "stats" / "durations.json")
                           .read_text())
    assert len(durations) == 3
    # and the next plan has nothing to build
    assert _plan(tmp_path, shared_cache)["cells"] == []


@pytest.mark.e2e
def test_a_failed_cell_is_staged_reported_and_exits_non_zero(tmp_path: Path,
                                                             shared_cache: Path) -> None:
    _project(tmp_path, ["purea", "pureb"])
    recipe = tmp_path / "recipes" / "pureb.yaml"
    recipe.write_text(recipe.read_text().replace("imports: [pureb]", "imports: [nosuchmod]"))
    plan = _plan(tmp_path, shared_cache)
    for c in plan["cells"]:
        res = _run(tmp_path, shared_cache, c["id"])
        assert res.returncode == (1 if c["recipe"] == "pureb" else 0), res.stderr[-3000:]
    res = _publish(tmp_path, tmp_path / "stage")
    assert res.returncode == 1
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    bad = [c for c in report["cells"] if c["status"] == "failed"]
    assert [c["recipe"] for c in bad] == ["pureb"]
    assert "nosuchmod" in bad[0]["error"] + (bad[0]["log_tail"] or "")
    assert "pureb" in (tmp_path / "index" / "reports" / "nightly-latest.html").read_text()


@pytest.mark.e2e
def test_a_builder_with_another_toolchain_is_refused(tmp_path: Path,
                                                     shared_cache: Path) -> None:
    _project(tmp_path, ["purea"])
    plan = _plan(tmp_path, shared_cache)
    # the planner's toolchain said otherwise: another key, another python tag
    plan["cells"][0]["build_key"] = "0" * 64
    plan["cells"][0]["toolchain"] = {"python": "cp312"}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    res = _run(tmp_path, shared_cache, plan["cells"][0]["id"])
    assert res.returncode == 1
    assert "refusing to build purea" in res.stderr
    assert "toolchain differs from the planner's: python 'py3' here, 'cp312' in the plan" \
        in res.stderr
    stage = tmp_path / "stage" / f"cell-{plan['cells'][0]['id']}"
    assert json.loads((stage / "cell.json").read_text())["status"] == "failed"
    assert not list(stage.glob("*.whl"))


@pytest.mark.e2e
def test_a_tampered_stage_publishes_nothing(tmp_path: Path, shared_cache: Path) -> None:
    _project(tmp_path, ["purea"])
    plan = _plan(tmp_path, shared_cache)
    assert _run(tmp_path, shared_cache, plan["cells"][0]["id"]).returncode == 0
    stage = tmp_path / "stage" / f"cell-{plan['cells'][0]['id']}"
    wheel = next(stage.glob("*.whl"))
    bom = read_sbom(wheel)  # the pipeline's SBOM (PEP 770), covered by RECORD
    assert bom is not None and bom["metadata"]["component"]["purl"] == \
        "pkg:pypi/purea@0.1.0%2Bwf"
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    res = _publish(tmp_path, stage)
    assert res.returncode != 0
    assert "is not the wheel its record describes" in res.stderr
    assert "Traceback" not in res.stderr
    # a record rewritten to match another project's wheel: still refused
    other = make_wheel(tmp_path / "evil", {"torch/__init__.py": ""}, name="torch",
                       version="9.9")
    wheel.unlink()
    shutil.copy(other, stage / other.name)
    record = json.loads((stage / "cell.json").read_text())
    record["wheel"] = other.name
    record["sha256"] = hashlib.sha256(other.read_bytes()).hexdigest()
    (stage / "cell.json").write_text(json.dumps(record))
    res = _publish(tmp_path, stage)
    assert res.returncode != 0
    assert "not a wheel of purea 0.1.0" in res.stderr, res.stderr
    assert not list((tmp_path / "index").rglob("*.whl"))


@pytest.mark.integration
def test_options_before_a_subcommand_are_refused(tmp_path: Path) -> None:
    res = wheelforge("nightly", "--jobs", "2", "plan", cwd=tmp_path, env=clean_env())
    assert res.returncode == 2  # plan takes no --jobs: the line it suggests must run
    assert "not options of `wheelforge nightly plan`: --jobs 2" in res.stderr
    res = wheelforge("nightly", "--index", "idx", "plan", cwd=tmp_path, env=clean_env())
    assert res.returncode == 2
    assert "put them after it: wheelforge nightly plan --index idx" in res.stderr


# --------------------------------------------------------------------------- GitHub Actions


@pytest.mark.integration
def test_the_fanout_workflow_validates_and_runs_the_three_parts() -> None:
    import re
    import shlex
    import subprocess

    import yaml

    from test_nightly import EXAMPLES, _linter
    from wheelforge.cli.main import cli

    workflow = EXAMPLES / "github-actions" / "nightly-fanout.yml"
    data = yaml.safe_load(workflow.read_text())
    jobs = data["jobs"]
    assert set(jobs) == {"plan", "build", "publish"}
    assert "fromJSON(needs.plan.outputs.matrix)" in jobs["build"]["strategy"]["matrix"]
    assert jobs["build"]["strategy"]["fail-fast"] is False
    assert jobs["publish"]["concurrency"]["group"] and \
        jobs["publish"]["concurrency"]["cancel-in-progress"] is False
    assert jobs["plan"]["outputs"]["matrix"] == "${{ steps.plan.outputs.matrix }}"
    # every wheelforge command line of the workflow parses with the real CLI
    commands = []
    for job in jobs.values():
        for step in job["steps"]:
            for line in re.sub(r"\\\n\s*", "", step.get("run", "")).splitlines():
                if "wheelforge nightly" in line or "wheelforge prune" in line:
                    commands.append(shlex.split(line.strip())[1:])
    assert [c[:2] for c in commands] == [["nightly", "plan"], ["nightly", "run"],
                                         ["nightly", "publish"], ["prune", "--index"]]
    for argv in commands:  # every option is one the command has
        command = cli.commands[argv[0]]
        if argv[0] == "nightly":
            command = command.commands[argv[1]]  # type: ignore[attr-defined]
        known = {o for p in command.params for o in getattr(p, "opts", ())}
        assert {a for a in argv if a.startswith("-")} <= known, (argv, known)
    linter = _linter()
    if linter is None:
        if IN_CI:
            pytest.fail("actionlint (or check-jsonschema) is required under CI=true")
        pytest.skip("neither actionlint nor check-jsonschema is installed")
    res = subprocess.run([*linter, str(workflow)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_plan_puts_the_longest_first_and_the_never_timed_before(tmp_path: Path) -> None:
    from wheelforge import nightly
    from wheelforge._log import Reporter
    from wheelforge.recipe.format import RecipeBook
    from wheelforge.recipe.matrix import load_matrix

    names = ["purea", "pureb", "purec"]
    _project(tmp_path, names)
    book = RecipeBook(tmp_path / "recipes", tmp_path / "patches")
    matrix = load_matrix(tmp_path / "wheelforge.yaml", known_recipes=book.names())
    pin = TorchPin(spec="torch==2.14.1", cuda="13.0")
    fanout.record_durations(tmp_path / "cache", [
        (Cell(recipe="purea", python=None, torch=pin, archs=None), 10.0),
        (Cell(recipe="pureb", python=None, torch=pin, archs=None), 50.0)])
    settings = nightly.Settings(index_dir=tmp_path / "index", cache_dir=tmp_path / "cache")
    plan = fanout.make_plan(matrix, book, settings, reporter=Reporter())
    assert [(c.recipe, c.estimate_s) for c in plan.cells] == [
        ("purec", None), ("pureb", 50.0), ("purea", 10.0)]
    assert not (tmp_path / "index").exists()  # planning writes nothing
    again = fanout.load_plan(_written(plan, tmp_path / "plan.json"))
    assert again.cells == plan.cells


def _written(plan: fanout.Plan, path: Path) -> Path:
    fanout.write_plan(plan, path)
    return path
