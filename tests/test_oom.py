"""A real out-of-memory compile: the CUDA fixture is built with two jobs, and each compiler
it starts is moved into a memory cgroup too small for it, so the kernel's OOM killer ends a
compiler with SIGKILL.  wheelforge must name it (WF-D009) and suggest fewer jobs, not report
a generic failure.

Only the compilers go into the cgroup.  With the whole build inside it (as this test once
did), the killer chose between the compilers and the build backend's Python (torch imported,
the largest process), and a compiler just under the limit could reclaim its own pages for
ten minutes before anything was killed; that made the test slow and its outcome a matter
of chance.  The backend's own SIGKILL is diagnosed too: see test_diagnose."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import IN_CI, tinyext_project
from wheelforge._proc import descendants

pytestmark = pytest.mark.nvcc

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
LIMIT = 256 * 2**20  # a compiler of torch/extension.h needs more than this (cc1plus ~1 GiB)
COMPILERS = {"cc1plus", "cicc", "cudafe++", "ptxas"}  # /proc/PID/comm names



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
    proc = subprocess.Popen(
        [sys.executable, "-m", "wheelforge", "build", "tinyext", "--arch", "12.0", "--force",
         "--jobs", "2", "--recipes", str(tmp_path / "recipes"), "--sources", str(sdists),
         "--index", str(tmp_path / "index"), "--cache-dir", str(shared_cache),
         "--work-dir", str(tmp_path / "work")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = threading.Event()
    moved: list[str] = []
    mover = threading.Thread(target=move_compilers, args=(proc.pid, cgroup, done, moved))
    mover.start()
    try:
        _, stderr = proc.communicate(timeout=600)
    finally:
        done.set()
        mover.join()
        if proc.poll() is None:
            proc.kill()
    res = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    assert moved, "no compiler was seen to move into the cgroup"
    assert res.returncode == 7, res.stderr[-3000:]
    assert "[WF-D009]" in res.stderr, res.stderr[-3000:]
    assert "--jobs 1" in res.stderr
    assert not list((tmp_path / "index").rglob("*.whl"))


def move_compilers(root: int, cgroup: Path, done: threading.Event, moved: list[str]) -> None:
    """Until ``done``, move every compiler process under ``root`` into ``cgroup`` (its
    memory from then on is charged there; what it had stays where it was)."""
    seen: set[int] = set()
    while not done.wait(0.02):
        for pid in descendants(root):
            if pid in seen:
                continue
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue  # it has ended
            if name in COMPILERS:
                seen.add(pid)
                with contextlib.suppress(OSError):  # it may have ended already
                    (cgroup / "cgroup.procs").write_text(str(pid))
                    moved.append(name)
