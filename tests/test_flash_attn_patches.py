"""Each flash-attn patch, proven: the upstream failure on the unpatched tree, fixed after.

setup.py runs for real against the real upstream sdist (flash_attn-2.8.3.post2.tar.gz,
fetched and verified by its sha256 as a build fetches it); torch is a stand-in
(tests/packages/faketorch) that records the sources and compile flags instead of
compiling, and a sitecustomize aborts at the first network access.  The C++ checks run
g++ on upstream's flash_api.cpp against the real torch 2.14.1 headers of the managed
build environment: the C++20 check preprocesses it (seconds), the kernel-subset check
compiles it once (about two minutes, -O0) and reads the kernels its object needs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import setup_py_runs
from conftest import require_python311, require_tool
from setup_py_runs import (
    BOOK,
    Recorded,
    cxx_flags,
    gencodes,
    make_fake_cuda,
    nvcc_flags,
    patched_trees,
    pip_toolkit,
    std_flags,
)
from wheelforge.builder.artifact.verify import content_problems
from wheelforge.builder.config import DEFAULT_TORCH
from wheelforge.builder.env import buildenv
from wheelforge.builder.source.fetch import fetch
from wheelforge.recipe.model import Recipe

RECIPE = BOOK.load("flash-attn")
SUBSET_ENV = ("FLASH_ATTN_HDIMS", "FLASH_ATTN_DTYPES", "FLASH_ATTN_BACKWARD",
              "FLASH_ATTN_SPLITKV")


def _content_problems(wheel: Path, recipe: Recipe) -> list[str]:
    """The recipe's content rules (verify.top-level, verify.excluded) on ``wheel``."""
    return content_problems(wheel, recipe.verify.top_level, recipe.verify.excluded)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> dict[str, Path]:
    return patched_trees(RECIPE, fetch(RECIPE, shared_cache).archive,
                         tmp_path_factory.mktemp("fa"), RECIPE.extract)


@pytest.fixture
def fake_cuda(tmp_path: Path) -> Path:
    return make_fake_cuda(tmp_path / "cuda")


def setup_requires_met(tmp_path: Path) -> Path:
    """Distribution records of psutil and ninja, upstream's setup_requires (the build
    environment has them; this test's interpreter may not): without them setuptools would
    fetch them from the network.  Nothing here imports or runs them (MAX_JOBS is set, the
    stand-in torch compiles nothing)."""
    site = tmp_path / "setup-requires"
    for name, version in (("psutil", "7.2.2"), ("ninja", "1.13.0")):
        dist = site / f"{name}-{version}.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n"
                                       f"Version: {version}\n")
    return site


def run_setup(tree: Path, tmp_path: Path, args: list[str], env: dict[str, str]
              ) -> tuple[subprocess.CompletedProcess[str], Recorded]:
    return setup_py_runs.run_setup(tree, tmp_path, args, {"MAX_JOBS": "1", **env},
                                   clear=("MAX_JOBS", *SUBSET_ENV), clear_prefixes=("FLASH_ATTN",),
                                   pythonpath=[setup_requires_met(tmp_path)], timeout=300)








def sources(data: dict[str, object] | None) -> list[str]:
    assert data is not None
    return [Path(s).name for s in data["sources"]]  # type: ignore[union-attr]


UPSTREAM_ARCHS = ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90",
                  "arch=compute_100,code=sm_100", "arch=compute_120,code=sm_120"]


# -- 0001: find nvcc; never sm_80 alone because torch found no toolkit ------------------------



def test_no_cuda_home_upstream_builds_sm80_alone_and_fixed(
        trees: dict[str, Path], tmp_path: Path, fake_cuda: Path) -> None:
    # torch found no CUDA_HOME (toolkit from NVIDIA's pip wheels, nvcc not on PATH)
    env = pip_toolkit(tmp_path, fake_cuda)
    proc, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert proc.returncode == 0  # upstream only warns ...
    assert "nvcc was not found" in proc.stderr
    assert gencodes(upstream) == ["arch=compute_80,code=sm_80"]  # ... and drops 90/100/120
    proc, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert proc.returncode == 0, proc.stderr
    assert patched is not None
    assert str(patched["torch_cuda_home"]).endswith("site-packages/nvidia/cu13")
    assert patched["env_cuda_home"] == patched["torch_cuda_home"]
    assert gencodes(patched) == UPSTREAM_ARCHS  # the toolkit's version is read


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
    assert "flash_attn needs nvcc, the CUDA compiler, and none was found" in proc.stderr
    assert f"$CUDA_HOME: {tmp_path / 'nope'}" in proc.stderr
    assert "standard prefix: /usr/local/cuda" in proc.stderr


