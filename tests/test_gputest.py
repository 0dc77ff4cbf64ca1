from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require_python311
from wheelforge.builder.config import DEFAULT_TORCH
from wheelforge.builder.env import buildenv
from wheelforge.consume.gputest import can_run


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
