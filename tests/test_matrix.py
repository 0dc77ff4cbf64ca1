"""The build matrix of wheelforge.yaml: validation (every problem at once, with the key
path and a did-you-mean) and its expansion into cells."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import REPO
from wheelforge.errors import ConfigError, RecipeError
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.matrix import (
    DEFAULT_KEEP,
    Canary,
    Cell,
    TorchPin,
    cells,
    load_matrix,
    parse_matrix,
    retention_keep,
)
from wheelforge.recipe.model import Recipe

GOOD = """
defaults:
  arch: "12.0"
matrix:
  recipes: [causal-conv1d, fla-core]
  python: [python3.11, /opt/py312/bin/python3]
  torch:
    - {spec: "torch==2.14.1", cuda: "13.0"}
    - {spec: "torch==2.13.0", cuda: "12.8", pip-args: ["--index-url", "https://example/cu128"]}
  archs: ["12.0", "10.0;12.0"]
  retention: {keep: 3}
"""
PIN_A = TorchPin(spec="torch==2.14.1", cuda="13.0")
PIN_B = TorchPin(spec="torch==2.13.0", cuda="12.8",
                 pip_args=("--index-url", "https://example/cu128"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wheelforge.yaml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str, known: tuple[str, ...] | None = None) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_matrix(path, known)
    prefix = f"{path}: "
    lines = [line.strip() for line in info.value.why.strip().splitlines()]
    assert all(line.startswith(prefix) for line in lines), lines
    return [line[len(prefix):] for line in lines]


def test_a_valid_matrix_loads_into_frozen_data(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, GOOD), known_recipes=("causal-conv1d", "fla-core"))
    assert m.recipes == ("causal-conv1d", "fla-core")
    assert m.pythons == ("python3.11", "/opt/py312/bin/python3")
    assert m.torches == (PIN_A, PIN_B)
    assert m.arch_sets == ("12.0", "10.0;12.0")
    assert m.keep == 3
    with pytest.raises(AttributeError):
        m.keep = 4  # type: ignore[misc]


def test_every_problem_is_reported_at_once_with_its_key_path(tmp_path: Path) -> None:
    found = problems(tmp_path, """
matrx: {}
matrix:
  recipes: [causal-conv1d, causal-conv1dd, causal_conv1d]
  pyhton: [python3]
  torch:
    - "torch==2.14.1"
    - {spec: "numpy==2", cuda: 13.0}
    - {spec: "torch==2.14.1", cuda: "13.0", pip_args: []}
    - {spec: "torch===", cuda: "13"}
  archs: ["12.0", "12,0", 12.0, "sm_120", "12.0;"]
  retention: {keep: 0, keep_newest: 2}
