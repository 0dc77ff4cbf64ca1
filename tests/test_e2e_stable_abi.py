"""One stable-ABI causal-conv1d wheel (recipes/causal-conv1d-stable.yaml), built for real
once per run, loads and registers its ops under torch 2.11, 2.12 and 2.14 (CUDA 13), each
in a venv of its own; on the CPU each op's own argument check refuses a CPU tensor.

Real nvcc, real torch from PyPI (uv hard-links it from its cache), the real index.  The
one build is the whole cost this module adds (about 4-5 min of a 2-core runner cold:
causal-conv1d for sm_120, the managed torch 2.14.1 environment and the compile cache
shared with `make build`, so that a rerun relinks), plus three venvs of torch hard-linked
from uv's cache (seconds each once cached).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, built_wheel, uv_torch_venv
from wheelforge.wheel import read_metadata

pytestmark = [pytest.mark.e2e, pytest.mark.nvcc]

STEM = "causal_conv1d-1.7.0+cu13stablesm120-cp310-abi3"  # + the manylinux tag
TORCHES = ["2.11.0", "2.12.1", "2.14.1"]  # every CUDA 13 torch the index serves
PROBE = Path(__file__).with_name("stable_abi_probe.py")


@pytest.fixture(scope="session")
def stable_wheel(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """causal-conv1d-stable built once (sm_120, against the managed torch 2.14.1), in the
    user's cache root as `make build` builds: its compile cache serves a rerun."""
    index = tmp_path_factory.mktemp("stable") / "index"
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "WHEELFORGE_GIT_MIRRORS",
                        "WHEELFORGE_STACK_CHECK")}
    done = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "causal-conv1d-stable", "--arch", "12.0",
         "--index", str(index), "--cache-dir", str(shared_cache), "--no-stack-check"],
        cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, timeout=3600)
    assert done.returncode == 0, done.stdout[-6000:]
    assert re.search(rf"published: {re.escape(STEM)}-manylinux_2_[0-9]+_x86_64\.whl",
                     done.stdout), done.stdout[-3000:]
    return built_wheel(index / "files", STEM)


def test_the_wheel_is_abi3_labelled_and_requires_a_torch_floor(stable_wheel: Path) -> None:
    meta = read_metadata(stable_wheel).decode()
    assert "Version: 1.7.0+cu13stablesm120" in meta
    assert "Requires-Dist: torch>=2.10" in meta
    assert "torch==" not in meta
    assert (stable_wheel.parent.parent / "cu13-stable" / "simple" / "causal-conv1d").is_dir()


@pytest.mark.parametrize("torch", TORCHES)
def test_one_wheel_loads_under_every_cuda13_torch(stable_wheel: Path, torch: str,
                                                  tmp_path: Path, uv: str) -> None:
    py = uv_torch_venv(uv, tmp_path / f"torch{torch}", torch, str(stable_wheel))
    probe = subprocess.run([str(py), str(PROBE)], text=True, capture_output=True,
                           timeout=600, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["torch"].startswith(torch) and "+cu130" in found["torch"], found
    assert found["module"].endswith("causal_conv1d_cuda.abi3.so"), found
    assert found["ops"] == ["causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_update"]
    # the op's own check, not the dispatcher's "no kernel for the CPU backend"
    assert "causal_conv1d_fwd: x must be a CUDA tensor" in found["fn"], found
    assert "causal_conv1d_update: x must be a CUDA tensor" in found["update"], found
