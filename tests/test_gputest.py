from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require_python311
from wheelforge import index
from wheelforge.builder.config import DEFAULT_TORCH
from wheelforge.builder.env import buildenv
from wheelforge.consume.gputest import can_run, pick_wheel
from wheelforge.errors import ToolchainError
from wheelforge.recipe.format import RecipeBook


@pytest.mark.parametrize(("archs", "cc", "ok"), [
    (("sm_120",), "12.0", True),
    (("sm_120",), "12.1", True),       # same major, higher minor
    (("sm_120",), "10.0", False),
    (("sm_100", "sm_120"), "10.0", True),
    (("sm_90",), "9.0", True),
    (("sm_90a",), "9.0", True),
    (("sm_90a",), "10.0", False),      # arch-specific code runs on its own arch only
    (("sm_120",), "9.0", False),
    (("sm_80", "compute_80"), "9.0", True),   # PTX is JIT-compiled forward
    (("sm_120", "compute_120"), "9.0", False),
    ((), "9.0", False),
])
def test_can_run(archs: tuple[str, ...], cc: str, ok: bool) -> None:
    assert can_run(archs, cc) is ok


def _rec(filename: str, channel: str, torch: str) -> index.WheelRecord:
    version = filename.split("-")[1]
    return index.WheelRecord(filename=filename, project="causal-conv1d", version=version,
                             sha256="0" * 64, size=1, requires_python=">=3.10",
                             upload_time="2026-12-07T00:00:00Z", channel=channel,
                             cuda="13.0", torch=torch, archs=("sm_90",), build_key=None)


def _env(tag: str, torch: str) -> buildenv.BuildEnv:
    return buildenv.BuildEnv(python=Path("/gpu/python3"), managed=False, python_version="3.12",
                             python_tag=tag, torch_version=torch, torch_cuda="13.0",
                             distributions=())


STABLE = _rec("causal_conv1d-1.7.0+cu13stablesm90-cp310-abi3-manylinux_2_34_x86_64.whl",
              "cu13-stable", "2.14.1+cu130")
PER_TORCH = _rec("causal_conv1d-1.7.0+cu130torch2.11sm90-cp312-cp312-manylinux_2_34_x86_64.whl",
                 "cu130-torch2.11", "2.11.0+cu130")


def test_the_stable_recipe_picks_its_abi3_wheel_for_another_torch_and_python() -> None:
    """The GPU machine's torch 2.11 and Python 3.12 against a stable wheel built with torch
    2.14.1 as cp310-abi3: it fits (pip checks torch>=2.10); the per-torch recipe never
    takes it, nor the stable recipe a per-torch wheel."""
    book = RecipeBook(REPO / "recipes", REPO / "patches")
    stable, per_torch = book.load("causal-conv1d-stable"), book.load("causal-conv1d")
    env = _env("cp312", "2.11.0+cu130")
    assert pick_wheel([PER_TORCH, STABLE], stable, env) == STABLE
    assert pick_wheel([PER_TORCH, STABLE], per_torch, env) == PER_TORCH
    with pytest.raises(ToolchainError, match="no published wheel of causal-conv1d-stable"):
        pick_wheel([PER_TORCH], stable, env)
    with pytest.raises(ToolchainError):  # an abi3 wheel for 3.10 and up: not into 3.9
        pick_wheel([STABLE], stable, _env("cp39", "2.11.0+cu130"))


@pytest.mark.integration
def test_no_gpu_exit_code(tmp_path: Path, shared_cache: Path) -> None:
    """On a machine without a GPU, `wheelforge test` says so and exits 10, never 'passed'."""
    require_python311()
    env = buildenv.managed_env(shared_cache, base_python=Path(sys.executable),
                               torch_req=DEFAULT_TORCH, requirements=())
    gpu = subprocess.run([str(env.python), "-c", "import torch; print(torch.cuda.is_available())"],
                         capture_output=True, text=True)
    if gpu.stdout.strip() == "True":
        pytest.skip("this machine has a GPU")
    (tmp_path / "index" / "files").mkdir(parents=True)  # an index, empty
    res = subprocess.run([sys.executable, "-m", "wheelforge", "test", "causal-conv1d",
                          "--python", str(env.python), "--index", str(tmp_path / "index"),
                          "--cache-dir", str(shared_cache)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 10, res.stderr
    assert "no GPU: no CUDA GPU is visible on this machine" in res.stderr
    assert "passed" not in res.stdout
