"""The nightly's plan and stage readers (nightly/fanout.py: load_plan, load_stage) take a
file a CI job or another builder wrote: whatever JSON it holds (nested 100k deep, wrong
types, huge numbers, NaN) gives the project's error, never another exception (a traceback,
exit 70, as a plan nested 100k deep gave before: issue 52)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wheelforge.errors import ConfigError, WheelforgeError
from wheelforge.nightly import fanout

CELL = fanout.PlannedCell(id=1, recipe="r", version="1", python=None, torch="torch==2.14.1",
                          cuda="13.0", pip_args=(), archs="12.0", build_key="0" * 64,
                          toolchain={"nvcc": "13.0"}, estimate_s=10.0)
PLAN = {"schema": fanout.PLAN_SCHEMA,
        **dataclasses.asdict(fanout.Plan(created="2026-12-01T00:00:00Z", config="w.yaml",
                                         index="i", cells=(CELL,)))}
PLAN["done"] = [{"recipe": "r", "version": "1", "python": "3.11", "torch": "2.14.1",
                 "cuda": "13.0", "pip_args": [], "archs": None, "status": "skipped"}]
STAGE = {"schema": fanout.STAGE_SCHEMA,
         **dataclasses.asdict(fanout.StageRecord(cell=CELL, status="failed", host="h",
                                                 duration_s=1.0, error="it broke"))}

WHEEL = b"not a zip: load_stage checks the name and the sha256"
BUILT = {**STAGE, "status": "built", "wheel": "r-1-py3-none-any.whl", "error": None,
         "sha256": hashlib.sha256(WHEEL).hexdigest()}

SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=10**300)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                      max_leaves=20)
FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def mutated(doc: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    """``doc`` with the value at ``path`` (as far as it leads) replaced by ``value``."""
    doc = json.loads(json.dumps(doc))
    node: Any = doc
    for i, step in enumerate(path):
        if isinstance(node, dict) and node:
            key = sorted(node)[step % len(node)] if isinstance(step, int) else step
        elif isinstance(node, list) and node:
            key = hash(step) % len(node)
        else:
            break
        if i == len(path) - 1 or not isinstance(node.get(key) if isinstance(node, dict)
                                                else node[key], (dict, list)):
            node[key] = value
            break
        node = node[key]
    return doc


PATHS = st.lists(st.integers(min_value=0, max_value=40) | st.sampled_from(
    ["cells", "cell", "done", "toolchain", "subset", "id", "estimate_s", "schema"]),
    min_size=1, max_size=4)


def plan_gives_only_our_errors(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(text)
        with contextlib.suppress(WheelforgeError):
            fanout.load_plan(path)


def stage_gives_only_our_errors(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / fanout.RECORD).write_text(text)
        (Path(tmp) / BUILT["wheel"]).write_bytes(WHEEL)
        with contextlib.suppress(WheelforgeError):
            fanout.load_stage(Path(tmp))


def test_the_seeds_are_read() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "plan.json").write_text(json.dumps(PLAN))
        assert fanout.load_plan(Path(tmp) / "plan.json").cells == (CELL,)
        (Path(tmp) / fanout.RECORD).write_text(json.dumps(STAGE))
        assert fanout.load_stage(Path(tmp)).cell == CELL
        (Path(tmp) / fanout.RECORD).write_text(json.dumps(BUILT))
        (Path(tmp) / BUILT["wheel"]).write_bytes(WHEEL)
        assert fanout.load_stage(Path(tmp)).status == "built"


def test_nested_100k_deep_is_refused_naming_the_file(tmp_path: Path) -> None:
    for name, load, target in (("plan.json", fanout.load_plan, tmp_path / "plan.json"),
                               (fanout.RECORD, fanout.load_stage, tmp_path)):
        (tmp_path / name).write_text(nested(100_000))
        try:
            load(target)
        except ConfigError as exc:
            assert str(tmp_path / name) in exc.what and "nested too deep" in exc.why
        else:
            raise AssertionError(f"{name} nested 100k deep was read")
        (tmp_path / name).write_text(json.dumps({**PLAN, "cells": [json.loads(nested(900))]}))
        with contextlib.suppress(ConfigError):
            load(target)


@FUZZ
@given(VALUES)
def test_any_json_value_as_a_plan(value: Any) -> None:
    plan_gives_only_our_errors(json.dumps(value))


@FUZZ
@given(PATHS, VALUES)
def test_a_plan_with_one_value_changed(path: list[str | int], value: Any) -> None:
    plan_gives_only_our_errors(json.dumps(mutated(PLAN, path, value)))


@FUZZ
@given(VALUES)
def test_any_json_value_as_a_stage(value: Any) -> None:
    stage_gives_only_our_errors(json.dumps(value))


@FUZZ
@given(PATHS, VALUES)
def test_a_stage_with_one_value_changed(path: list[str | int], value: Any) -> None:
    stage_gives_only_our_errors(json.dumps(mutated(STAGE, path, value)))


@FUZZ
@given(PATHS, VALUES)
def test_a_built_stage_with_one_value_changed(path: list[str | int], value: Any) -> None:
    stage_gives_only_our_errors(json.dumps(mutated(BUILT, path, value)))


def test_a_built_stage_whose_cell_version_is_no_version() -> None:
    stage_gives_only_our_errors(json.dumps(mutated(BUILT, ["cell", "version"], "a b")))


def test_nan_and_huge_numbers_where_numbers_go(tmp_path: Path) -> None:
    for bad in (math.nan, math.inf, 10**400, -1e308 * 10, "1e999"):
        plan_gives_only_our_errors(json.dumps(mutated(PLAN, ["cells", 0, "id"], bad)))
        plan_gives_only_our_errors(json.dumps(mutated(PLAN, ["cells", 0, "estimate_s"], bad)))
        stage_gives_only_our_errors(json.dumps(mutated(STAGE, ["duration_s"], bad)))


def test_recorded_durations_nested_or_huge_are_left_out(tmp_path: Path) -> None:
    from wheelforge.nightly.durations import DURATIONS, read_durations

    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / DURATIONS).write_text(nested(100_000))
    assert read_durations(tmp_path) == {}
    (stats / DURATIONS).write_text('{"a": 1e999, "b": NaN, "c": ' + "9" * 400 + ', "d": 2}')
    assert read_durations(tmp_path) == {"d": 2.0}


def test_a_planned_result_of_the_wrong_types_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    for field, bad in (("duration_s", "slow"), ("duration_s", 10**400), ("duration_s", True),
                       ("status", "exploded"), ("note", 7), ("archs_found", [1]),
                       ("wheel", ["x"])):
        path.write_text(json.dumps(mutated(PLAN, ["done", 0, field], bad)))
        try:
            fanout.load_plan(path)
        except ConfigError as exc:
            assert field in exc.why and str(path) in exc.what
        else:
            raise AssertionError(f"done[0].{field} = {bad!r} was read")
