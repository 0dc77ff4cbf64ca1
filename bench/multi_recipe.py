#!/usr/bin/env python3
"""The four-recipe command against the same recipes built one command after another.

Side by side in one run, same machine, arch list and jobs, each variant into a fresh
private index (nothing is skipped as published; mamba-ssm's companion causal-conv1d is
built once in both), with the managed torch environments and verified sources of the
usual cache linked in (not rebuilt) and --no-stack-check:
  A: one command   `wheelforge build causal-conv1d fla-core flash-linear-attention mamba-ssm`
  B: one by one    `wheelforge build causal-conv1d`, then `... fla-core`, and so on
(the order alternates between rounds), and prints each variant's wall time, its CPU time
(user + system of every child), the CPU bound (CPU / cores), wall / bound, the load
average before and after, and the ratio B / A.  --compile-cache warm (the default) links
the usual cache's ccache directory in, so the compiles are mostly hits and the figures
are about the command around them (preflight, interpreter inspection, verify, publish);
--compile-cache off compiles everything (on 2 cores about 20 minutes a variant).  Runs
the same on 2 cores and on 16.  No timing is asserted.

    .venv/bin/python bench/multi_recipe.py [--rounds 1] [--compile-cache warm|off]
                                           [--arch 12.0] [--jobs N] [--recipes a,b,...]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parent.parent
sys.path.insert(0, str(REPO / "src"))

from wheelforge.builder.config import cpu_count, default_cache_dir  # noqa: E402

RECIPES = "causal-conv1d,fla-core,flash-linear-attention,mamba-ssm"


def private_cache(root: Path, compile_cache: str) -> Path:
    cache = root / "cache"
    (cache / "envs").mkdir(parents=True)
    shared = default_cache_dir()
    for entry in (shared / "envs").glob("*"):  # torch environments: linked, not rebuilt
        (cache / "envs" / entry.name).symlink_to(entry)
    links = ["sources"] + (["ccache"] if compile_cache == "warm" else [])
    for sub in links:
        if (shared / sub).is_dir():
            (cache / sub).symlink_to(shared / sub)
    return cache


def run_variant(commands: list[list[str]], root: Path, env: dict[str, str],
                compile_cache: str, common: list[str]) -> dict[str, float | str]:
    cache = private_cache(root, compile_cache)
    index = root / "index"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.monotonic()
    for names in commands:
        argv = [sys.executable, "-m", "wheelforge", "build", *names, "--cache-dir", str(cache),
                "--index", str(index), "--no-stack-check", *common]
        res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}):\n"
                             f"{res.stderr[-3000:]}")
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "load": f"{load:.1f}-{os.getloadavg()[0]:.1f}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--compile-cache", choices=["warm", "off"], default="warm")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--recipes", default=RECIPES)
    args = ap.parse_args()
    names = args.recipes.split(",")
    cores = cpu_count()
    env = dict(os.environ)
    env.pop("MAX_JOBS", None)
    if args.compile_cache == "off":
        env["WHEELFORGE_COMPILE_CACHE"] = "off"
    for mirror in (REPO.parent / "shared" / "upstream" / "state-spaces-mamba.bundle",
                   Path("/work/shared/upstream/state-spaces-mamba.bundle")):
        if mirror.is_file():
            env.setdefault("WHEELFORGE_GIT_MIRRORS",
                           f"https://github.com/state-spaces/mamba={mirror}")
            break
    common = ["--arch", args.arch] + (["--jobs", str(args.jobs)] if args.jobs else [])
    variants = {"one command": [names], "one by one": [[n] for n in names]}
    print(f"{cores} cores, compile cache {args.compile_cache}, recipes {', '.join(names)}, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[str, list[dict[str, float | str]]] = {k: [] for k in variants}
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for label in order:
            root = Path(tempfile.mkdtemp(prefix="wf-bench-multi-"))
            got = run_variant(variants[label], root, env, args.compile_cache, common)
            results[label].append(got)
            wall, cpu = float(got["wall"]), float(got["cpu"])
            print(f"round {r + 1} {label:11}  wall {wall:7.1f} s  CPU {cpu:7.1f} s  "
                  f"bound {cpu / cores:6.1f} s  wall/bound {wall / (cpu / cores):.2f}  "
                  f"load {got['load']}", flush=True)
    print()
    print("round  one command (s)  one by one (s)  one-by-one / one-command")
    for r in range(args.rounds):
        a, b = results["one command"][r], results["one by one"][r]
        print(f"{r + 1:5}  {float(a['wall']):15.1f}  {float(b['wall']):14.1f}  "
              f"{float(b['wall']) / float(a['wall']):.2f}x   (load {a['load']} / {b['load']})")


if __name__ == "__main__":
    main()