""", known=("causal-conv1d", "fla-core"))
    assert found == [
        "matrx: unknown key; did you mean 'matrix'?",
        "matrix.pyhton: unknown key; did you mean 'python'?",
        "matrix.recipes[1]: no recipe named 'causal-conv1dd'; did you mean 'causal-conv1d'?",
        "matrix.recipes[2]: 'causal_conv1d' is listed twice",
        "matrix.torch[0]: must be a mapping such as {spec: 'torch==2.14.1', cuda: \"13.0\"}: "
        "the CUDA flavour is part of the pin",
        "matrix.torch[1].spec: 'numpy==2' is not a requirement on torch",
        "matrix.torch[1].cuda: must be a string (quote it in YAML: \"13.0\")",
        "matrix.torch[2].pip_args: unknown key; did you mean 'pip-args'?",
        "matrix.torch[3].spec: 'torch===' is not a valid requirement: Expected end or "
        "semicolon (after name and no valid version specifier)",
        "matrix.torch[3].cuda: is required: the CUDA version of that torch build as "
        "MAJOR.MINOR, e.g. \"13.0\"; got '13'",
        "matrix.archs[1]: '12,0' is the same arch set as an earlier entry",
        "matrix.archs[2]: must be a non-empty string, got 12.0 (quote numbers in YAML: "
        "\"12.0\")",
        "matrix.archs[3]: 'sm_120' is not a CUDA architecture (entries are compute "
        "capabilities as in TORCH_CUDA_ARCH_LIST: MAJOR.MINOR, optionally with an 'a' or "
        "'f' suffix and '+PTX')",
        "matrix.archs[4]: '12.0;' is the same arch set as an earlier entry",
        "matrix.retention.keep_newest: unknown key; did you mean 'keep'?",
        "matrix.retention.keep: must be a positive integer, got 0",
    ] or found  # (shown whole on failure)


@pytest.mark.parametrize(("text", "expected"), [
    ("defaults: {}\n", ["matrix: is required: a mapping with recipes, python, torch, archs, "
                        "retention"]),
    ("matrix: [a]\n", ["matrix: must be a mapping, got list"]),
    ("matrix: {}\n", ["matrix.recipes: is required: a list",
                      "matrix.torch: is required: a list of {spec, cuda[, pip-args]}",
                      "matrix.archs: is required: a list"]),
    ("matrix: {recipes: [], torch: [], archs: []}\n",
     ["matrix.recipes: must not be empty",
      "matrix.torch: must be a non-empty list of {spec, cuda[, pip-args]}",
      "matrix.archs: must not be empty"]),
])
def test_missing_sections(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert problems(tmp_path, text) == expected


def test_yaml_errors_and_missing_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_matrix(write(tmp_path, "matrix: [\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_matrix(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is not a project file"):
        parse_matrix(["x"], tmp_path / "w.yaml")


def test_cells_multiply_extensions_and_not_pure_recipes(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, GOOD))
    out = cells(m, {"causal-conv1d": "extension", "fla-core": "pure"})
    ext = [c for c in out if c.recipe == "causal-conv1d"]
    assert len(ext) == 2 * 2 * 2  # pythons x torches x arch sets
    assert len(set(ext)) == len(ext)
    assert ext[0] == Cell(recipe="causal-conv1d", python="python3.11", torch=PIN_A, archs="12.0")
    assert ext[-1] == Cell(recipe="causal-conv1d", python="/opt/py312/bin/python3", torch=PIN_B,
                           archs="10.0;12.0")
    # one py3-none-any wheel whatever the python, torch or archs: one cell, first env
    assert [c for c in out if c.recipe == "fla-core"] == [
        Cell(recipe="fla-core", python="python3.11", torch=PIN_A, archs=None)]
    assert out[0].label == "causal-conv1d | python3.11 | torch==2.14.1 | cu13.0 | arch 12.0"
    assert out[-1].label == "fla-core"


def test_no_python_means_the_running_interpreter(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, """
matrix:
  recipes: [tinyext]
  torch: [{spec: "torch==2.14.1", cuda: "13.0"}]
  archs: "12.0"
"""))
    assert m.pythons == () and m.arch_sets == ("12.0",) and m.keep == DEFAULT_KEEP
    assert cells(m) == [Cell(recipe="tinyext", python=None, torch=PIN_A, archs="12.0")]


def test_retention_keep(tmp_path: Path) -> None:
    assert retention_keep(write(tmp_path, GOOD)) == 3
    assert retention_keep(write(tmp_path, "defaults: {}\n")) == DEFAULT_KEEP
    assert retention_keep(tmp_path / "absent.yaml") == DEFAULT_KEEP


def test_the_shipped_project_file_has_a_valid_matrix() -> None:
    assert "matrix" in yaml.safe_load((REPO / "wheelforge.yaml").read_text())
    names = tuple(p.stem for p in (REPO / "recipes").glob("*.yaml"))
    m = load_matrix(REPO / "wheelforge.yaml", known_recipes=names, recipes=BOOK.load)
    assert set(m.recipes) <= set(names) and m.torches and m.arch_sets
    # a flash-attn cell takes hours on CI's 2 cores: its subsets are a commented example
    assert "flash-attn" not in m.recipes and m.subsets == ()


def test_the_shipped_flash_attn_subset_is_valid_when_uncommented(tmp_path: Path) -> None:
    """The commented cell docs/flash-attn.md tells 16-core nightlies to uncomment."""
    shipped = (REPO / "wheelforge.yaml").read_text()
    on = (shipped.replace("  # subsets:\n  #   flash-attn:\n  #     - ",
                          "  subsets:\n    flash-attn:\n      - ")
          .replace("mamba-ssm-stable]\n", "mamba-ssm-stable, flash-attn]\n", 1))
    assert on.count("flash-attn]") == 1 and "\n  subsets:\n" in on
    m = load_matrix(write(tmp_path, on), BOOK.names(), BOOK.load)
    assert m.subsets == (("flash-attn", ((("hdim", ("128",)), ("dtype", ("bf16",))),)),)


# --------------------------------------------------------------------------- kernel subsets

BOOK = RecipeBook(REPO / "recipes", REPO / "patches")
SUBSETS = """
matrix:
  recipes: [causal-conv1d, flash-attn]
  torch: [{spec: "torch==2.14.1", cuda: "13.0"}]
  archs: ["12.0", "10.0;12.0"]
  subsets:
    flash-attn:
