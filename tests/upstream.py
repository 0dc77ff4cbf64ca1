"""The shipped stack built for real once per test run (conftest's ``upstream_stack``).

tests/test_e2e_causal_conv1d.py, tests/test_e2e_mamba_ssm.py and tests/test_e2e_stack.py
each built causal-conv1d (and the stack test all four recipes again).  They only need *a*
build of the recipes as `make build` runs it, so one build serves the three: causal-conv1d,
fla-core, flash-linear-attention and mamba-ssm, real upstream sources (mamba-ssm from the
offline bundle), real nvcc, the managed torch, into a fresh index, with the stack gate on.

It runs in a cache root of its own whose compile cache starts empty (every unit compiled
for real; causal-conv1d's reproducibility test builds again from that cache), linked to the
user's managed environments and verified sdists (installing torch again would cost CI
minutes).  A test that needs another configuration builds on its own (flash-attn's subset,
the reproducibility test's second build).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import IN_CI, REPO, require_python311, require_tool

RECIPES = ["causal-conv1d", "fla-core", "flash-linear-attention", "mamba-ssm"]
#: MAX_JOBS of the build and of the reproducibility test's second one: causal-conv1d's patch
#: 0005 groups the backward kernels into as many translation units as there are jobs, so
#: another MAX_JOBS is another binary (docs/reproducible.md, remaining differences); without
#: it, the jobs follow the memory available at the time.  CI's runner has 2 cores.
JOBS = "2"
URL = "https://github.com/state-spaces/mamba"


@dataclass(frozen=True)
class StackBuild:
    """What the one build made: its index, its cache root, and what it printed (stdout and
    stderr together)."""

    index: Path
    cache: Path
    output: str


def bundle() -> Path:
    """The offline mirror of mamba-ssm's repository (CI has ../shared beside the clone)."""
    for candidate in (REPO.parent / "shared" / "upstream" / "state-spaces-mamba.bundle",
                      Path("/work/shared/upstream/state-spaces-mamba.bundle")):
        if candidate.is_file():
            return candidate
    if IN_CI:
        pytest.fail("../shared/upstream/state-spaces-mamba.bundle is required under CI=true")
    pytest.skip("no offline mirror of https://github.com/state-spaces/mamba")


def cache_root(root: Path, shared_cache: Path) -> Path:
    """A cache root of its own, with an empty compile cache, that links the user's managed
    environments and verified sdists."""
    root.mkdir(parents=True)
    for shared in ("envs", "sources"):
        (shared_cache / shared).mkdir(parents=True, exist_ok=True)
        (root / shared).symlink_to(shared_cache / shared, target_is_directory=True)
    return root


def build_env() -> dict[str, str]:
    """This process's environment for a build as `make build` runs it: no arch list, job
    count, mirrors or stack-gate switch of the caller's (the gate runs); ccache with
    MAX_JOBS=JOBS."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "WHEELFORGE_GIT_MIRRORS",
                        "WHEELFORGE_STACK_CHECK")}
    env.update(WHEELFORGE_COMPILE_CACHE="ccache", MAX_JOBS=JOBS)
    return env


def build_stack(base: Path, shared_cache: Path) -> StackBuild:
    """`wheelforge build` of the four shipped recipes into BASE/index, from BASE/cache."""
    require_tool("nvcc", "/usr/local/cuda/bin/nvcc")
    require_python311()
    mirror = bundle()
    index, cache = base / "index", cache_root(base / "cache", shared_cache)
    res = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", *RECIPES, "--arch", "12.0",
         "--index", str(index), "--cache-dir", str(cache), "--force",
         "--git-mirror", f"{URL}={mirror}"],
        cwd=REPO, env=build_env(), text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, timeout=7200)
    assert res.returncode == 0, res.stdout[-8000:]
    return StackBuild(index=index, cache=cache, output=res.stdout)
