"""A second newcomer day (issue 53's judge, done before the judge): what a new user read
that was not so, each reproduced here in-process (unit tier)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from wheelforge.builder.env.buildenv import BuildEnv


def _env(torch: str | None, dists: tuple[tuple[str, str], ...]) -> BuildEnv:
    return BuildEnv(python=Path(sys.executable), managed=True, python_version="3.11.7",
                    python_tag="cp311", torch_version=torch, torch_cuda="13.0" if torch else None,
                    distributions=dists)


def test_a_pure_recipes_build_env_is_not_said_to_have_no_torch() -> None:
    """`make build` printed, for fla-core, "managed env .../8b92... (Python 3.11.7, no
    torch)" and, a line later for causal-conv1d, the same environment with torch
    2.14.1: a pure recipe does not ask for torch's version, and its absence is not "no
    torch"."""
    pure = _env(None, (("setuptools", "80.0"), ("torch", "2.14.1+cu130")))
    assert "no torch" not in pure.describe()
    assert pure.describe().endswith("(Python 3.11.7, torch 2.14.1+cu130, not needed by this "
                                    "build)")
    assert _env(None, (("setuptools", "80.0"),)).describe().endswith(", no torch)")
    assert _env("2.14.1+cu130", ()).describe().endswith(
        "(Python 3.11.7, torch 2.14.1+cu130 (CUDA 13.0))")


def test_a_recipe_without_format_is_told_it_is_required(tmp_path: Path) -> None:
    """`wheelforge check` of a new recipe holding only `name: foo` said "format: must be 1
    (the recipe format version), got None" (Python's word for nothing), beside "version:
    is required" for the key missing the same way."""
    from wheelforge.errors import RecipeError
    from wheelforge.recipe.format import parse_recipe

    with pytest.raises(RecipeError) as exc:
        parse_recipe({"name": "foo"}, tmp_path / "foo.yaml", tmp_path / "patches")
    text = f"{exc.value.what}\n{exc.value.why}"
    assert "None" not in text, text
    assert "format: is required: format: 1 (the recipe format version)" in text, text
    with pytest.raises(RecipeError) as exc:
        parse_recipe({"format": 2, "name": "foo"}, tmp_path / "foo.yaml", tmp_path / "patches")
    assert "format: must be 1 (the recipe format version), got 2" in exc.value.why


@pytest.mark.parametrize("value", ["of", "disabled", "sometimes", "alwyas"])
def test_a_stack_check_setting_that_is_none_is_an_error_before_anything_runs(
        value: str) -> None:
    """WHEELFORGE_STACK_CHECK=of (a typo of off) ran the check, silently: any value but
    the off words and always meant on.  It is a ConfigError naming the settings (the build
    reads it before anything is built)."""
    from wheelforge.cli.stack import gate_disabled, gate_forced
    from wheelforge.errors import ConfigError

    for read in (gate_disabled, gate_forced):
        with pytest.raises(ConfigError) as exc:
            read({"WHEELFORGE_STACK_CHECK": value})
        assert "off, always or on" in (exc.value.fix or "")
    assert gate_disabled({"WHEELFORGE_STACK_CHECK": "Off"}) == "WHEELFORGE_STACK_CHECK=Off"
    assert gate_disabled({}) is None and not gate_forced({})
    assert gate_forced({"WHEELFORGE_STACK_CHECK": "always"})
    assert gate_disabled({"WHEELFORGE_STACK_CHECK": "on"}) is None


def test_max_jobs_that_is_no_number_says_what_to_set() -> None:
    """`MAX_JOBS=abc wheelforge doctor` said "MAX_JOBS must be a positive integer, got
    'abc'" and nothing more: no fix."""
    from wheelforge.builder.config import resolve
    from wheelforge.errors import ConfigError

    for var in ("MAX_JOBS", "NVCC_THREADS"):
        with pytest.raises(ConfigError) as exc:
            resolve(environ={var: "abc"})
        assert exc.value.what == f"{var} must be a positive integer, got 'abc'"
        assert f"{var}=2" in (exc.value.fix or "") and "unset it" in (exc.value.fix or "")


def test_the_readme_and_the_makefile_give_test_fast_one_time() -> None:
    """README said `make test-fast` takes about 1 min on 2 cores, the Makefile's own
    description about 2 min (measured: 54 s of pytest time in CI's run, 106 s at load
    11-16)."""
    import re

    repo = Path(__file__).resolve().parent.parent
    readme = (repo / "README.md").read_text(encoding="utf-8")
    makefile = (repo / "Makefile").read_text(encoding="utf-8")
    said = re.search(r"^make test-fast +#.*?: (.+?) on 2 cores", readme, re.M)
    target = re.search(r"^test-fast:.*?## .*?; (.+?) on 2 cores", makefile, re.M)
    assert said and target, (said, target)
    assert said.group(1) == target.group(1) == "1-2 min"