# -- 0002: TORCH_CUDA_ARCH_LIST honoured ------------------------------------------------------

@pytest.mark.parametrize("arch_list", ["12.0", "10.0;12.0+PTX", "9.0a"])
def test_arch_list_honoured(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path,
                            arch_list: str) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": arch_list}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    assert gencodes(upstream) == UPSTREAM_ARCHS  # upstream ignores the list: 4 archs, SASS
    proc, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert proc.returncode == 0, proc.stderr
    assert gencodes(patched) == []  # torch turns TORCH_CUDA_ARCH_LIST into -gencode flags
    assert not any("arch" in f for f in nvcc_flags(patched))
    assert patched is not None and patched["env_arch_list"] == arch_list


def test_upstream_list_when_unset(trees: dict[str, Path], tmp_path: Path, fake_cuda: Path) -> None:
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], {"CUDA_HOME": str(fake_cuda)})
    assert gencodes(patched) == UPSTREAM_ARCHS
    _, only90 = run_setup(trees["patched"], tmp_path, ["--name"],
                          {"CUDA_HOME": str(fake_cuda), "FLASH_ATTN_CUDA_ARCHS": "90"})
    assert gencodes(only90) == ["arch=compute_90,code=sm_90"]


# -- 0003: C++20, against the real torch 2.14.1 headers ---------------------------------------



@pytest.fixture(scope="module")
def managed_python(shared_cache: Path) -> Path:
    """The managed torch 2.14.1 build environment (created as `make build` does)."""
    require_python311()
    env = buildenv.managed_env(shared_cache, base_python=Path(sys._base_executable),  # type: ignore[attr-defined]
                               torch_req=DEFAULT_TORCH, requirements=RECIPE.verify.requires)
    return env.python


@pytest.fixture(scope="module")
def gxx_flags(managed_python: Path, trees: dict[str, Path]) -> list[str]:
    """-I flags for flash_api.cpp: the managed torch 2.14.1, CUDA, Python, CUTLASS."""
    require_tool("nvcc", "/usr/local/cuda/bin/nvcc")  # its headers
    paths = json.loads(subprocess.run(
        [str(managed_python), "-c",
         "import json, sysconfig; print(json.dumps(sysconfig.get_paths()))"],
        capture_output=True, text=True, check=True, timeout=60).stdout)
    torch_inc = Path(paths["purelib"]) / "torch" / "include"
    assert (torch_inc / "ATen" / "ATen.h").is_file()
    return [f"-I{torch_inc}", f"-I{torch_inc / 'torch/csrc/api/include'}",
            "-I/usr/local/cuda/include", f"-I{paths['include']}",
            "-DTORCH_EXTENSION_NAME=flash_attn_2_cuda", "-DTORCH_API_INCLUDE_EXTENSION_H"]


def includes(tree: Path) -> list[str]:
    return [f"-I{tree / 'csrc/flash_attn'}", f"-I{tree / 'csrc/flash_attn/src'}",
            f"-I{tree / 'csrc/cutlass/include'}"]