%s
"""


def subsets_matrix(tmp_path: Path, entries: str) -> Path:
    return write(tmp_path, SUBSETS % "\n".join(f"      - {e}" for e in entries.split("\n")))


def test_subsets_load_as_the_shortest_choice_in_the_recipes_order(tmp_path: Path) -> None:
    path = subsets_matrix(tmp_path, '{dtype: bf16, hdim: "128"}\n'
                                    '{hdim: [64, "128"], bwd: "no", splitkv: "yes"}\nfull')
    m = load_matrix(path, BOOK.names(), BOOK.load)
    assert m.subsets == (("flash-attn", (
        (("hdim", ("128",)), ("dtype", ("bf16",))),
        (("hdim", ("64", "128")), ("bwd", ("no",))),  # splitkv=yes is the full build's
        ())),)


def test_cells_give_one_cell_per_subset_and_the_full_build_only_when_listed(
        tmp_path: Path) -> None:
    m = load_matrix(subsets_matrix(tmp_path, '{hdim: "128", dtype: bf16}\n{}'), BOOK.names(),
                    BOOK.load)
    out = cells(m)
    assert [c.recipe for c in out] == ["causal-conv1d"] * 2 + ["flash-attn"] * 4
    assert all(c.subset == () for c in out[:2])  # a recipe not under subsets: whole
    sub = (("hdim", ("128",)), ("dtype", ("bf16",)))
    assert [(c.archs, c.subset) for c in out[2:]] == [
        ("12.0", sub), ("12.0", ()), ("10.0;12.0", sub), ("10.0;12.0", ())]
    assert out[2].label == ("flash-attn | python | torch==2.14.1 | cu13.0 | arch 12.0 "
                            "[hdim=128 dtype=bf16]")
    assert out[3].label == "flash-attn | python | torch==2.14.1 | cu13.0 | arch 12.0"
    only = load_matrix(subsets_matrix(tmp_path, '{bwd: "no"}'), BOOK.names(), BOOK.load)
    assert [c.subset for c in cells(only) if c.recipe == "flash-attn"] == [
        (("bwd", ("no",)),)] * 2  # no full build: it is not listed


def test_every_subset_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, """
matrix:
  recipes: [causal-conv1d, flash-attn]
  torch: [{spec: "torch==2.14.1", cuda: "13.0"}]
  archs: ["12.0"]
  subsets:
    flash-atn: [full]
    causal-conv1d: [{hdim: "128"}]
    fla-core: [full]
    flash-attn:
      - {hdims: "128"}
      - {hdim: "100", dtype: bf16}
      - {bwd: no}
      - {bwd: "yes,no"}
      - {hdim: 128.0}
      - "hdim=128"
      - {hdim: []}
      - full
      - {splitkv: "yes"}
      - {dtype: "bf16", hdim: "128"}
      - {hdim: "128", dtype: bf16}