@pytest.mark.parametrize("text", ["hello\n", "- a\n- b\n", "\n"])
def test_a_project_file_that_is_no_mapping_says_why_and_what_to_pass(
        tmp_path: Path, text: str) -> None:
    """`wheelforge build --config /etc/passwd` said "/etc/passwd must be a mapping", and
    nothing more; `nightly plan` said "... is not a mapping" with "fix: correct the keys
    above" and no keys above."""
    from wheelforge.builder.config import load_project_file
    from wheelforge.errors import ConfigError
    from wheelforge.recipe.matrix import load_matrix

    path = tmp_path / "wheelforge.yaml"
    path.write_text(text)
    readers = [load_matrix] + ([load_project_file] if text.strip() else [])
    for read in readers:
        with pytest.raises(ConfigError) as exc:
            read(path)
        err = exc.value
        assert err.why and err.fix and "keys above" not in err.fix, (read, err.why, err.fix)
        assert "--config" in err.fix and "NoneType" not in err.why


def test_patch_rebase_onto_an_sdist_that_is_not_there_says_what_to_pass(
        tmp_path: Path) -> None:
    """`wheelforge patch causal-conv1d rebase --sdist /nope.tar.gz` said "--sdist
    /nope.tar.gz: no such file" and no fix."""
    from cli_inprocess import run_wheelforge

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "work").mkdir()
    ran = run_wheelforge("patch", "causal-conv1d", "rebase", "--onto", "1.8.0", "--sdist",
                         tmp_path / "nope.tar.gz", "--sha256", "a" * 64, "--recipes",
                         repo / "recipes", "--from", tmp_path / "work", cwd=tmp_path)
    assert ran.returncode == 2, ran.stderr
    assert f"--sdist {tmp_path / 'nope.tar.gz'}: no such file" in ran.stderr
    assert "fix: pass the new release's sdist" in ran.stderr, ran.stderr


def test_the_landing_page_says_consumer_config_prints_and_for_what(tmp_path: Path) -> None:
    """The page said `wheelforge consumer-config --format uv` "writes them into a uv.toml":
    it writes nothing (it prints), and what it prints first is a uv project's
    pyproject.toml section, the uv.toml form beside it."""
    from conftest import make_wheel
    from wheelforge import index

    wheel = make_wheel(tmp_path / "dist", {"wf_demo/__init__.py": ""}, name="wf-demo",
                       version="1.0+wf")
    index.publish(tmp_path / "index", wheel, channel=None, cuda=None, torch=None, archs=(),
                  build_key=None)
    page = (tmp_path / "index" / "index.html").read_text(encoding="utf-8")
    assert "consumer-config --format uv</code> writes" not in page
    assert ("<code>wheelforge consumer-config --format uv</code> prints them for a "
            "<code>uv.toml</code> or a uv project's <code>pyproject.toml</code>") in page


def test_the_nightly_names_the_defaults_and_the_matrix_typos_at_once(tmp_path: Path) -> None:
    """wheelforge.yaml with `archs:` in defaults: and `retension:` in matrix:: `nightly
    plan` named the matrix's typo; corrected, then the defaults' (issue 53: "its errors
    come in two rounds")."""
    from cli_inprocess import run_wheelforge

    repo = Path(__file__).resolve().parent.parent
    text = (repo / "wheelforge.yaml").read_text(encoding="utf-8")
    assert '\n  arch: "12.0"' in text and "\n  retention:" in text
    config = tmp_path / "wheelforge.yaml"
    config.write_text(text.replace('\n  arch: "12.0"', '\n  archs: "12.0"')
                      .replace("\n  retention:", "\n  retension:"))
    ran = run_wheelforge("nightly", "plan", "--config", config, "--recipes", repo / "recipes",
                         "--cache-dir", tmp_path / "cache", cwd=tmp_path)
    assert ran.returncode == 2, ran.stderr
    assert "has 2 problem(s)" in ran.stderr, ran.stderr
    assert "defaults.archs: unknown key; did you mean 'arch'?" in ran.stderr
    assert "matrix.retension: unknown key; did you mean 'retention'?" in ran.stderr


def test_options_before_a_nightly_subcommand_are_refused_with_a_line_that_runs(
        tmp_path: Path) -> None:
    """`wheelforge nightly --jobs 2 plan` said "put them after it: wheelforge nightly plan
    --jobs", which `nightly plan` refuses (it has no --jobs), without the value; `--index`
    was spelled `--index-dir`, `--config` `--project-file`."""
    from cli_inprocess import run_wheelforge

    config = tmp_path / "ci.yaml"
    config.write_text("matrix: {}\n")
    ran = run_wheelforge("nightly", "--config", config, "--index", tmp_path / "idx", "plan",
                         cwd=tmp_path)
    assert ran.returncode == 2
    assert (f"put them after it: wheelforge nightly plan --config {config} --index "
            f"{tmp_path / 'idx'}") in " ".join(ran.stderr.split()), ran.stderr
    ran = run_wheelforge("nightly", "--jobs", "2", "plan", cwd=tmp_path)
    text = " ".join(ran.stderr.split())
    assert ran.returncode == 2 and "put them after it" not in text, text
    assert "not options of `wheelforge nightly plan`: --jobs 2" in text, text