def test_cxx17_fails_against_torch_214_and_cxx20_passes(
        trees: dict[str, Path], tmp_path: Path, fake_cuda: Path, gxx_flags: list[str]) -> None:
    gxx = require_tool("g++")
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], env)
    _, patched = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert std_flags(upstream) == ("-std=c++17", "-std=c++17")
    assert std_flags(patched) == ("-std=c++20", "-std=c++20")

    def preprocess(tree: Path, std: str) -> subprocess.CompletedProcess[str]:
        # the binding unit, the one host-compiled file: torch's headers stop a C++17 build
        return subprocess.run(
            [gxx, "-E", std, *gxx_flags, *includes(tree),
             str(tree / "csrc/flash_attn/flash_api.cpp"), "-o", os.devnull],
            capture_output=True, text=True, timeout=600)

    before = preprocess(trees["unpatched"], std_flags(upstream)[0])
    assert before.returncode != 0
    assert "#error C++20 or later compatible compiler is required to use" in before.stderr
    after = preprocess(trees["patched"], std_flags(patched)[0])
    assert after.returncode == 0, after.stderr[-3000:]


# -- 0004: no network during the build; 0005: FlashAttention-2 only in the wheel ------------

def test_no_network_during_bdist_wheel(trees: dict[str, Path], tmp_path: Path,
                                       fake_cuda: Path) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"}
    out = tmp_path / "dist"
    proc, _ = run_setup(trees["unpatched"], tmp_path, ["-q", "bdist_wheel", "-d", str(out)], env)
    assert proc.returncode == 97 and "NETWORK ACCESS: urllib.Request" in proc.stderr
    assert "github.com/Dao-AILab/flash-attention/releases" in proc.stderr
    proc, _ = run_setup(trees["patched"], tmp_path, ["-q", "bdist_wheel", "-d", str(out)], env)
    assert proc.returncode == 0, proc.stderr
    assert "NETWORK ACCESS" not in proc.stderr
    assert len(list(out.glob("flash_attn-2.8.3.post2-*.whl"))) == 1


def test_wheel_holds_flash_attention_2_only(trees: dict[str, Path], tmp_path: Path,
                                            fake_cuda: Path) -> None:
    # FLASH_ATTENTION_FORCE_BUILD=TRUE (the recipe's) lets upstream build without the network
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0",
           "FLASH_ATTENTION_FORCE_BUILD": "TRUE"}
    wheels = {}
    for which in ("unpatched", "patched"):
        out = tmp_path / which
        proc, _ = run_setup(trees[which], tmp_path, ["-q", "bdist_wheel", "-d", str(out)], env)
        assert proc.returncode == 0, proc.stderr
        (wheels[which],) = out.glob("flash_attn-*.whl")
    with zipfile.ZipFile(wheels["unpatched"]) as zf:
        names = zf.namelist()
    assert "hopper/__init__.py" in names and "flash_attn/cute/__init__.py" in names
    # verification refuses upstream's wheel, naming both ...
    problems = _content_problems(wheels["unpatched"], RECIPE)
    assert any("top-level" in p and "hopper" in p for p in problems), problems
    assert any(p.startswith("flash_attn/cute is in the wheel") for p in problems), problems
    # ... and takes the patched one, which still has the rest of flash_attn
    assert _content_problems(wheels["patched"], RECIPE) == []
    with zipfile.ZipFile(wheels["patched"]) as zf:
        names = zf.namelist()
    assert "flash_attn/flash_attn_interface.py" in names and "flash_attn/layers/rotary.py" in names


# -- NVCC_THREADS: upstream already reads it (no patch) ---------------------------------------

def test_nvcc_threads_honoured_upstream(trees: dict[str, Path], tmp_path: Path,
                                        fake_cuda: Path) -> None:
    def threads(data: dict[str, object] | None) -> str:
        args = nvcc_flags(data)
        return str(args[args.index("--threads") + 1])

    for which in ("unpatched", "patched"):
        _, data = run_setup(trees[which], tmp_path, ["--name"],
                            {"CUDA_HOME": str(fake_cuda), "NVCC_THREADS": "1"})
        assert threads(data) == "1"
        _, default = run_setup(trees[which], tmp_path, ["--name"], {"CUDA_HOME": str(fake_cuda)})
        assert threads(default) == "4"


# -- 0006: kernel subsets -----------------------------------------------------------------------

SUBSET = {"FLASH_ATTN_HDIMS": "128", "FLASH_ATTN_DTYPES": "bf16", "FLASH_ATTN_BACKWARD": "no",
          "FLASH_ATTN_SPLITKV": "no"}


