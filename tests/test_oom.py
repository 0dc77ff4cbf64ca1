"""A real out-of-memory compile: the CUDA fixture built with two jobs inside a memory
cgroup too small for one, so the kernel's OOM killer ends a compiler with SIGKILL.
wheelforge must name it (WF-D009) and suggest fewer jobs, not report a generic failure."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import IN_CI, tinyext_project

pytestmark = pytest.mark.nvcc

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
LIMIT = 700 * 2**20  # torch/extension.h alone needs more than this in cc1plus



@pytest.fixture
def cgroup() -> Path:
    group = CGROUP_ROOT / f"wheelforge-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(LIMIT))
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"a memory cgroup is required under CI=true: {exc}")
        pytest.skip(f"cannot create a memory cgroup here: {exc}")
    yield group
    for _ in range(50):
        with contextlib.suppress(OSError):
            group.rmdir()
            return
        time.sleep(0.2)


def test_oom_killed_compiler_is_diagnosed(tmp_path: Path, shared_cache: Path, nvcc: str,
                                          cgroup: Path) -> None:
    sdists = tinyext_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env["WHEELFORGE_COMPILE_CACHE"] = "off"  # a cache hit would not compile at all
    procs = str(cgroup / "cgroup.procs")

    def enter_cgroup() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    res = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "tinyext", "--arch", "12.0", "--force",
         "--jobs", "2", "--recipes", str(tmp_path / "recipes"), "--sources", str(sdists),
         "--index", str(tmp_path / "index"), "--cache-dir", str(shared_cache),
         "--work-dir", str(tmp_path / "work")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
        preexec_fn=enter_cgroup)
    assert res.returncode == 7, res.stderr[-3000:]
    assert "[WF-D009]" in res.stderr, res.stderr[-3000:]
    assert "--jobs 1" in res.stderr
    assert not list((tmp_path / "index").rglob("*.whl"))
