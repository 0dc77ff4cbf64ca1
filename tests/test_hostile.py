"""Hostile and clumsy inputs (issue 16): every fixture is made here, by the test.

One section per class: YAML, recipe names, recipe environment, patches, archives,
built wheels.  Each case is a row of a table, so the number of trial cases per class is
the number of rows; every case must end in the documented error class (exit code), with
the offending key, member or path named, and never in a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, write_recipe
from wheelforge.errors import ConfigError, RecipeError
from wheelforge.recipe import RecipeBook, refused_env

PURE = ("format: 1\nname: demo\nversion: '1.0'\n"
        "sources: [{sdist: {filename: demo-1.0.tar.gz, sha256: '" + "0" * 64 + "'}}]\n"
        "build: {kind: pure}\n")


def wf(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wheelforge", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def assert_clean_failure(res: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------
# YAML: recipes and wheelforge.yaml share one loader

def _bomb() -> str:
    """The classic billion laughs: 9 levels of 9 aliases, ~387 million nodes expanded."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


YAML_CASES = [
    # (id, file bytes, expected text in the error)
    ("duplicate-top-key", (PURE + "name: other\n").encode(),
     "line 6: duplicate key 'name' (first at line 2)"),
    ("duplicate-nested-key", PURE.replace("build: {kind: pure}", "build:\n  kind: pure\n"
                                          "  kind: extension").encode(),
     "line 7: duplicate key 'kind' (first at line 6)"),
    ("duplicate-in-flow-mapping", PURE.replace("{kind: pure}", "{kind: pure, kind: pure}")
     .encode(), "duplicate key 'kind' (first at line 5)"),
    ("alias-bomb", (PURE + "summary: x\n" + _bomb()).encode(), "anchor &a is not allowed"),
    ("plain-alias", (PURE + "homepage: *nowhere\n").encode(), "alias *nowhere is not allowed"),
    ("merge-key-alias", (PURE + "x: &base {k: 1}\ny: {<<: *base}\n").encode(),
     "anchor &base is not allowed"),
    ("deep-flow-nesting", (PURE + "summary: " + "[" * 50000 + "]" * 50000 + "\n").encode(),
     "nested more than 32 levels deep"),
    ("deep-block-nesting", (PURE + "".join("  " * i + f"k{i}:\n" for i in range(100)))
     .encode(), "nested more than 32 levels deep"),
    ("latin-1", PURE.encode() + "summary: caf\xe9\n".encode("latin-1"),
     "not UTF-8 (byte 0xe9)"),
    ("utf-16", PURE.encode("utf-16"), "byte offset 0: not UTF-8 (byte 0xff)"),
    ("python-tag", (PURE + "summary: !!python/object/apply:os.system [id]\n").encode(),
     "could not determine a constructor"),
    ("unhashable-key", (PURE + "? [a, b]\n: 1\n").encode(), "unhashable"),
]


@pytest.mark.parametrize("data, expected", [c[1:] for c in YAML_CASES],
                         ids=[c[0] for c in YAML_CASES])
def test_hostile_recipe_yaml(tmp_path: Path, data: bytes, expected: str) -> None:
    rdir = tmp_path / "recipes"
    rdir.mkdir()
    (rdir / "demo.yaml").write_bytes(data)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "patches").load("demo")
    assert exc.value.what == f"recipe {rdir / 'demo.yaml'} is not valid YAML"
    assert str(rdir / "demo.yaml") in exc.value.why
    assert expected in exc.value.why


@pytest.mark.parametrize("data, expected", [c[1:] for c in YAML_CASES],
                         ids=[c[0] for c in YAML_CASES])
def test_hostile_project_file_yaml(tmp_path: Path, data: bytes, expected: str) -> None:
    from wheelforge.config import load_project_file
    from wheelforge.matrix import load_matrix, retention_keep

    path = tmp_path / "wheelforge.yaml"
    path.write_bytes(data.replace(b"format: 1\n", b"defaults: {}\n", 1))
    for load in (load_project_file, load_matrix, retention_keep):
        with pytest.raises(ConfigError) as exc:
            load(path)  # type: ignore[operator]
        assert expected in exc.value.why, load
        assert str(path) in exc.value.why


def test_non_utf8_names_the_byte_offset(tmp_path: Path) -> None:
    rdir = write_recipe(tmp_path, "demo", "")
    data = PURE.encode() + "summary: caf\xe9\n".encode("latin-1")
    (rdir / "demo.yaml").write_bytes(data)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "patches").load("demo")
    assert exc.value.why.endswith(f"demo.yaml: byte offset {data.index(0xe9)}: not UTF-8 (byte "
                                  "0xe9); save the file as UTF-8")


def test_yaml_errors_through_the_cli(tmp_path: Path) -> None:
    """The bomb and the duplicate key end as recipe and config errors, not tracebacks."""
    write_recipe(tmp_path, "demo", PURE + _bomb())
    assert_clean_failure(wf("show", "demo", "--recipes", str(tmp_path / "recipes")), 3,
                         "is not valid YAML", "anchor &a is not allowed")
    (tmp_path / "wheelforge.yaml").write_bytes(b"defaults: {arch: '12.0', arch: '9.0'}\n")
    assert_clean_failure(wf("doctor", cwd=tmp_path), 2, "duplicate key 'arch' (first at line 1)")
    (tmp_path / "wheelforge.yaml").write_bytes(b"defaults: {}\n# \xff\n")
    assert_clean_failure(wf("doctor", cwd=tmp_path), 2, "wheelforge.yaml: byte offset 15")