def test_subset_drops_the_other_units(trees: dict[str, Path], tmp_path: Path,
                                      fake_cuda: Path) -> None:
    env = {"CUDA_HOME": str(fake_cuda), "TORCH_CUDA_ARCH_LIST": "12.0"}
    _, upstream = run_setup(trees["unpatched"], tmp_path, ["--name"], {**env, **SUBSET})
    assert len(sources(upstream)) == 73  # upstream has no subsets: all 72 kernel units
    _, full = run_setup(trees["patched"], tmp_path, ["--name"], env)
    assert sources(full) == sources(upstream)  # unset: the full build, unchanged
    assert not any(f.startswith("-DFLASHATTENTION") for f in nvcc_flags(full) + cxx_flags(full))
    _, sub = run_setup(trees["patched"], tmp_path, ["--name"], {**env, **SUBSET})
    assert sources(sub) == ["flash_api.cpp", "flash_fwd_hdim128_bf16_sm80.cu",
                            "flash_fwd_hdim128_bf16_causal_sm80.cu"]
    defines = ["-DFLASHATTENTION_HDIM_MASK=8", "-DFLASHATTENTION_DTYPE_MASK=2",
               "-DFLASHATTENTION_DISABLE_BACKWARD", "-DFLASHATTENTION_DISABLE_SPLITKV"]
    assert [f for f in cxx_flags(sub) if f.startswith("-D")] == defines
    assert [f for f in nvcc_flags(sub) if f.startswith("-DFLASH")] == defines
    # two head dims, both dtypes, with backward and split-kv: 2 x 2 x 3 families x 2 causal
    _, two = run_setup(trees["patched"], tmp_path, ["--name"],
                       {**env, "FLASH_ATTN_HDIMS": "64,128"})
    assert len(sources(two)) == 1 + 24
    assert [f for f in cxx_flags(two) if f.startswith("-D")] == ["-DFLASHATTENTION_HDIM_MASK=10"]


def test_subset_bad_value_is_an_error(trees: dict[str, Path], tmp_path: Path,
                                      fake_cuda: Path) -> None:
    proc, _ = run_setup(trees["patched"], tmp_path, ["--name"],
                        {"CUDA_HOME": str(fake_cuda), "FLASH_ATTN_HDIMS": "100"})
    assert proc.returncode != 0
    assert "FLASH_ATTN_HDIMS='100': unknown value(s) 100; choose from 32,64,96,128,192,256" \
        in proc.stderr


def test_subset_binding_needs_only_the_kernels_built(
        trees: dict[str, Path], tmp_path: Path, gxx_flags: list[str]) -> None:
    """Upstream's dispatch references all 72 kernels (a subset of the units would leave
    undefined symbols, so `import flash_attn_2_cuda` fails); the patched binding compiled
    for the subset needs exactly the two forward kernels that were built."""
    gxx = require_tool("g++")
    tree = trees["patched"]
    defines = ["-DFLASHATTENTION_HDIM_MASK=8", "-DFLASHATTENTION_DTYPE_MASK=2",
               "-DFLASHATTENTION_DISABLE_BACKWARD", "-DFLASHATTENTION_DISABLE_SPLITKV"]
    obj = tmp_path / "flash_api.o"
    done = subprocess.run([gxx, "-c", "-O0", "-std=c++20", "-fPIC", *defines, *gxx_flags,
                           *includes(tree), str(tree / "csrc/flash_attn/flash_api.cpp"),
                           "-o", str(obj)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    nm = subprocess.run(["nm", "-C", "--undefined-only", str(obj)], capture_output=True,
                        text=True, check=True, timeout=60).stdout
    needed = sorted(set(re.findall(r"flash::(run_mha_\w+<[^>]*>)", nm)))
    assert needed == ["run_mha_fwd_<cutlass::bfloat16_t, 128, false>",
                      "run_mha_fwd_<cutlass::bfloat16_t, 128, true>"]
    source = (tree / "csrc/flash_attn/flash_api.cpp").read_text()
    assert 'm.attr("kernel_subset")' in source
    assert "this build holds \" + why" in source
