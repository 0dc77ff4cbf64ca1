"""A user's first day (issue 23), the smaller defects: each as a user meets it, through the
real command, with its message and exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_inprocess import Ran, run_wheelforge
from conftest import make_wheel
from wheelforge import index
from wheelforge.builder.compiling import jobserver

CU130: dict[str, Any] = {"channel": "cu130-torch2.14", "cuda": "13.0", "torch": "2.14.1",
                         "archs": ["sm_120"], "build_key": "key-1"}
LABELLED = "1.7.0+cu130torch2.14sm120"


def wf(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> Ran:
    """The command in this process (tests/cli_inprocess.py), for a test of its text and exit
    status."""
    return run_wheelforge(*args, cwd=cwd, env=env)


def wf_process(*args: str | Path, cwd: Path,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command as a process of its own: for a test of what it runs or leaves behind."""
    return subprocess.run([sys.executable, "-m", "wheelforge", *map(str, args)], cwd=cwd,
                          text=True, capture_output=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def published(tmp_path: Path) -> Path:
    root = tmp_path / "index"
    index.publish(root, make_wheel(tmp_path / "dist", {"causal_conv1d/__init__.py": ""},
                                   name="causal-conv1d", version=LABELLED,
                                   tag="cp311-cp311-linux_x86_64"), **CU130)
    return root


@pytest.mark.parametrize("command", ["yank", "unyank"])
def test_a_version_without_its_local_label_is_a_usage_error_with_a_did_you_mean(
        published: Path, tmp_path: Path, command: str) -> None:
    res = wf(command, "causal-conv1d==1.7.0", "--index", published, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "has no wheel of causal-conv1d==1.7.0" in res.stderr
    assert f"did you mean causal-conv1d=={LABELLED}? (the local label is part of the " \
           "version)" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_misspelt_project_gets_a_did_you_mean(published: Path, tmp_path: Path) -> None:
    res = wf("yank", f"causal-conv1b=={LABELLED}", "--index", published, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "has no project 'causal-conv1b'" in res.stderr
    assert "did you mean causal-conv1d?" in res.stderr


def test_unyank_of_a_version_not_yanked_says_so(published: Path, tmp_path: Path) -> None:
    res = wf("unyank", f"causal-conv1d=={LABELLED}", "--index", published, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"causal-conv1d=={LABELLED} is not yanked: nothing to do\n"
    yanked = wf("yank", f"causal-conv1d=={LABELLED}", "--index", published, cwd=tmp_path)
    assert yanked.returncode == 0 and yanked.stdout.startswith("yanked ")
    undone = wf("unyank", f"causal-conv1d=={LABELLED}", "--index", published, cwd=tmp_path)
    assert undone.returncode == 0 and undone.stdout.startswith("unyanked ")


@pytest.mark.integration
def test_test_with_an_interpreter_without_torch_is_a_toolchain_error(
        published: Path, tmp_path: Path) -> None:
    """Not 'no GPU' (exit 10): the interpreter has no torch (exit 6), and it says so."""
    repo = Path(__file__).resolve().parent.parent
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)
    res = wf_process("test", "causal-conv1d", "--index", published, "--python",
             bare / "bin" / "python", "--recipes", repo / "recipes", cwd=tmp_path)
    assert res.returncode == 6, res.stderr
    assert f"{bare / 'bin' / 'python'} has no torch" in res.stderr
    assert "no GPU" not in res.stderr and "Traceback" not in res.stderr


def test_inspect_tells_a_torch_pin_from_torch_under_extras(tmp_path: Path) -> None:
    """fla-core's torch is under extras ([cuda], ...): that is no pin of the wheel."""
    wheel = make_wheel(tmp_path, {"fla/__init__.py": ""}, name="fla-core", version="0.6.0+wf",
                       metadata_extra='Requires-Dist: einops\nRequires-Dist: torch>=2.7.0; '
                                      'extra == "cuda"\nRequires-Dist: torch==2.10.0; '
                                      'extra == "npu"')
    res = wf("inspect", wheel, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "torch pin: none (no torch requirement)" in lines
    assert "torch in extras: [cuda] torch>=2.7.0, [npu] torch==2.10.0" in lines


def test_inspect_of_a_metadata_file_is_a_usage_error(published: Path, tmp_path: Path) -> None:
    (metadata,) = (published / "files").glob("*.whl.metadata")
    res = wf("inspect", metadata, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "is not a wheel" in res.stderr and "give the .whl beside it" in res.stderr


def test_a_typo_of_a_top_level_key_of_the_project_file_is_an_error(tmp_path: Path) -> None:
    """`default:` for `defaults:` was silently ignored: the build ran with other settings."""
    (tmp_path / "wheelforge.yaml").write_text("default:\n  arch: '10.0'\n")
    res = wf("doctor", "--config", tmp_path / "wheelforge.yaml", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "wheelforge.yaml: default: unknown key; did you mean 'defaults'?" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_missing_build_requirement_is_named_once(tmp_path: Path) -> None:
    """`wheel` in pyproject's build-system.requires and in the recipe's build.requires was
    listed twice (`wheel, wheel, ninja`)."""
    from wheelforge.builder.compiling.backend import check_build_requires
    from wheelforge.builder.env.buildenv import BuildEnv
    from wheelforge.errors import ToolchainError

    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "wheel"]\n'
        'build-backend = "setuptools.build_meta"\n')
    env = BuildEnv(python=Path(sys.executable), managed=False, python_version="3.11",
                   python_tag="cp311", torch_version=None, torch_cuda=None,
                   distributions=(("setuptools", "80.0"),))
    with pytest.raises(ToolchainError) as exc:
        check_build_requires(tree, env, ("setuptools", "wheel", "ninja"), "demo")
    assert exc.value.why == f"{sys.executable} is missing: wheel, ninja"


def test_a_copy_of_recipes_and_patches_without_gputests_lists_and_checks(tmp_path: Path) -> None:
    import shutil

    from conftest import REPO

    for d in ("recipes", "patches"):
        shutil.copytree(REPO / d, tmp_path / d)
    listed = wf("list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "fla-core" in listed.stdout and "mamba-ssm" in listed.stdout
    checked = wf("check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr


def test_wheelforge_test_names_a_missing_gpu_test_file(tmp_path: Path) -> None:
    import shutil

    from conftest import REPO
    from wheelforge.consume.gputest import collect_tests
    from wheelforge.errors import RecipeError
    from wheelforge.recipe.format import RecipeBook

    for d in ("recipes", "patches"):
        shutil.copytree(REPO / d, tmp_path / d)
    recipe = RecipeBook(tmp_path / "recipes", tmp_path / "patches").load("fla-core")
    with pytest.raises(RecipeError) as err:
        collect_tests(recipe, tmp_path / "t", tmp_path / "s", cache_dir=tmp_path / "c",
                      sources_dirs=(), git_mirrors=None, say=lambda _: None)
    assert "GPU test file" in err.value.what and "copy gputests/fla-core/" in err.value.fix


@pytest.mark.integration
def test_a_missing_build_requirement_of_the_recipe_stops_before_the_fetch(
        tmp_path: Path) -> None:
    """With --python (your interpreter, as it is), what the recipe's build.requires names
    is checked in preflight: no download, no patching, then the error."""
    import venv

    from conftest import REPO

    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    (site,) = (bare / "lib").glob("python*/site-packages")
    (site / "torch").mkdir()  # a stand-in: the interpreter's torch is not what is checked
    (site / "torch" / "__init__.py").write_text(
        "__version__ = '2.14.1'\nclass version:\n    cuda = None\n"
        "class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n")
    res = wf_process("build", "fla-core", "--python", bare / "bin" / "python", "--index",
             tmp_path / "index", "--cache-dir", tmp_path / "cache", "--work-dir",
             tmp_path / "work", "--no-stack-check", "--recipes", REPO / "recipes",
             cwd=tmp_path)
    assert res.returncode == 6, res.stderr
    assert "toolchain error: the build environment lacks what fla-core needs to build" \
        in res.stderr
    assert "is missing: setuptools>=64, wheel" in res.stderr
    assert "fetch source" not in res.stderr
    assert not (tmp_path / "cache" / "sources").exists()


@pytest.mark.integration
def test_a_build_backends_warnings_go_to_the_log_not_the_console(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """setuptools' deprecation banners (BuildBackendWarning, re-raised by pyproject_hooks in
    wheelforge's process) once appeared between the step lines."""
    from wheelforge.builder.compiling.backend import build_wheel
    from wheelforge.builder.env.buildenv import BuildEnv

    tree = tmp_path / "demo"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "demo"\nversion = "0.1"\n')
    (tree / "setup.py").write_text(
        "import warnings\nfrom setuptools import setup\n"
        "warnings.warn('a deprecation banner from the backend', UserWarning)\nsetup()\n")
    env = BuildEnv(python=Path(sys.executable), managed=False, python_version="3.11",
                   python_tag="cp311", torch_version=None, torch_cuda=None,
                   distributions=())
    log = tmp_path / "build.log"
    wheel = build_wheel(tree=tree, env=env, environ=dict(__import__("os").environ),
                        out_dir=tmp_path / "out", log=log)
    assert wheel.name.startswith("demo-0.1-")
    assert "deprecation banner" not in capfd.readouterr().err
    assert "warning from the build backend" in log.read_text()
    assert "a deprecation banner from the backend" in log.read_text()


@pytest.mark.integration
def test_clean_removes_what_dead_runs_left_and_never_a_live_runs_directory(
        tmp_path: Path, short_tmpdir: Path) -> None:
    import time

    from wheelforge._fs import owned_lock
    from wheelforge.workdirs import RUN_LOCK

    # TMPDIR short enough for a pool's socket (a deep one: the next test)
    work, cache, tmp = tmp_path / "work", tmp_path / "cache", short_tmpdir
    live, dead, old, fresh, stack = (work / "live", work / "dead", work / "old", work / "fresh",
                                     cache / "stack" / "stack-1")
    # a killed command's pool of compile slots (its socket, pipe and gate), and another
    # directory in the temporary one that is none of wheelforge's
    dead_pool, other = tmp / f"{jobserver.DIR_PREFIX}x1", tmp / "someone-elses"
    for d in (live, dead, old, fresh, stack, dead_pool, other):
        d.mkdir(parents=True)
        (d / "big.o").write_bytes(b"\0" * 4096)
    for d in (live, dead, stack, dead_pool):
        (d / RUN_LOCK).write_text("pid 1 (wheelforge build) since then")
    hour_ago = time.time() - 7200
    os.utime(old, (hour_ago, hour_ago))
    os.utime(other, (hour_ago, hour_ago))
    args = ("clean", "--work-dir", work, "--cache-dir", cache)
    with owned_lock(live / RUN_LOCK), jobserver.Pool(1, tmp) as pool:  # this process's
        live_pool = pool.directory
        dry = wf_process(*args, "--dry-run", cwd=tmp_path, env={"TMPDIR": str(tmp)})
        assert dry.returncode == 0, dry.stderr
        assert f"would remove {dead} " in dry.stdout and dead.exists()
        assert f"would remove {dead_pool} " in dry.stdout and dead_pool.exists()
        done = wf_process(*args, cwd=tmp_path, env={"TMPDIR": str(tmp)})
        assert live_pool.is_dir()
    assert done.returncode == 0, done.stderr
    assert not dead.exists() and not stack.exists()
    assert not dead_pool.exists() and other.exists()
    # no run lock: wheelforge cannot prove it made them, however old (tests/
    # test_shared_build_path.py: another user's directories)
    assert live.exists() and fresh.exists() and old.exists()
    assert f"kept {old}: no run lock in it" in done.stdout
    assert f"kept {live}: in use by pid {os.getpid()}" in done.stdout
    assert f"kept {live_pool}: in use by pid {os.getpid()}" in done.stdout
    assert "removed 3 directories" in done.stdout


@pytest.mark.integration
def test_clean_finds_the_pool_of_a_temporary_directory_too_deep_for_its_socket(
        tmp_path: Path) -> None:
    """Where TMPDIR is too deep for a Unix socket, a command's pool goes to /tmp
    (jobserver.pools_dir), and `wheelforge clean` looks for pools there."""
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    assert jobserver.pools_dir(deep) == Path("/tmp")
    with jobserver.Pool(1, deep) as pool:  # this process's: kept
        assert pool.directory.parent == Path("/tmp")
        done = wf_process("clean", "--work-dir", tmp_path / "work", "--cache-dir",
                          tmp_path / "cache", cwd=tmp_path, env={"TMPDIR": str(deep)})
        assert done.returncode == 0, done.stderr
        assert f"kept {pool.directory}: in use by pid {os.getpid()}" in done.stdout
        assert "/tmp/wheelforge-jobs-*" in done.stdout
