"""The real thing: causal-conv1d, fla-core and flash-linear-attention for sm_120.

Real upstream sources, real nvcc 13.0, a managed torch 2.14.1 (CUDA 13.0)
environment, the real index, and a fresh venv that installs from it with pip.
The build is step 1 of the run's shared build (tests/upstream.py), into the index the
mamba-ssm and stack end-to-end tests use too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import MANYLINUX, REPO, built_wheel, wheel_differences
from upstream import JOBS, ColdBuild, cache_root, cold_env
from wheelforge.builder.artifact.verify import shared_object_archs
from wheelforge.wheel import read_metadata

pytestmark = [pytest.mark.e2e, pytest.mark.nvcc]

CC = "causal_conv1d-1.7.0+cu130torch2.14sm120-cp311-cp311"  # + the manylinux tag


@pytest.fixture(scope="module")
def built(upstream_cold: ColdBuild) -> Path:
    """causal-conv1d, fla-core and flash-linear-attention as the run's shared build compiled
    them (tests/upstream.py, step 1): ccache with an empty cache (every unit a miss), in a
    cache root of its own (whose compile cache the reproducibility test reads)."""
    out = upstream_cold.output
    assert re.search(rf"published: {re.escape(CC)}-{MANYLINUX}\.whl  \[sm_120\]", out), out
    assert re.search(r"compile cache: 0 hits, [1-9][0-9]* misses", out), out[-3000:]
    return upstream_cold.index


def test_causal_conv1d_wheel_holds_sm120_only(built: Path) -> None:
    wheel = built_wheel(built / "files", CC)
    per_so = shared_object_archs(wheel)
    assert [so for so, _ in per_so] == [n for n, _ in per_so if n.startswith("causal_conv1d_cuda")]
    for _, archs in per_so:
        assert archs.sass == {"sm_120"} and archs.ptx == frozenset()
    meta = read_metadata(wheel).decode()
    assert "Version: 1.7.0+cu130torch2.14sm120" in meta
    assert "Requires-Dist: torch==2.14.*" in meta
    assert "ninja" not in meta.lower().split("description")[0]


def test_fresh_venv_installs_from_the_index(built: Path, tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    py = tmp_path / "venv" / "bin" / "python"
    simple = (built / "simple").as_uri()
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
         "--extra-index-url", simple, "causal-conv1d==1.7.0+cu130torch2.14sm120",
         "fla-core==0.6.0", "flash-linear-attention==0.6.0"],
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    assert install.returncode == 0, install.stdout[-4000:]
    # taken from the local index, not built from PyPI's sdist
    assert built_wheel(built / "files", CC).name in install.stdout
    check = subprocess.run(
        [str(py), "-c", "import torch, causal_conv1d_cuda, causal_conv1d, fla, fla.layers;"
         "print(causal_conv1d_cuda.__file__); print(torch.__version__)"],
        text=True, capture_output=True, timeout=600)
    assert check.returncode == 0, check.stderr[-3000:]
    assert "2.14.1" in check.stdout


def test_a_second_build_elsewhere_is_byte_identical(built: Path, upstream_cold: ColdBuild,
                                                    shared_cache: Path, tmp_path: Path) -> None:
    """Reproducible bytes (docs/reproducible.md): causal-conv1d and fla-core built again
    from another cache root, a work directory at another depth, under umask 077, with a
    SOURCE_DATE_EPOCH of the builder's own, minutes later, give the first build's files
    byte for byte.  The second cache root's compile cache is the first's: every unit a
    hit, so the objects compiled for real above are relinked and packaged again (about a
    minute, where compiling again would double the e2e's time); that a unit compiled
    twice is the same, and that a cached object is what the compiler writes, the CUDA
    fixture shows (tests/test_reproducible.py)."""
    cache = cache_root(tmp_path / "another" / "cache-root", shared_cache)
    (cache / "ccache").symlink_to(upstream_cold.cache / "ccache", target_is_directory=True)
    env = {**cold_env(), "SOURCE_DATE_EPOCH": "1"}  # WHEELFORGE_COMPILE_CACHE=ccache, MAX_JOBS
    assert env["MAX_JOBS"] == JOBS
    index = tmp_path / "index"
    res = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "causal-conv1d", "fla-core", "--arch",
         "12.0", "--index", str(index), "--cache-dir", str(cache), "--work-dir",
         str(tmp_path / "a" / "b" / "work"), "--force", "--no-stack-check"],
        cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=3600, preexec_fn=lambda: os.umask(0o077))  # noqa: PLW1509
    assert res.returncode == 0, res.stdout[-4000:]
    assert re.search(r"compile cache: [1-9][0-9]* hits, 0 misses", res.stdout), \
        res.stdout[-3000:]
    first = built_wheel(built / "files", CC)
    again = built_wheel(index / "files", CC)
    assert again.name == first.name
    assert wheel_differences(first, again) == []
    pure = "fla_core-0.6.0+wf-py3-none-any.whl"
    assert wheel_differences(built / "files" / pure, index / "files" / pure) == []
