"""Recipe-declared kernel subsets, a recipe's stated job memory, and the wheel-content rules
of verification (flash-attn, issue 24): pure data and plain functions, no process started."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import REPO, make_wheel, write_recipe
from wheelforge.builder import config as cfg
from wheelforge.builder.artifact.identity import build_key, local_label, without_subset
from wheelforge.builder.artifact.verify import content_problems
from wheelforge.errors import ConfigError, RecipeError
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.model import Recipe
from wheelforge.recipe.subsets import (
    parse_subset_entries,
    select_subset,
    subset_environment,
    subset_label,
)

BOOK = RecipeBook(REPO / "recipes", REPO / "patches")
FA = BOOK.load("flash-attn")


def _content_problems(wheel: Path, recipe: Recipe) -> list[str]:
    """The recipe's content rules (verify.top-level, verify.excluded) on ``wheel``."""
    return content_problems(wheel, recipe.verify.top_level, recipe.verify.excluded)


BASE = """\
format: 1
name: demo
version: "1.0"
sources:
  - sdist: {filename: demo-1.0.tar.gz, sha256: %s}
build:
  kind: extension
""" % ("0" * 64)


def test_flash_attn_declares_its_subsets() -> None:
    assert [(d.name, d.env, d.multiple) for d in FA.subsets] == [
        ("hdim", "FLASH_ATTN_HDIMS", True), ("dtype", "FLASH_ATTN_DTYPES", True),
        ("bwd", "FLASH_ATTN_BACKWARD", False), ("splitkv", "FLASH_ATTN_SPLITKV", False)]
    assert FA.build.job_memory_gib == 7.0
    assert FA.verify.top_level == ("flash_attn", "flash_attn_2_cuda")
    assert FA.verify.excluded == ("flash_attn/cute", "hopper")


@pytest.mark.parametrize(("entries", "label", "env"), [
    ([], "", {"FLASH_ATTN_HDIMS": "32,64,96,128,192,256", "FLASH_ATTN_DTYPES": "fp16,bf16",
              "FLASH_ATTN_BACKWARD": "yes", "FLASH_ATTN_SPLITKV": "yes"}),
    (["hdim=128"], "hd128", {"FLASH_ATTN_HDIMS": "128"}),
    (["hdim=128,64", "dtype=bf16"], "hd64hd128bf16", {"FLASH_ATTN_HDIMS": "64,128",
                                                       "FLASH_ATTN_DTYPES": "bf16"}),
    (["hdim=128 dtype=bf16;bwd=no", "splitkv=no"], "hd128bf16fwdnosplit",
     {"FLASH_ATTN_BACKWARD": "no", "FLASH_ATTN_SPLITKV": "no"}),
    (["hdim=32,64,96,128,192,256", "bwd=yes"], "", {}),  # everything: the full build
])
def test_subset_label_and_environment(entries: list[str], label: str,
                                      env: dict[str, str]) -> None:
    subset = select_subset(FA, parse_subset_entries(entries))
    assert subset_label(FA, subset) == label
    assert (subset == ()) == (label == "")
    full = subset_environment(FA, subset)
    assert set(full) == {"FLASH_ATTN_HDIMS", "FLASH_ATTN_DTYPES", "FLASH_ATTN_BACKWARD",
                         "FLASH_ATTN_SPLITKV"}  # always all set: the shell cannot leak in
    assert {k: full[k] for k in env} == env


