"""The whole pipeline on tiny real projects: nvcc, torch, pip and the index are all real.

The CUDA fixture (tests/packages/tinyext) compiles in seconds; the managed torch
environment is shared with `make build` through the user's wheelforge cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import (
    MANYLINUX,
    PACKAGES,
    broken_torch,
    built_wheel,
    tinyext_project,
    tinypure_project,
)
from fixture_build import FixtureBuild
from wheelforge.builder.artifact.verify import shared_object_archs
from wheelforge.builder.compiling import nvccsteps

pytestmark = pytest.mark.nvcc


def wheelforge(*args: str | Path, cwd: Path,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "wheelforge", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture
def project(tmp_path: Path, nvcc: str) -> Path:
    tinyext_project(tmp_path)
    tinypure_project(tmp_path)
    return tmp_path


def common(project: Path, cache: Path) -> list[str | Path]:
    return ["--recipes", project / "recipes", "--sources", project / "sdists",
            "--index", project / "index", "--cache-dir", cache, "--work-dir", project / "work"]


def test_fixture_recipe_to_index(tinyext_cold: FixtureBuild, shared_cache: Path) -> None:
    # the session's cold build of tinyext and tinypure (tests/fixture_build.py: the user's
    # cache root, every unit compiled, the step runner's report file named)
    project, res, steps = tinyext_cold.project, tinyext_cold.result, tinyext_cold.steps
    assert res.returncode == 0, res.stderr[-3000:]
    stem = "tinyext-0.1.0+cu130torch2.14sm120-cp311-cp311"
    ext = built_wheel(project / "index" / "files", stem).name  # the platform tag: manylinux
    assert re.fullmatch(rf"{re.escape(stem)}-{MANYLINUX}\.whl", ext)
    assert f"published: {ext}  [sm_120]" in res.stdout
    assert "published: tinypure-0.1.0+wf-py3-none-any.whl  [pure Python]" in res.stdout
    # the install lines: the one command for the build's channel, absolute paths, and uv's
    assert "install (the index's channel cu130-torch2.14), from any directory:\n" in res.stdout
    index_dir = (project / "index").resolve()
    assert (f" install --index {index_dir} --channel cu130-torch2.14 --python ~/venvs/stack\n"
            in res.stdout)
    assert "--extra-index-url" not in res.stdout
    assert f"--constraint {(index_dir / 'cu130-torch2.14' / 'constraints.txt').as_uri()} " \
           "tinyext tinypure\n" in res.stdout
    # resolved inputs first, then steps with durations
    assert "arch list      12.0  [--arch]" in res.stderr
    assert "ok compile (TORCH_CUDA_ARCH_LIST=12.0" in res.stderr
    # the CUDA compile took its units' slots from the command's pool (the gate)
    assert re.search(r"\[tinyext\]\s+compile slots: 1 of the command's \d+ for each CUDA "
                     r"unit", res.stderr), res.stderr[-3000:]
    # nvcc as the toolkit runs it: no lending to ptxas's threads, no step runner (opt-in:
    # test_the_nvcc_step_runner_is_opt_in)
    assert "the free ones to ptxas's parts" not in res.stderr
    assert not steps.exists()

    wheel = project / "index" / "files" / ext
    with zipfile.ZipFile(wheel) as zf:  # built stored, deflated by the relabel
        assert {zi.compress_type for zi in zf.infolist()} == {zipfile.ZIP_DEFLATED}
    [(so, archs)] = shared_object_archs(wheel)
    assert so.startswith("tinyext_cuda") and archs.sass == {"sm_120"} and not archs.ptx
    inspect = wheelforge("inspect", wheel, cwd=project)
    assert "SASS sm_120; PTX none\n" in inspect.stdout
    assert "  patches:   1" in inspect.stdout and "  platform:  manylinux_2_" in inspect.stdout
    # the patched files dated at the source's date (nvcc's -lineinfo writes dates)
    assert "applied 0001-lineinfo.patch" in res.stderr
    assert "newer than the source dated at SOURCE_DATE_EPOCH" in res.stderr

    # a second build of the same inputs is skipped by build key
    again = wheelforge("build", "tinyext", "--arch", "12.0", *common(project, shared_cache),
                       cwd=project)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"already published: {ext}" in again.stdout
    # a forced rebuild builds again (here from the compile cache) and gives the same bytes:
    # that wheel, nothing new
    forced = wheelforge("build", "tinyext", "--arch", "12.0", "--force",
                        *common(project, shared_cache), cwd=project)
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert f"reproduced (already published): {ext}" in forced.stdout
    assert f"rebuilt byte for byte: {ext} (same build key)" in forced.stderr
    assert sorted(p.name for p in (project / "index" / "files").glob("tinyext-*.whl")) == [ext]

    # real pip installs it from the index (no deps: torch is the build env's)
    target = project / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--target",
         str(target), "--index-url", (project / "index" / "simple").as_uri(), "tinyext",
         "tinypure"], capture_output=True, text=True, env={**os.environ,
                                                            "PIP_CONFIG_FILE": os.devnull})
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert (target / "tinypure" / "__init__.py").is_file()
    assert any(target.glob("tinyext_cuda*.so"))


def test_the_nvcc_step_runner_is_opt_in(project: Path, shared_cache: Path) -> None:
    """WHEELFORGE_NVCC_STEPS=1: the pool lends its free slots to ptxas's threads and each
    CUDA unit's steps run as builder/compiling/nvccsteps.py runs them, through ccache (the
    default compile cache; CCACHE_RECACHE: compiled, not taken from the shared cache), the
    host compile beside ptxas or after it: ccache's prefix."""
    steps = project / "nvcc-steps.txt"
    res = wheelforge("build", "tinyext", "--arch", "12.0", *common(project, shared_cache),
                     cwd=project, extra_env={nvccsteps.REPORT_ENV: str(steps),
                                             "CCACHE_RECACHE": "1",
                                             "WHEELFORGE_NVCC_STEPS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    # the free slots to ptxas's threads (nvcc 13.0 knows --jobserver)
    assert ", and the free ones to ptxas's parts (--split-compile 8) and each unit's host " \
           "compile through the pool's jobserver" in res.stderr
    hows = [line.split()[0] for line in steps.read_text().splitlines()]
    assert hows and set(hows) <= {"beside", "after"}, hows


def test_patch_that_does_not_apply_publishes_nothing(project: Path, shared_cache: Path) -> None:
    bad = "--- a/setup.py\n+++ b/setup.py\n@@ -1,3 +1,3 @@\n-# not this line\n+x\n y\n z\n"
    tinyext_project(project, patches={"0001-stale.patch": bad})
    res = wheelforge("build", "tinyext", *common(project, shared_cache), cwd=project)
    assert res.returncode == 5, res.stderr[-2000:]
    assert "patch error: patch 0001-stale.patch does not apply to tinyext 0.1.0 (hunk 1 at " \
           "setup.py:1)" in res.stderr
    assert not (project / "index" / "files").exists() or \
        not list((project / "index" / "files").glob("*.whl"))


def test_a_torch_that_cannot_be_imported_is_named_once_the_compile_fails(
        project: Path, tmp_path: Path) -> None:
    """The builds read torch's version from torch/version.py (no import: seconds every
    build waited for); setup.py's import then fails, and the build names the broken torch
    (exit 6, the import's error), not a failed compile."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env["PYTHONPATH"] = str(broken_torch(tmp_path))
    res = subprocess.run([sys.executable, "-m", "wheelforge", "build", "tinyext", "--arch",
                          "12.0", "--python", sys.executable,
                          *map(str, common(project, tmp_path / "cache"))],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 6, res.stderr[-3000:]
    assert f"toolchain error: torch cannot be imported in {sys.executable}" in res.stderr
    assert "ImportError: libcudnn.so.9: cannot open shared object file" in res.stderr
    assert "Traceback" not in res.stderr
    assert not list((project / "index").rglob("*.whl"))


def test_failed_verification_publishes_nothing(project: Path, shared_cache: Path) -> None:
    tinyext_project(project, imports="tinyext_cuda, no_such_module")
    res = wheelforge("build", "tinyext", "--arch", "12.0", *common(project, shared_cache),
                     cwd=project)
    assert res.returncode == 8, res.stderr[-2000:]
    assert "import no_such_module failed: ModuleNotFoundError" in res.stderr
    assert "work directory kept at" in res.stderr
    # the command's warm interpreter (torch imported while the compile ran) answered
    log = Path(re.search(r"^  log: (.+)$", res.stderr, re.M)[1])  # type: ignore[index]
    assert "in a child of the command's warm interpreter" in log.read_text()
    assert not list((project / "index").rglob("*.whl"))


@pytest.mark.parametrize("stored", [True, False])
def test_the_backend_is_asked_for_a_stored_wheel(tmp_path: Path, stored: bool) -> None:
    """The relabel deflates every member when it rewrites the wheel, so the build asks
    setuptools' bdist_wheel not to (``--compression=stored``): the compile's last
    seconds on one core.  The published wheels are deflated (test_fixture_recipe_to_index
    and every other build's test read them)."""
    from wheelforge.builder.compiling.backend import build_wheel
    from wheelforge.builder.env.buildenv import inspect_env

    tree = tmp_path / "tinypure"
    shutil.copytree(PACKAGES / "tinypure", tree)
    env = inspect_env(Path(sys.executable), with_torch=False)
    wheel = build_wheel(tree=tree, env=env, environ=dict(os.environ), out_dir=tmp_path / "out",
                        log=tmp_path / "build.log", stored=stored)
    with zipfile.ZipFile(wheel) as zf:
        types = {zi.compress_type for zi in zf.infolist()}
    assert types == ({zipfile.ZIP_STORED} if stored else {zipfile.ZIP_DEFLATED})


_LAST_WORDS_SETUP = '''\
import atexit, os, sys, threading, time
from setuptools import setup

def torn_down():
    with open(os.environ["TINYPURE_MARKER"], "w") as f:
        f.write("the interpreter's teardown ran")

atexit.register(torn_down)
if os.environ.get("TINYPURE_THREAD"):  # a thread the backend left running
    threading.Thread(target=time.sleep, args=(0.5,)).start()
setup()
sys.stdout.write("the backend's last words")  # no newline, not flushed
'''


@pytest.mark.parametrize("thread", [False, True])
def test_the_hook_interpreter_ends_without_its_teardown(tmp_path: Path, thread: bool) -> None:
    """Once the hook has returned (its wheel written, its result with pyproject_hooks) the
    build environment's interpreter ends with os._exit: tearing down one that imported
    torch takes about 0.3 s of one core at the end of every build (bench/hook_exit.py).
    Its output is flushed first; a thread it left running gets the usual exit."""
    from wheelforge.builder.compiling.backend import build_wheel
    from wheelforge.builder.env.buildenv import inspect_env

    tree = tmp_path / "tinypure"
    shutil.copytree(PACKAGES / "tinypure", tree)
    (tree / "setup.py").write_text(_LAST_WORDS_SETUP)
    marker = tmp_path / "torn-down"
    environ = {**os.environ, "TINYPURE_MARKER": str(marker)}
    environ.pop("PYTHONUNBUFFERED", None)
    if thread:
        environ["TINYPURE_THREAD"] = "1"
    env = inspect_env(Path(sys.executable), with_torch=False)
    wheel = build_wheel(tree=tree, env=env, environ=environ, out_dir=tmp_path / "out",
                        log=tmp_path / "build.log")
    assert wheel.name == "tinypure-0.1.0-py3-none-any.whl"
    assert "the backend's last words" in (tmp_path / "build.log").read_text()
    assert marker.exists() == thread
