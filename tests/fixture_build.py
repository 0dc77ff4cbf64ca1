"""The CUDA fixture built once per run, every unit compiled (conftest's ``tinyext_cold``).

tests/test_build_fixture.py's first build (the whole pipeline, what it prints, the wheel)
and tests/test_reproducible.py's first builder (the one the others must match byte for
byte) were the same cold build of tinyext and tinypure twice: one command now serves both.
It runs as `wheelforge build` does for a user: the user's cache root (its managed torch
environment), the default compile cache told to compile every unit again
(``CCACHE_RECACHE``: nothing is taken from a cache), umask 022, no SOURCE_DATE_EPOCH, no
MAX_JOBS or arch list of the caller's.  The step runner's report file is named, so that
the build fixture test can see that the runner stayed off.

tests/workers.py keeps the two modules on one xdist worker, so the build is made once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import require_tool, tinyext_project, tinypure_project
from wheelforge.builder.compiling import nvccsteps

#: tinyext's one patch: nvcc's ``-lineinfo``, and a line in its kernel's file, so that the
#: device code holds that file's date, which the build sets (a later builder of the same
#: key, applying the patch at another time, must get the same bytes: test_reproducible)
LINEINFO_PATCH = Path(__file__).with_name("packages") / "patches" / "tinyext-lineinfo.patch"

#: the modules that use ``tinyext_cold`` (one xdist group: tests/workers.py)
MODULES = frozenset({"test_build_fixture", "test_reproducible"})


@dataclass(frozen=True)
class FixtureBuild:
    """The project (recipes, sdists, index, work), the command's result, and the path the
    step runner would have reported to."""

    project: Path
    result: subprocess.CompletedProcess[str]
    steps: Path

    @property
    def index(self) -> Path:
        return self.project / "index"


def common(project: Path, cache: Path) -> list[str]:
    """The options every build of ``project`` gives: its recipes, sdists, index and work
    directory, and the cache root."""
    return ["--recipes", str(project / "recipes"), "--sources", str(project / "sdists"),
            "--index", str(project / "index"), "--cache-dir", str(cache), "--work-dir",
            str(project / "work")]


def build_cold(project: Path, shared_cache: Path) -> FixtureBuild:
    """tinyext and tinypure into PROJECT/index, every unit compiled."""
    require_tool("nvcc", "/usr/local/cuda/bin/nvcc")
    tinyext_project(project, patches={"0001-lineinfo.patch": LINEINFO_PATCH.read_text()})
    tinypure_project(project)
    steps = project / "nvcc-steps.txt"
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "SOURCE_DATE_EPOCH")}
    env.update({nvccsteps.REPORT_ENV: str(steps), "CCACHE_RECACHE": "1"})
    result = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "tinyext", "tinypure", "--arch", "12.0",
         *common(project, shared_cache)],
        cwd=project, env=env, capture_output=True, text=True, timeout=1200,
        preexec_fn=lambda: os.umask(0o022))  # noqa: PLW1509 (no threads started here)
    return FixtureBuild(project=project, result=result, steps=steps)
