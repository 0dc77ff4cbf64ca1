#!/usr/bin/env python3
"""A warm rebuild of causal-conv1d after a setup.py-only patch change, against its cold build.

Side by side in one run, same machine, same MAX_JOBS / NVCC_THREADS / arch list, each
into a fresh index and with a fresh, private compile cache:
  A: cold   `wheelforge build causal-conv1d` (empty compile cache)
  B: warm   the same recipe with one more patch that changes only a comment in setup.py
            (a new build key, so a real rebuild; every translation unit is unchanged)
and prints both wall times, the ratio B/A and the compile cache line of each build.
About 15 minutes on 2 cores (A dominates).  No timing is asserted.

    .venv/bin/python bench/warm_rebuild.py [--arch 12.0] [--backend ccache|sccache]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parent.parent
COMMENT_PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
Subject: [PATCH] bench: a comment in setup.py

---
 setup.py | 1 +
 1 file changed, 1 insertion(+)

--- a/setup.py
+++ b/setup.py
@@ -1,3 +1,4 @@
+# bench/warm_rebuild.py: a setup.py-only change
{first}
{second}
{third}
"""


def run(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.monotonic()
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    took = time.monotonic() - start
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return took, res.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("--backend", default="ccache", choices=["ccache", "sccache"])
    args = ap.parse_args()
    from_env = os.environ.get("WHEELFORGE_CACHE")
    with tempfile.TemporaryDirectory(prefix="wf-bench-warm-") as tmp:
        t = Path(tmp)
        # a copy of the recipes and patches, plus a setup.py-only patch for B
        shutil.copytree(REPO / "recipes", t / "recipes")
        shutil.copytree(REPO / "patches", t / "patches")
        shutil.copytree(REPO / "gputests", t / "gputests")
        # the managed envs and sources are the user's (linked in); the compile cache is
        # private to this run, so that A starts cold
        shared = Path(from_env) if from_env else Path.home() / ".cache" / "wheelforge"
        cache = t / "cache"
        cache.mkdir()
        for sub in ("envs", "sources"):
            (shared / sub).mkdir(parents=True, exist_ok=True)
            (cache / sub).symlink_to(shared / sub)
        env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST",)}
        env["WHEELFORGE_COMPILE_CACHE"] = args.backend
        env["PYTHONPATH"] = str(REPO / "src")
        common = ["--arch", args.arch, "--cache-dir", str(cache), "--recipes",
                  str(t / "recipes")]
        cli = [sys.executable, "-m", "wheelforge", "build", "causal-conv1d"]
        a, err_a = run([*cli, *common, "--index", str(t / "index-a"), "--work-dir",
                        str(t / "work-a")], env)
        print(f"A cold build:   {a:8.1f} s  {_cache_line(err_a)}", flush=True)

        lines = _setup_head(cache)
        patch = t / "patches" / "causal-conv1d" / "0005-bench-comment.patch"
        patch.write_text(COMMENT_PATCH.format(first=" " + lines[0], second=" " + lines[1],
                                              third=" " + lines[2]))
        recipe = t / "recipes" / "causal-conv1d.yaml"
        recipe.write_text(recipe.read_text().replace(
            "  - 0004-nvcc-threads.patch\n",
            "  - 0004-nvcc-threads.patch\n  - 0005-bench-comment.patch\n"))
        b, err_b = run([*cli, *common, "--index", str(t / "index-b"), "--work-dir",
                        str(t / "work-b")], env)
        print(f"B warm rebuild: {b:8.1f} s  {_cache_line(err_b)}")
        print(f"ratio B/A:      {b / a:8.3f}  ({a / b:.1f}x faster)")


def _cache_line(stderr: str) -> str:
    found = re.findall(r"compile cache: \d+ hits?, \d+ miss\w*", stderr)
    return f"[{found[-1]}]" if found else "[no compile cache line]"


def _setup_head(cache: Path) -> list[str]:
    """The first three lines of causal-conv1d's setup.py after the shipped patches."""
    sys.path.insert(0, str(REPO / "src"))
    from wheelforge.builder.source.fetch import extract, fetch
    from wheelforge.builder.source.patch import apply_series
    from wheelforge.recipe.format import RecipeBook

    recipe = RecipeBook(REPO / "recipes", REPO / "patches").load("causal-conv1d")
    with tempfile.TemporaryDirectory() as tmp:
        tree = extract(fetch(recipe, cache).archive, Path(tmp) / "src")
        apply_series(tree, recipe.patches, project=recipe.name)
        return (tree / "setup.py").read_text().splitlines()[:3]


if __name__ == "__main__":
    main()
