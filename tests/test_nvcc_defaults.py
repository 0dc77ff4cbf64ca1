"""nvcc as the toolkit runs it, by default (issue 51): the nvcc step runner
(builder/compiling/nvccsteps.py) only with ``WHEELFORGE_NVCC_STEPS=1``, the pool's lending
to ptxas's threads (``--split-compile`` through its jobserver) only with
``WHEELFORGE_JOBSERVER=1`` (or the runner's variable); the build key holds what the lending
puts into each cubin.  Unit tests: a stand-in nvcc that lists the options in its help."""

from __future__ import annotations

import io
import os
import shlex
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import tinyext_project
from wheelforge._log import Reporter
from wheelforge.builder import pipeline
from wheelforge.builder.artifact import identity
from wheelforge.builder.compiling import jobserver, toolchain
from wheelforge.builder.config import resolve
from wheelforge.builder.env.buildenv import BuildEnv
from wheelforge.recipe.format import RecipeBook

LENT = f"--ptxas-options=--split-compile={jobserver.SPLIT_COMPILE},--jobserver"


@pytest.fixture
def nvcc(tmp_path: Path) -> Path:
    """An nvcc whose help lists ptxas's jobserver options, as CUDA 13.0's does."""
    path = tmp_path / "cuda" / "bin" / "nvcc"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\necho '  --split-compile  --jobserver'\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("environ", "lends", "steps"), [
    ({}, False, False),
    ({"WHEELFORGE_JOBSERVER": "0"}, False, False),
    ({"WHEELFORGE_NVCC_STEPS": "0"}, False, False),
    ({"WHEELFORGE_JOBSERVER": "1"}, True, False),
    ({"WHEELFORGE_NVCC_STEPS": "1"}, True, True),
    ({"WHEELFORGE_NVCC_STEPS": "1", "WHEELFORGE_JOBSERVER": "0"}, False, False),
])
def test_the_runner_and_the_lending_are_off_unless_asked_for(
        environ: dict[str, str], lends: bool, steps: bool) -> None:
    assert jobserver.lends(environ) is lends
    assert jobserver.runs_steps(environ) is steps


def test_nvcc_gets_the_lent_options_only_when_the_pool_lends(nvcc: Path) -> None:
    assert jobserver.lent_flags(nvcc, None, {}) == ()
    assert jobserver.lent_flags(nvcc, "ccache", {"WHEELFORGE_JOBSERVER": "1"}) == (LENT,)
    assert jobserver.lent_flags(nvcc, None, {"WHEELFORGE_NVCC_STEPS": "1"}) == (LENT,)
    # sccache's server runs ptxas without the build's MAKEFLAGS
    assert jobserver.lent_flags(nvcc, "sccache", {"WHEELFORGE_JOBSERVER": "1"}) == ()


def _gated_nvcc(tmp_path: Path, nvcc: Path, monkeypatch: pytest.MonkeyPatch,
                environ: dict[str, str]) -> tuple[str, str]:
    """The compile's ``$PYTORCH_NVCC`` behind the pool's gate, and what the build said."""
    for name in (jobserver.JOBSERVER_ENV, jobserver.NVCC_STEPS_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "ninja").touch()
    env = BuildEnv(python=bin_dir / "python", managed=True, python_version="3.11.7",
                   python_tag="cp311", torch_version=None, torch_cuda=None, distributions=())
    config = resolve(arch="12.0", jobs=2, cache_dir=tmp_path / "cache", environ={})
    flags = jobserver.lent_flags(nvcc, None)
    compile_env = {"PYTORCH_NVCC": " ".join([shlex.quote(str(nvcc)), *flags]),
                   "CUDA_HOME": str(nvcc.parent.parent)}
    said = io.StringIO()
    with jobserver.Pool(2, tmp_path, lend=jobserver.lends()) as pool, \
            pipeline._compile_slots(pool, config, env, compile_env, Reporter(said), None):
        return compile_env["PYTORCH_NVCC"], said.getvalue()


def test_a_build_runs_nvcc_as_given_by_default(tmp_path: Path, nvcc: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    command, said = _gated_nvcc(tmp_path, nvcc, monkeypatch, {})
    words = shlex.split(command)
    assert words[words.index(str(nvcc)) - 1] == ""  # the gate's MAKEFLAGS: none
    assert words[words.index(str(nvcc)):] == [str(nvcc)]  # no runner, no lent options
    assert "nvcc-steps" not in command and "jobserver" not in said
    assert not (tmp_path / "cache" / "nvcc-steps").exists()


def test_the_lending_alone_gives_ptxas_the_jobserver_without_the_runner(
        tmp_path: Path, nvcc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    command, said = _gated_nvcc(tmp_path, nvcc, monkeypatch, {"WHEELFORGE_JOBSERVER": "1"})
    words = shlex.split(command)
    assert words[words.index(str(nvcc)) - 1].startswith(" -j2 --jobserver-auth=fifo:")
    assert words[words.index(str(nvcc)):] == [str(nvcc), LENT]
    assert "nvcc-steps" not in command
    assert f"the free ones to ptxas's parts (--split-compile {jobserver.SPLIT_COMPILE}) " \
           "through the pool's jobserver" in said


def test_the_runner_goes_in_front_of_nvcc_with_the_variable(
        tmp_path: Path, nvcc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    command, said = _gated_nvcc(tmp_path, nvcc, monkeypatch, {"WHEELFORGE_NVCC_STEPS": "1"})
    words = shlex.split(command)
    launcher = words[words.index(str(nvcc)) - 1]
    assert launcher.startswith(str(tmp_path / "cache" / "nvcc-steps"))
    assert os.access(launcher, os.X_OK) and words[-1] == LENT
    assert "and each unit's host compile through the pool's jobserver" in said


def test_the_build_key_holds_the_lent_options(tmp_path: Path, nvcc: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """They are recorded in each cubin (.note.nv.tkinfo): a wheel built with them has
    other bytes than one built without, so another key."""
    tinyext_project(tmp_path)
    recipe = RecipeBook(tmp_path / "recipes", tmp_path / "patches").load("tinyext")
    config = resolve(arch="12.0", jobs=2, cache_dir=tmp_path / "cache", environ={})
    cuda = toolchain.Cuda(home=nvcc.parent.parent, nvcc=nvcc, version=Version("13.0"),
                          origin="test")
    keys = {}
    for value in ("", "1"):
        monkeypatch.setenv(jobserver.JOBSERVER_ENV, value)
        monkeypatch.delenv(jobserver.NVCC_STEPS_ENV, raising=False)
        found = identity.toolchain_identity(recipe, config, cuda)
        assert found["nvcc-options"] == (LENT if value else "")
        keys[value] = identity.identify(recipe, config, cuda, {}).key
    assert keys[""] != keys["1"]
    monkeypatch.setenv(jobserver.NVCC_STEPS_ENV, "1")  # the runner lends: same options,
    assert identity.identify(recipe, config, cuda, {}).key == keys["1"]  # same bytes
