"""Each causal-conv1d patch, proven: the upstream failure on the unpatched tree, fixed after.

setup.py runs for real against the real upstream sdist; torch is a stand-in
(tests/packages/faketorch) that records the compile flags instead of compiling,
and a sitecustomize aborts at the first network access.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import setup_py_runs
from setup_py_runs import (
    BOOK,
    Recorded,
    gencodes,
    make_fake_cuda,
    patched_trees,
    pip_toolkit,
    threads,
)
from wheelforge.builder.source.fetch import fetch


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> dict[str, Path]:
    recipe = BOOK.load("causal-conv1d")
    return patched_trees(recipe, fetch(recipe, shared_cache).archive,
                         tmp_path_factory.mktemp("cc1d"))


@pytest.fixture
def fake_cuda(tmp_path: Path) -> Path:
    return make_fake_cuda(tmp_path / "cuda")


def run_setup(tree: Path, tmp_path: Path, args: list[str], env: dict[str, str]
              ) -> tuple[subprocess.CompletedProcess[str], Recorded]:
    return setup_py_runs.run_setup(tree, tmp_path, args, env,
                                   clear=("CAUSAL_CONV1D_FORCE_BUILD",))




# -- 0001: find nvcc; bare_metal_version never undefined --------------------------------------



def test_nameerror_upstream_and_fixed(trees: dict[str, Path], tmp_path: Path,
                                      fake_cuda: Path) -> None:
    # torch found no CUDA_HOME (toolkit from NVIDIA's pip wheels, nvcc not on PATH)
    env = pip_toolkit(tmp_path, fake_cuda)
    proc, _ = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert proc.returncode != 0
    assert "NameError: name 'bare_metal_version' is not defined" in proc.stderr
    # patched: the pip-installed toolkit is found and handed to torch
    proc, data = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert proc.returncode == 0, proc.stderr
    assert data is not None
    assert str(data["torch_cuda_home"]).endswith("site-packages/nvidia/cu13")
    assert data["env_cuda_home"] == data["torch_cuda_home"]


@pytest.mark.parametrize("var", ["CUDA_HOME", "CUDA_PATH"])
def test_toolkit_from_environment(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path,
                                  var: str) -> None:
    proc, data = run_setup(trees["patched"], tmp_path, ["--name"], {var: str(fake_cuda)})
    assert proc.returncode == 0, proc.stderr
    assert data is not None and data["torch_cuda_home"] == str(fake_cuda)


def test_no_toolkit_error_lists_what_was_searched(trees: dict[str, Path], tmp_path: Path) -> None:
    proc, _ = run_setup(trees["patched"], tmp_path, ["--name"],
                        {"CUDA_HOME": str(tmp_path / "nope"), "FAKE_HIDE_PREFIX": "/usr/local/cuda",
                         "PYTHONUSERBASE": str(tmp_path / "empty")})
    assert proc.returncode != 0
    assert "NameError" not in proc.stderr
    assert "needs nvcc, the CUDA compiler, and none was found" in proc.stderr
    assert f"$CUDA_HOME: {tmp_path / 'nope'}" in proc.stderr
    assert "standard prefix: /usr/local/cuda" in proc.stderr
    assert "pip NVIDIA toolkit" in proc.stderr


# -- 0002: TORCH_CUDA_ARCH_LIST honoured ------------------------------------------------------

UPSTREAM_CUDA13 = ["arch=compute_75,code=sm_75", "arch=compute_80,code=sm_80",
                   "arch=compute_87,code=sm_87", "arch=compute_90,code=sm_90",
                   "arch=compute_100,code=sm_100", "arch=compute_120,code=sm_120",
                   "arch=compute_103,code=sm_103", "arch=compute_110,code=sm_110",
                   "arch=compute_121,code=sm_121"]


@pytest.mark.parametrize("arch_list", ["12.0", "10.0;12.0+PTX", "9.0a"])
def test_arch_list_honoured(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path,
                            arch_list: str) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": arch_list}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert gencodes(upstream) == UPSTREAM_CUDA13  # upstream ignores the list: 9 archs
    proc, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert proc.returncode == 0, proc.stderr
    assert gencodes(patched) == []  # torch turns TORCH_CUDA_ARCH_LIST into -gencode flags
    flags = patched["extra_compile_args"]["nvcc"]  # type: ignore[index]
    assert not any("arch" in f for f in flags)


def test_upstream_list_when_unset(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path) -> None:
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], {"CUDA_HOME": str(fake_cuda)})
    assert gencodes(patched) == UPSTREAM_CUDA13


# -- 0003: no network during the build --------------------------------------------------------

def test_no_network_during_bdist_wheel(trees: dict[str, Path], tmp_path: Path,
                                       fake_cuda: Path) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"}
    out = tmp_path / "dist"
    proc, _ = run_setup(trees["unpatched"], tmp_path, ["-q", "bdist_wheel", "-d", str(out)], env)
    assert proc.returncode == 97 and "NETWORK ACCESS: urllib.Request" in proc.stderr
    assert "github.com/Dao-AILab/causal-conv1d/releases" in proc.stderr
    proc, _ = run_setup(trees["patched"], tmp_path, ["-q", "bdist_wheel", "-d", str(out)], env)
    assert proc.returncode == 0, proc.stderr
    assert "NETWORK ACCESS" not in proc.stderr
    assert len(list(out.glob("causal_conv1d-1.7.0-*.whl"))) == 1


# -- 0004: NVCC_THREADS -----------------------------------------------------------------------



def test_nvcc_threads(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "NVCC_THREADS": "2"}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert threads(upstream) == "4"
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert threads(patched) == "2"
    _, default = run_setup(trees["patched"], tmp_path, ["--name"], {"CUDA_HOME": str(fake_cuda)})
    assert threads(default) == "4"