""")
    with pytest.raises(ConfigError) as info:
        load_matrix(path, BOOK.names(), BOOK.load)
    err = info.value
    assert err.what == f"the build matrix in {path} has 12 problem(s)"
    declared = ("flash-attn declares hdim=32,64,96,128,192,256; dtype=fp16,bf16; bwd=yes,no; "
                "splitkv=yes,no")
    found = [line.strip().removeprefix(f"{path}: ") for line in err.why.strip().splitlines()]
    assert found == [
        "matrix.subsets.flash-atn: 'flash-atn' is not in matrix.recipes; did you mean "
        "'flash-attn'?",
        "matrix.subsets.causal-conv1d: causal-conv1d declares no kernel subsets (no subsets: "
        "in its recipe); remove it from matrix.subsets",
        "matrix.subsets.fla-core: 'fla-core' is not in matrix.recipes; add it there to build "
        "subsets of it",
        f"matrix.subsets.flash-attn[0]: unknown subset key 'hdims' (did you mean 'hdim'?) "
        f"({declared})",
        f"matrix.subsets.flash-attn[1]: hdim: unknown value(s) 100; choose from "
        f"32,64,96,128,192,256 ({declared})",
        "matrix.subsets.flash-attn[2].bwd: must be a string or a list of strings, got False "
        "(quote values in YAML: bwd: \"no\", hdim: \"128\")",
        f"matrix.subsets.flash-attn[3]: bwd takes one value: yes or no ({declared})",
        "matrix.subsets.flash-attn[4].hdim: must be a string or a list of strings, got 128.0 "
        "(quote values in YAML: bwd: \"no\", hdim: \"128\")",
        "matrix.subsets.flash-attn[5]: must be a mapping of subset keys to values, e.g. "
        "{hdim: \"128\", dtype: bf16}, or 'full' for the full build; got 'hdim=128'",
        "matrix.subsets.flash-attn[6].hdim: names no value",
        "matrix.subsets.flash-attn[8]: is the same build as entry [7] (the full build: it "
        "asks for what the full build holds)",
        "matrix.subsets.flash-attn[10]: is the same build as entry [9]",
    ] or found
    assert err.fix and "docs/nightly.md" in err.fix


@pytest.mark.parametrize(("subsets", "expected"), [
    ("[a]", "matrix.subsets: must be a mapping of recipe names to lists of subsets, e.g. "
            "{flash-attn: [{hdim: \"128\", dtype: bf16}]}"),
    ("{flash-attn: []}", "matrix.subsets.flash-attn: must be a non-empty list of subsets, "
                         "e.g. [{hdim: \"128\"}, full]"),
    ("{flash-attn: full}", "matrix.subsets.flash-attn: must be a non-empty list of subsets, "
                           "e.g. [{hdim: \"128\"}, full]"),
])
def test_malformed_subsets(tmp_path: Path, subsets: str, expected: str) -> None:
    text = ("matrix: {recipes: [flash-attn], torch: [{spec: \"torch==2.14.1\", cuda: \"13.0\"}],"
            f" archs: [\"12.0\"], subsets: {subsets}}}\n")
    assert problems(tmp_path, text) == [expected]


def test_subsets_are_shape_checked_without_the_recipes(tmp_path: Path) -> None:
    """retention_keep and callers without a recipes directory parse subsets as written."""
    m = load_matrix(subsets_matrix(tmp_path, '{hdim: "128,64"}\nfull'))
    assert m.subsets == (("flash-attn", ((("hdim", ("128", "64")),), ())),)


def test_a_recipe_that_does_not_load_is_left_to_its_cells(tmp_path: Path) -> None:
    def broken(name: str) -> Recipe:
        raise RecipeError(f"recipe {name} is broken")
    m = load_matrix(subsets_matrix(tmp_path, '{hdim: "128"}'), BOOK.names(), broken)
    assert m.subsets == (("flash-attn", ((("hdim", ("128",)),),)),)


# --------------------------------------------------------------------------- canary:

CANARY_BASE = """
matrix:
  recipes: [causal-conv1d, mamba-ssm]
  torch: [{spec: "torch==2.14.1", cuda: "13.0"}]
  archs: ["12.0"]
