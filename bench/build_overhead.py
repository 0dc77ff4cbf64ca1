#!/usr/bin/env python3
"""wheelforge's overhead on a cold single-arch build, measured side by side.

Builds the same patched causal-conv1d source twice, in one run on one machine:
  A: a bare `pip wheel --no-build-isolation` in the managed build environment
  B: `wheelforge build causal-conv1d --force` (fetch from cache, patch, preflight,
     compile, relabel, verify, import check, publish)
and prints both wall times and the ratio B/A.  Same MAX_JOBS, NVCC_THREADS and
TORCH_CUDA_ARCH_LIST for both.  Takes about 2 x 7 minutes on 2 cores.

    .venv/bin/python bench/build_overhead.py [--recipe causal-conv1d] [--arch 12.0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from wheelforge.builder.compiling import toolchain  # noqa: E402
from wheelforge.builder.config import resolve  # noqa: E402
from wheelforge.builder.env import buildenv  # noqa: E402
from wheelforge.builder.source.fetch import extract, fetch  # noqa: E402
from wheelforge.builder.source.patch import apply_series  # noqa: E402
from wheelforge.recipe.format import RecipeBook  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="causal-conv1d")
    ap.add_argument("--arch", default="12.0")
    args = ap.parse_args()
    book = RecipeBook(REPO / "recipes", REPO / "patches")
    recipe = book.load(args.recipe)
    config = resolve(arch=args.arch, environ={k: v for k, v in os.environ.items()
                                              if k not in ("TORCH_CUDA_ARCH_LIST",)})
    env = buildenv.managed_env(config.cache_dir, base_python=config.base_python,
                               torch_req=config.torch, requirements=recipe.build.requires)
    cuda = toolchain.find_cuda()
    with tempfile.TemporaryDirectory(prefix="wf-bench-") as tmp:
        t = Path(tmp)
        tree = extract(fetch(recipe, config.cache_dir).archive, t / "src")
        apply_series(tree, recipe.patches, project=recipe.name)
        # no compile cache on either side: torch would otherwise wrap the compilers with a
        # ccache it finds on PATH
        environ = dict(os.environ, TORCH_CUDA_ARCH_LIST=config.arch_list,
                       TORCH_NO_COMPILER_WRAPPER="1",
                       MAX_JOBS=str(config.jobs), NVCC_THREADS=str(config.nvcc_threads),
                       CUDA_HOME=str(cuda.home),
                       PATH=f"{env.bin_dir}:{cuda.home / 'bin'}:{os.environ['PATH']}",
                       **dict(recipe.build.env))
        print(f"{recipe.name} {recipe.version}, TORCH_CUDA_ARCH_LIST={config.arch_list}, "
              f"MAX_JOBS={config.jobs}, NVCC_THREADS={config.nvcc_threads}", flush=True)

        start = time.monotonic()
        subprocess.run([str(env.python), "-m", "pip", "wheel", "--no-build-isolation",
                        "--no-deps", "-q", "-w", str(t / "bare"), str(tree)], env=environ,
                       check=True, stdout=subprocess.DEVNULL)
        bare = time.monotonic() - start
        print(f"A bare pip wheel:        {bare:8.1f} s", flush=True)

        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "wheelforge", "build", recipe.name, "--force",
                        "--arch", args.arch, "--jobs", str(config.jobs),
                        "--index", str(t / "index"), "--work-dir", str(t / "work")],
                       cwd=REPO, env={**environ, "NVCC_THREADS": str(config.nvcc_threads),
                                      # a cold build: no compile cache to hit
                                      "WHEELFORGE_COMPILE_CACHE": "off"},
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        forged = time.monotonic() - start
        print(f"B wheelforge build:      {forged:8.1f} s", flush=True)
        print(f"ratio B/A:               {forged / bare:8.3f}  "
              f"(overhead {100 * (forged / bare - 1):+.1f}%)")


if __name__ == "__main__":
    main()
