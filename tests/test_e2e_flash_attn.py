"""The real thing, small: a flash-attn kernel subset for sm_120, built, published, installed.

`wheelforge build flash-attn --subset hdim=128 --subset dtype=bf16 --subset bwd=no
--subset splitkv=no`: the real sdist, the recipe's patches, real nvcc 13.0 and the managed
torch 2.14.1 (CUDA 13.0) environment compile 2 of the 72 kernel units and flash_api.cpp
(the whole build is about 3 h on 2 cores; this one about 6-8 min).  Then a fresh venv
installs it from the index with pip, dependencies resolved (torch from the usual index),
imports it, and calls the extension without a GPU: a head dim, dtype or mode the subset
does not hold is the clear RuntimeError, raised before any CUDA work.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import MANYLINUX, REPO, built_wheel, require_python311
from wheelforge.builder.artifact.verify import shared_object_archs
from wheelforge.wheel import read_metadata

pytestmark = [pytest.mark.e2e, pytest.mark.nvcc]

VERSION = "2.8.3.post2+cu130torch2.14sm120hd128bf16fwdnosplit"
STEM = f"flash_attn-{VERSION}-cp311-cp311"  # + the manylinux tag
SUBSET = ["--subset", "hdim=128", "--subset", "dtype=bf16", "--subset", "bwd=no",
          "--subset", "splitkv=no"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    from conftest import require_tool

    require_tool("nvcc", "/usr/local/cuda/bin/nvcc")
    require_python311()
    index = tmp_path_factory.mktemp("e2e-fa") / "index"
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS")
           and not k.startswith("FLASH_ATTN")}
    env["WHEELFORGE_COMPILE_CACHE"] = "off"  # compile for real, whatever the cache holds
    res = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "flash-attn", *SUBSET, "--arch", "12.0",
         "--index", str(index), "--cache-dir", str(shared_cache), "--force"],
        cwd=REPO, env=env, text=True, capture_output=True, timeout=3600)
    assert res.returncode == 0, res.stdout + res.stderr[-6000:]
    assert re.search(rf"published: {re.escape(STEM)}-{MANYLINUX}\.whl  \[sm_120\]", res.stdout)
    # the recipe's stated peak sized the jobs, and the subset was said before the compile
    assert "kernel subset hdim=128 dtype=bf16 bwd=no splitkv=no (label hd128bf16fwdnosplit)" \
        in res.stderr
    return index


def test_wheel_is_the_subset_for_sm120_only(built: Path) -> None:
    wheel = built_wheel(built / "files", STEM)
    per_so = shared_object_archs(wheel)
    assert [so for so, _ in per_so] == [n for n, _ in per_so
                                        if n.startswith("flash_attn_2_cuda")]
    for _, archs in per_so:
        assert archs.sass == {"sm_120"} and archs.ptx == frozenset()
    meta = read_metadata(wheel).decode()
    assert f"Version: {VERSION}" in meta
    assert "Requires-Dist: torch==2.14.*" in meta
    with zipfile.ZipFile(wheel) as zf:
        top = {n.split("/")[0].split(".")[0] for n in zf.namelist()
               if not n.split("/")[0].endswith(".dist-info")}
        assert top == {"flash_attn", "flash_attn_2_cuda"}  # no hopper
        assert not [n for n in zf.namelist() if n.startswith("flash_attn/cute/")]
    # the landing page and the simple page name the subset in the version
    assert VERSION in (built / "index.html").read_text()
    assert VERSION in (built / "simple" / "flash-attn" / "index.html").read_text()


CALLS = r"""
import torch, flash_attn, flash_attn_2_cuda
from flash_attn import flash_attn_func
print("subset:", flash_attn_2_cuda.kernel_subset)

def fwd(d, dtype=torch.bfloat16):
    q = torch.zeros(1, 4, 2, d, dtype=dtype)  # on the CPU: no GPU here
    try:
        flash_attn_2_cuda.fwd(q, q, q, None, None, 0.0, 1.0, False, -1, -1, 0.0, False, None)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]

for d in (64, 128, 256):
    print(d, "->", fwd(d))
print("fp16 ->", fwd(128, torch.float16))
q = torch.zeros(1, 4, 2, 128, dtype=torch.bfloat16)
try:
    flash_attn_2_cuda.bwd(q, q, q, q, q, torch.zeros(1, 2, 4), None, None, None, None, 0.0,
                          1.0, False, -1, -1, 0.0, False, None, None)
except RuntimeError as exc:
    print("bwd ->", str(exc).splitlines()[0])
print("torch", torch.__version__)
"""


def test_fresh_venv_installs_with_dependencies_and_refuses_what_was_not_built(
        built: Path, tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    py = tmp_path / "venv" / "bin" / "python"
    simple = (built / "simple").as_uri()
    install = subprocess.run(  # dependencies resolved: torch==2.14.* and einops from PyPI
        [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
         "--extra-index-url", simple, f"flash-attn=={VERSION}"],
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    assert install.returncode == 0, install.stdout[-4000:]
    assert built_wheel(built / "files", STEM).name in install.stdout  # the local wheel
    check = subprocess.run([str(py), "-c", CALLS], text=True, capture_output=True, timeout=600,
                           cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    out = check.stdout
    assert "subset: head dims 128; dtypes bf16; forward only; no split-kv" in out
    assert "torch 2.14.1" in out
    refusal = ("this build holds no kernels for head dim {}; it is a kernel subset (head dims "
               "128; dtypes bf16; forward only; no split-kv)")
    assert "64 -> flash-attn (forward): " + refusal.format(64) in out
    assert "256 -> flash-attn (forward): " + refusal.format(256) in out
    # what the subset holds passes the check and goes on to the GPU, which is not here
    line128 = next(ln for ln in out.splitlines() if ln.startswith("128 ->"))
    assert "this build holds" not in line128 and "CUDA" in line128
    assert "fp16 -> flash-attn (forward): this build holds no fp16 kernels" in out
    assert "bwd -> flash-attn (backward): this build holds no backward kernels" in out