"""
KNOWN = ("causal-conv1d", "mamba-ssm", "fla-core")


def test_no_canary_section_is_the_default(tmp_path: Path) -> None:
    assert load_matrix(write(tmp_path, CANARY_BASE), KNOWN).canary is None


def test_the_shipped_canary_is_commented_out_and_valid_when_uncommented(tmp_path: Path) -> None:
    names = tuple(p.stem for p in (REPO / "recipes").glob("*.yaml"))
    shipped = (REPO / "wheelforge.yaml").read_text()
    assert load_matrix(REPO / "wheelforge.yaml", known_recipes=names).canary is None
    on = shipped.replace("  # canary: {", "  canary: {")
    assert on != shipped
    m = load_matrix(write(tmp_path, on), known_recipes=names)
    assert m.canary == Canary(recipes=("causal-conv1d", "mamba-ssm"))


@pytest.mark.parametrize("text", ["  canary: [causal-conv1d, Mamba_SSM]\n",
                                  "  canary: {recipes: [causal-conv1d, mamba-ssm]}\n"])
def test_canary_as_a_list_or_a_mapping(tmp_path: Path, text: str) -> None:
    m = load_matrix(write(tmp_path, CANARY_BASE + text), KNOWN)
    assert m.canary == Canary(recipes=("causal-conv1d", "mamba-ssm"))
    assert m.canary.index_url == "https://pypi.org" and m.canary.timeout == 30.0


def test_canary_index_and_timeout(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, CANARY_BASE + "  canary: {recipes: mamba-ssm, "
                          "index-url: 'http://127.0.0.1:8080/', timeout: 5}\n"), KNOWN)
    assert m.canary == Canary(recipes=("mamba-ssm",), index_url="http://127.0.0.1:8080",
                              timeout=5.0)


def test_every_canary_problem_at_once(tmp_path: Path) -> None:
    found = problems(tmp_path, CANARY_BASE + """  canary:
    recipe: [x]
    recipes: [causal-conv1dd, fla-core, nope, mamba-ssm, mamba_ssm, 3]
    index-url: pypi.org
    timeout: 0
""", known=KNOWN)
    assert found == [
        "matrix.canary.recipe: unknown key; did you mean 'recipes'?",
        "matrix.canary.recipes[5]: must be a non-empty string, got 3 (quote numbers in "
        "YAML: \"12.0\")",
        "matrix.canary.recipes[0]: 'causal-conv1dd' is not a recipe; did you mean "
        "'causal-conv1d'?",
        "matrix.canary.recipes[1]: 'fla-core' is not in matrix.recipes; a canary is one of "
        "matrix.recipes: causal-conv1d, mamba-ssm",
        "matrix.canary.recipes[2]: 'nope' is not a recipe; a canary is one of "
        "matrix.recipes: causal-conv1d, mamba-ssm",
        "matrix.canary.recipes[4]: 'mamba_ssm' is listed twice",
        "matrix.canary.index-url: must be an http(s) URL of an index with the PyPI JSON "
        "API (e.g. https://pypi.org), got 'pypi.org'",
        "matrix.canary.timeout: must be a number of seconds above 0 and at most 3600, got 0",
    ] or found


@pytest.mark.parametrize("value, shown", [(".nan", "nan"), ("1.0e+308", "1e+308"),
                                          (".inf", "inf"), ("3601", "3601")])
def test_a_canary_timeout_is_finite_and_bounded(tmp_path: Path, value: str, shown: str) -> None:
    """Before: NaN and 1e308 passed `> 0`, and the night met them as a traceback."""
    canary = f"  canary: {{recipes: [mamba-ssm], timeout: {value}}}\n"
    found = problems(tmp_path, CANARY_BASE + canary, known=KNOWN)
    assert found == ["matrix.canary.timeout: must be a number of seconds above 0 and at most "
                     f"3600, got {shown}"], found


@pytest.mark.parametrize(("text", "expected"), [
    ("  canary: []\n", ["matrix.canary: must not be empty"]),
    ("  canary: {}\n", ["matrix.canary.recipes: is required: a list"]),
    ("  canary: 3\n", ["matrix.canary: must be a list of recipe names or a mapping with "
                       "recipes, got int, e.g. {recipes: [causal-conv1d]}"]),
    ("  canary: [causal-conv1d, 1.5]\n", ["matrix.canary[1]: must be a non-empty string, "
                                          "got 1.5 (quote numbers in YAML: \"12.0\")"]),
])
def test_canary_shapes(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert problems(tmp_path, CANARY_BASE + text, KNOWN) == expected
