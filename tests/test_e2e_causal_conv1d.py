"""The real thing: causal-conv1d, fla-core and flash-linear-attention for sm_120.

Real upstream sources, real nvcc 13.0, a managed torch 2.14.1 (CUDA 13.0)
environment, the real index, and a fresh venv that installs from it with pip.
About ten minutes on 2 cores (the causal-conv1d compile dominates).
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
from wheelforge.builder.verify import shared_object_archs
from wheelforge.wheel import read_metadata

pytestmark = [pytest.mark.e2e, pytest.mark.nvcc]

CC = "causal_conv1d-1.7.0+cu130torch2.14sm120-cp311-cp311"  # + the manylinux tag
#: MAX_JOBS of both builds: causal-conv1d's patch 0005 groups the backward kernels into
#: as many translation units as there are jobs, so another MAX_JOBS is another binary
#: (docs/reproducible.md, remaining differences); without it, the jobs follow the memory
#: available at the time.  CI's runner has 2 cores.
JOBS = "2"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """causal-conv1d, fla-core and flash-linear-attention, compile cache off, into a fresh
    index; the user's cache root (managed environment, sources)."""
    from conftest import require_tool

    require_tool("nvcc", "/usr/local/cuda/bin/nvcc")
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the local torch 2.14.1 CUDA wheel is for Python 3.11")  # CI runs 3.11
    index = tmp_path_factory.mktemp("e2e") / "index"
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env["WHEELFORGE_COMPILE_CACHE"] = "off"  # compile for real, whatever the cache holds
    env["MAX_JOBS"] = JOBS  # patch 0005 sizes the translation units by it: the same twice
    res = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "causal-conv1d", "fla-core",
         "flash-linear-attention", "--arch", "12.0", "--index", str(index),
         "--cache-dir", str(shared_cache), "--force"],
        cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, timeout=3600)
    assert res.returncode == 0, res.stdout
    assert re.search(rf"published: {re.escape(CC)}-{MANYLINUX}\.whl  \[sm_120\]", res.stdout)
    return index


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


def test_a_second_build_elsewhere_is_byte_identical(built: Path, shared_cache: Path,
                                                    tmp_path: Path) -> None:
    """Reproducible bytes (docs/reproducible.md): causal-conv1d and fla-core built again
    from another cache root, a work directory at another depth, under umask 077, with a
    SOURCE_DATE_EPOCH of the builder's own, minutes later, through ccache with an empty
    cache (every unit a miss: compiled again) give the first build's files byte for byte.
    The second cache root links the first's managed environments and sources (the same
    torch and sdists, verified by sha256; installing torch again would cost CI minutes):
    every path on the compiler's command line is another one all the same."""
    cache = tmp_path / "another" / "cache-root"
    cache.mkdir(parents=True)
    for shared in ("envs", "sources"):
        (cache / shared).symlink_to(shared_cache / shared, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env.update(WHEELFORGE_COMPILE_CACHE="ccache", SOURCE_DATE_EPOCH="1", MAX_JOBS=JOBS)
    index = tmp_path / "index"
    res = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "causal-conv1d", "fla-core", "--arch",
         "12.0", "--index", str(index), "--cache-dir", str(cache), "--work-dir",
         str(tmp_path / "a" / "b" / "work"), "--force", "--no-stack-check"],
        cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=3600, preexec_fn=lambda: os.umask(0o077))  # noqa: PLW1509
    assert res.returncode == 0, res.stdout[-4000:]
    assert re.search(r"compile cache: 0 hits, [1-9][0-9]* misses", res.stdout), res.stdout[-3000:]
    first = built_wheel(built / "files", CC)
    again = built_wheel(index / "files", CC)
    assert again.name == first.name
    assert wheel_differences(first, again) == []
    pure = "fla_core-0.6.0+wf-py3-none-any.whl"
    assert wheel_differences(built / "files" / pure, index / "files" / pure) == []