@pytest.mark.parametrize(("entries", "message"), [
    (["hdims=128"], "unknown subset key 'hdims' (did you mean 'hdim'?)"),
    (["hdim=100"], "hdim: unknown value(s) 100; choose from 32,64,96,128,192,256"),
    (["bwd=yes,no"], "bwd takes one value: yes or no"),
    (["hdim=128,128"], "hdim: a value is given twice"),
])
def test_subset_mistakes_are_config_errors(entries: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        select_subset(FA, parse_subset_entries(entries))
    assert message in exc.value.what
    assert "hdim=32,64,96,128,192,256" in (exc.value.why or "")


@pytest.mark.parametrize(("entries", "message"), [
    (["hdim"], "--subset 'hdim' is not KEY=VALUE[,VALUE...]"),
    (["hdim="], "--subset 'hdim=' is not KEY=VALUE[,VALUE...]"),
    (["hdim=64", "hdim=128"], "--subset names 'hdim' twice"),
])
def test_subset_entries_parsed(entries: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        parse_subset_entries(entries)


def test_recipe_without_subsets_refuses_them() -> None:
    with pytest.raises(ConfigError, match="declares no kernel subsets"):
        select_subset(BOOK.load("causal-conv1d"), parse_subset_entries(["hdim=128"]))


@pytest.mark.parametrize(("snippet", "message"), [
    ("subsets: {hdim: {env: PATH, values: ['1']}}", "'PATH' is not a project switch"),
    ("subsets: {hdim: {env: X_HDIMS}}", "subsets.hdim.values: is required"),
    ("subsets: {hdim: {env: X_HDIMS, values: ['1'], labels: {'1': 'a-b'}}}",
     "must be letters and digits"),
    ("subsets: {hdim: {env: X_HDIMS, values: ['1'], label: x}}", "did you mean 'labels'?"),
    ("build: {kind: extension, job-memory: 7}", "build.job-memory: must be the peak memory"),
    ("verify: {top-level: [a/b]}", "'a/b' is not a top-level module"),
    ("verify: {excluded: [../x]}", "must be a relative path inside the wheel"),
])
def test_new_keys_validated(tmp_path: Path, snippet: str, message: str) -> None:
    body = BASE if snippet.startswith(("subsets", "verify")) else BASE.split("build:")[0]
    rdir = write_recipe(tmp_path, "demo", body + snippet + "\n")
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "patches").load("demo")
    assert message in (exc.value.why or "")


def config(tmp_path: Path, subset: tuple[tuple[str, tuple[str, ...]], ...] = ()
           ) -> cfg.BuildConfig:
    return cfg.resolve(arch="12.0", cache_dir=tmp_path, index_dir=tmp_path / "index",
                       environ={}, subset=subset, project_file=None)


def test_subset_is_in_the_build_key_and_the_label(tmp_path: Path) -> None:
    tool = {"python": "cp311", "torch": "torch==2.14.1", "nvcc": "13.0", "cxx": "13"}
    full = config(tmp_path)
    sub = config(tmp_path, parse_subset_entries(["hdim=128", "dtype=bf16"]))
    same = config(tmp_path, parse_subset_entries(["hdim=128", "dtype=bf16"]))
    assert build_key(FA, full, tool) != build_key(FA, sub, tool)
    assert build_key(FA, sub, tool) == build_key(FA, same, tool)
    # an explicit full selection is the full build, the same key
    everything = config(tmp_path, parse_subset_entries(["hdim=32,64,96,128,192,256"]))
    assert build_key(FA, everything, tool) == build_key(FA, full, tool)
    # a companion is built whole
    assert without_subset(sub).subset == ()

    class Env:
        torch_cuda, torch_major_minor = "13.0", "2.14"

    assert local_label(FA, Env(), full) == "cu130torch2.14sm120"  # type: ignore[arg-type]
    assert local_label(FA, Env(), sub) == "cu130torch2.14sm120hd128bf16"  # type: ignore[arg-type]


@pytest.mark.parametrize(("recorded", "declared", "per_job", "because"), [
    (None, None, None, None),
    (4.0, None, 5.0, "last build peaked at 4.0 GiB per job"),  # 25% headroom
    (None, 7.0, 7.0, "the recipe states a peak of 7 GiB per job"),
    (4.7, 7.0, 7.0, "the recipe states a peak of 7 GiB per job"),  # a subset peaked lower
    (8.0, 7.0, 8.0, "last build peaked at 8.0 GiB per job (the recipe states 7)"),
])
def test_job_memory(recorded: float | None, declared: float | None, per_job: float | None,
                    because: str | None) -> None:
    got = cfg.job_memory_gib(recorded, declared)
    assert (got is None) == (per_job is None)
    if got is not None:
        assert got == (per_job, because)


@pytest.mark.parametrize(("cores", "mem", "jobs"), [
    (2, 20.0, 2),     # the 2-core 24 GB machine: both cores, 14 GiB for two bwd units
    (2, 10.0, 1),     # half of it taken by others: one job, never an OOM
    (16, 120.0, 16),  # the 16-core 128 GB machine: every core (16 x 7 = 112 GiB)
    (16, 60.0, 8),
])
def test_first_build_sized_by_the_recipes_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               cores: int, mem: float, jobs: int) -> None:
    monkeypatch.setattr(cfg, "cpu_count", lambda: cores)
    monkeypatch.setattr(cfg, "memory_available_gib", lambda: mem)
    c = dataclasses.replace(config(tmp_path), jobs=cores,
                            origins=(("jobs", f"auto: {cores} cores"),))
    got, threads, why = cfg.jobs_for(c, "flash-attn", 500, FA.build.job_memory_gib)
    assert (got, threads) == (jobs, 1)
    assert "the recipe states a peak of 7 GiB per job" in why


def test_verify_refuses_foreign_packages(tmp_path: Path) -> None:
    upstream = make_wheel(tmp_path / "a", {
        "flash_attn/__init__.py": "", "flash_attn/cute/__init__.py": "",
        "hopper/__init__.py": "", "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so": b""},
        name="flash-attn", version="2.8.3.post2")
    problems = _content_problems(upstream, FA)
    assert problems == [
        "top-level module(s) or package(s) the recipe does not ship: hopper "
        "(verify.top-level: flash_attn, flash_attn_2_cuda)",
        "flash_attn/cute is in the wheel (1 file(s), e.g. flash_attn/cute/__init__.py): the "
        "recipe excludes it (verify.excluded)",
        "hopper is in the wheel (1 file(s), e.g. hopper/__init__.py): the recipe excludes it "
        "(verify.excluded)"]
    ours = make_wheel(tmp_path / "b", {
        "flash_attn/__init__.py": "", "flash_attn/layers/rotary.py": "",
        "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so": b""},
        name="flash-attn", version="2.8.3.post2")
    assert _content_problems(ours, FA) == []
    # recipes without the keys are not checked
    assert _content_problems(upstream, BOOK.load("causal-conv1d")) == []