def test_the_shipped_yaml_still_loads() -> None:
    from wheelforge.config import load_project_file
    from wheelforge.matrix import load_matrix

    book = RecipeBook(REPO / "recipes", REPO / "patches")
    assert len(book.load_all()) == len(book.names()) >= 3
    assert load_project_file(REPO / "wheelforge.yaml")
    assert load_matrix(REPO / "wheelforge.yaml", book.names()).recipes


# ------------------------------------------------------------------------------------------
# names: a recipe name from the command line is never a path

NAME_CASES = ["/etc/passwd", "/some/dir/name", "../outside", "sub/demo", "./demo",
              "demo/", "", " demo", "demo\n", "-demo", "demo\x00", "~/demo"]


@pytest.mark.parametrize("name", NAME_CASES)
def test_a_name_is_not_a_path(tmp_path: Path, name: str) -> None:
    outside = tmp_path / "some" / "dir"
    outside.mkdir(parents=True)
    (outside / "name.yaml").write_text(PURE.replace("demo", "name"))
    rdir = write_recipe(tmp_path / "book", "demo", PURE)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "book" / "patches").load(name)
    assert exc.value.what == f"{name!r} is not a project name"
    assert "never by a path" in exc.value.why


def test_show_refuses_a_path(tmp_path: Path) -> None:
    outside = tmp_path / "some" / "dir"
    outside.mkdir(parents=True)
    (outside / "name.yaml").write_text(PURE.replace("demo", "name"))
    res = wf("show", str(outside / "name"), "--recipes", str(REPO / "recipes"))
    assert_clean_failure(res, 3, f"'{outside / 'name'}' is not a project name")
    assert res.stdout == ""


def test_names_still_normalize(tmp_path: Path) -> None:
    rdir = write_recipe(tmp_path, "demo-x", PURE.replace("name: demo", "name: demo-x"))
    book = RecipeBook(rdir, tmp_path / "patches")
    assert book.load("Demo_X").name == "demo-x"
    assert book.load("demo.x").name == "demo-x"


# ------------------------------------------------------------------------------------------
# recipe environment: nothing that changes which code runs

ENV_REFUSED = ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONWARNINGS",
               "PYTHONSAFEPATH", "pythonpath", "VIRTUAL_ENV", "PIP_INDEX_URL",
               "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE", "UV_INDEX_URL", "LD_PRELOAD",
               "LD_LIBRARY_PATH", "LD_AUDIT", "Ld_Preload", "DYLD_INSERT_LIBRARIES",
               "JEMALLOC_PRELOAD", "GCONV_PATH", "OPENSSL_CONF", "PATH", "COMPILER_PATH",
               "GCC_EXEC_PREFIX", "BASH_ENV", "ENV", "PERL5OPT", "NODE_OPTIONS",
               "GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL", "HOME", "CC", "CXX", "LDSHARED",
               "CUDAHOSTCXX", "PYTORCH_NVCC", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
               "CFLAGS", "LDFLAGS", "CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_CUDA_COMPILER",
               "CMAKE_TOOLCHAIN_FILE", "CCACHE_PREFIX", "CCACHE_DIR", "SCCACHE_BUCKET",
               "CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS",
               "WHEELFORGE_COMPILE_CACHE"]
ENV_ALLOWED = ["CAUSAL_CONV1D_FORCE_BUILD", "FLASH_ATTENTION_SKIP_CUDA_BUILD", "BUILD_TARGET",
               "FLA_FAST", "MY_PATHFINDER", "HOMEBREW_NO_AUTO_UPDATE", "ENVIRONMENT"]


@pytest.mark.parametrize("key", ENV_REFUSED)
def test_recipe_env_refused(tmp_path: Path, key: str) -> None:
    body = PURE.replace("build: {kind: pure}", f"build:\n  kind: pure\n  env: {{{key}: 'x'}}")
    rdir = write_recipe(tmp_path, "demo", body)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "patches").load("demo")
    assert f"build.env.{key}: may not be set by a recipe: " in exc.value.why
    assert refused_env(key) is not None


@pytest.mark.parametrize("key", ENV_ALLOWED)
def test_recipe_env_project_switches_allowed(tmp_path: Path, key: str) -> None:
    body = PURE.replace("build: {kind: pure}", f"build:\n  kind: pure\n  env: {{{key}: 'x'}}")
    rdir = write_recipe(tmp_path, "demo", body)
    assert RecipeBook(rdir, tmp_path / "patches").load("demo").build.env == ((key, "x"),)


def test_recipe_env_every_bad_key_named_at_once(tmp_path: Path) -> None:
    body = PURE.replace("build: {kind: pure}", "build:\n  kind: pure\n  env: {PYTHONPATH: /x, "
                        "LD_PRELOAD: /y.so, OK_SWITCH: '1', PATH: /z}")
    write_recipe(tmp_path, "demo", body)
    res = wf("show", "demo", "--recipes", str(tmp_path / "recipes"))
    assert_clean_failure(res, 3, "has 3 problem(s)", "build.env.PYTHONPATH", "build.env.LD_PRELOAD",
                         "build.env.PATH")
    assert "OK_SWITCH" not in res.stderr


def test_recipe_env_table_is_documented() -> None:
    from wheelforge.recipe import REFUSED_ENV

    doc = (REPO / "docs" / "recipe-format.md").read_text()
    for patterns, _why in REFUSED_ENV:
        for pattern in patterns:
            assert f"`{pattern}`" in doc, pattern
