"""The shipped stack built for real once per test run (conftest's ``upstream_cold``, step 1,
and ``upstream_stack``, step 2).

tests/test_e2e_causal_conv1d.py, tests/test_e2e_mamba_ssm.py and tests/test_e2e_stack.py
each built causal-conv1d (and the stack test all four recipes again).  They need only *a*
build of the recipes, so one index serves the three, each recipe built once, in two
commands:

1. causal-conv1d, fla-core and flash-linear-attention, compiled for real: a cache root of
   its own whose compile cache starts empty (every unit a miss; causal-conv1d's
   reproducibility test builds again from that cache), MAX_JOBS fixed, no stack gate;
2. the four shipped recipes as `make build` runs them (the user's cache root, mamba-ssm
   from the offline bundle, the stack gate on), into the same index: the three above are
   already published (same build keys) and mamba-ssm is built beside its companion.  Where
   an earlier run or `make build` compiled mamba-ssm, the compile cache serves it.

Running tests/test_e2e_causal_conv1d.py alone makes step 1 only.

The cache root of step 1 links the user's managed environments and verified sdists
(installing torch again would cost CI minutes).  A test that needs another configuration
builds on its own (flash-attn's subset, the reproducibility test's second build).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import IN_CI, REPO, require_python311, require_tool

RECIPES = ["causal-conv1d", "fla-core", "flash-linear-attention", "mamba-ssm"]
#: MAX_JOBS of step 1 and of the reproducibility test's second build: causal-conv1d's patch
#: 0005 groups the backward kernels into as many translation units as there are jobs, so
#: another MAX_JOBS is another binary (docs/reproducible.md, remaining differences); without
#: it, the jobs follow the memory available at the time.  CI's runner has 2 cores.
JOBS = "2"
URL = "https://github.com/state-spaces/mamba"


@dataclass(frozen=True)
class ColdBuild:
    """Step 1: its index, its cache root (whose compile cache it filled) and what it printed
    (stdout and stderr together)."""

    index: Path
    cache: Path
    output: str


@dataclass(frozen=True)
class StackBuild:
    """Step 2: the index (step 1's) and what it printed (stdout and stderr together)."""

    index: Path
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


def cold_env() -> dict[str, str]:
    """This process's environment for a build compiled for real and reproducibly: no arch
    list, mirrors or stack-gate switch of the caller's; ccache (its cache root's, empty at
    first) and MAX_JOBS=JOBS."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "WHEELFORGE_GIT_MIRRORS",
                        "WHEELFORGE_STACK_CHECK")}
    env.update(WHEELFORGE_COMPILE_CACHE="ccache", MAX_JOBS=JOBS)
    return env


def make_build_env() -> dict[str, str]:
    """This process's environment for a build as `make build` runs it: the compile cache
    and job count wheelforge chooses, the stack gate on."""
    return {k: v for k, v in os.environ.items()
            if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "WHEELFORGE_GIT_MIRRORS",
                         "WHEELFORGE_STACK_CHECK")}


def wheelforge_build(args: list[str], env: dict[str, str], prefix: Sequence[str] = ()) -> str:
    """``wheelforge build ARGS`` in the checkout (after ``prefix``, a command that runs
    it: conftest's hidden_cuda_prefix); what it printed, after it succeeded."""
    res = subprocess.run([*prefix, sys.executable, "-m", "wheelforge", "build", *args],
                         cwd=REPO,
                         env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=5400)
    assert res.returncode == 0, res.stdout[-8000:]
    return res.stdout


def build_cold(base: Path, shared_cache: Path) -> ColdBuild:
    """Step 1 of the module docstring: into BASE/index, from the cache root BASE/cache."""
    require_tool("nvcc", "/usr/local/cuda/bin/nvcc")
    require_python311()
    index, cache = base / "index", cache_root(base / "cache", shared_cache)
    output = wheelforge_build(
        ["causal-conv1d", "fla-core", "flash-linear-attention", "--arch", "12.0", "--index",
         str(index), "--cache-dir", str(cache), "--force", "--no-stack-check"], cold_env())
    return ColdBuild(index=index, cache=cache, output=output)


def build_stack(cold: ColdBuild, shared_cache: Path) -> StackBuild:
    """Step 2 of the module docstring: the four recipes into step 1's index."""
    mirror = bundle()
    output = wheelforge_build(
        [*RECIPES, "--arch", "12.0", "--index", str(cold.index), "--cache-dir",
         str(shared_cache), "--git-mirror", f"{URL}={mirror}"], make_build_env())
    return StackBuild(index=cold.index, output=output)
