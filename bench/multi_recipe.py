#!/usr/bin/env python3
"""The four-recipe command, its builds at once, against the same builds one after another.

Side by side in one run, same machine, arch list and jobs, each variant into a fresh
private index and cache (nothing is skipped as published; mamba-ssm's companion
causal-conv1d is built once in both), --no-stack-check:
  A: at once            `wheelforge build causal-conv1d fla-core flash-linear-attention
                         mamba-ssm`: every build in a thread, the compiles sharing one
                         pool of MAX_JOBS slots, taken unit by unit (the gate before
                         each nvcc; builder/scheduler.py, jobserver.py)
  B: one after another  the same command with WHEELFORGE_BUILDS_AT_ONCE=off (the
                         behaviour before)
(the order alternates between rounds).  Prints each variant's wall time, its CPU time
(user + system of every child), the CPU bound (CPU / cores), wall / bound, each
recipe's compile step, the load average before and after, and the ratio B / A.
--compile-cache off (the default) compiles everything; warm links the usual cache's
ccache directory in (the figures are then about the command around the compiles).
--unit-costs record builds the recipes once first (one after another, not timed) and
gives both variants its recorded unit costs (which compile's units go first in the
pool; since issue 53 a record never repacks the units).
--python builds with an existing interpreter (as `wheelforge build --python`);
--sources and --git-mirror take the sources from a directory and a bundle: together
they run on a machine without network.  No timing is asserted.

    .venv/bin/python bench/multi_recipe.py [--rounds 1] [--compile-cache off|warm]
        [--arch 12.0] [--jobs N] [--recipes a,b,...] [--python PATH] [--sources DIR]
        [--git-mirror URL=PATH] [--unit-costs none|record] [--only VARIANT]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parent.parent
sys.path.insert(0, str(REPO / "src"))

from wheelforge.builder.config import cpu_count, default_cache_dir  # noqa: E402

RECIPES = "causal-conv1d,fla-core,flash-linear-attention,mamba-ssm"
AT_ONCE = "WHEELFORGE_BUILDS_AT_ONCE"


def private_cache(root: Path, compile_cache: str) -> Path:
    cache = root / "cache"
    (cache / "envs").mkdir(parents=True)
    shared = default_cache_dir()
    for entry in (shared / "envs").glob("*"):  # torch environments: linked, not rebuilt
        (cache / "envs" / entry.name).symlink_to(entry)
    links = ["sources"] + (["ccache", "compilecache"] if compile_cache == "warm" else [])
    for sub in links:
        if (shared / sub).is_dir():
            (cache / sub).symlink_to(shared / sub)
    return cache


def run_variant(names: list[str], root: Path, env: dict[str, str],
                compile_cache: str, common: list[str],
                records: Path | None = None) -> dict[str, float | str]:
    cache = private_cache(root, compile_cache)
    if records is not None:  # both variants pack and order their units by the same record
        (cache / "stats").mkdir(exist_ok=True)
        for record in records.glob("*.units.json"):
            shutil.copy2(record, cache / "stats" / record.name)
    index = root / "index"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.monotonic()
    argv = [sys.executable, "-m", "wheelforge", "build", *names, "--cache-dir", str(cache),
            "--index", str(index), "--work-dir", str(root / "work"), "--no-stack-check",
            *common]
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}):\n"
                         f"{res.stderr[-3000:]}")
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (root / "build.log").write_text(res.stderr)
    steps = [line.strip() for line in res.stderr.splitlines()
             if " ok compile " in line or "compile slots:" in line]
    return {"wall": wall, "cpu": cpu, "load": f"{load:.1f}-{os.getloadavg()[0]:.1f}",
            "steps": "\n      ".join(steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--compile-cache", choices=["warm", "off"], default="off")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--recipes", default=RECIPES)
    ap.add_argument("--python", default=None)
    ap.add_argument("--sources", default=None)
    ap.add_argument("--git-mirror", default=None)
    ap.add_argument("--unit-costs", choices=["none", "record"], default="none")
    ap.add_argument("--only", choices=["at once", "one after another"], default=None,
                    help="one variant (its wall / bound alone; no ratio)")
    args = ap.parse_args()
    names = args.recipes.split(",")
    cores = cpu_count()
    env = dict(os.environ)
    env.pop("MAX_JOBS", None)
    env.pop(AT_ONCE, None)
    if args.compile_cache == "off":
        env["WHEELFORGE_COMPILE_CACHE"] = "off"
    for mirror in (REPO.parent / "shared" / "upstream" / "state-spaces-mamba.bundle",
                   Path("/work/shared/upstream/state-spaces-mamba.bundle")):
        if mirror.is_file():
            env.setdefault("WHEELFORGE_GIT_MIRRORS",
                           f"https://github.com/state-spaces/mamba={mirror}")
            break
    common = ["--arch", args.arch] + (["--jobs", str(args.jobs)] if args.jobs else [])
    common += ["--python", args.python] if args.python else []
    common += ["--sources", args.sources] if args.sources else []
    common += ["--git-mirror", args.git_mirror] if args.git_mirror else []
    variants = {"at once": {}, "one after another": {AT_ONCE: "off"}}
    if args.only:
        variants = {args.only: variants[args.only]}
    print(f"{cores} cores, compile cache {args.compile_cache}, recipes {', '.join(names)}, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    records = None
    if args.unit_costs == "record":  # a first build, one after another, not timed
        root = Path(tempfile.mkdtemp(prefix="wf-bench-multi-record-"))
        run_variant(names, root, {**env, AT_ONCE: "off"}, args.compile_cache, common)
        records = root / "cache" / "stats"
        made = sorted(p.name for p in records.glob("*.units.json"))
        print(f"unit costs recorded by a first build: {', '.join(made)}", flush=True)
    results: dict[str, list[dict[str, float | str]]] = {k: [] for k in variants}
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for label in order:
            root = Path(tempfile.mkdtemp(prefix="wf-bench-multi-"))
            got = run_variant(names, root, {**env, **variants[label]}, args.compile_cache,
                              common, records)
            results[label].append(got)
            wall, cpu = float(got["wall"]), float(got["cpu"])
            print(f"round {r + 1} {label:17}  wall {wall:7.1f} s  CPU {cpu:7.1f} s  "
                  f"bound {cpu / cores:6.1f} s  wall/bound {wall / (cpu / cores):.2f}  "
                  f"load {got['load']}  (log {root / 'build.log'})\n      {got['steps']}",
                  flush=True)
    if args.only:
        return
    print()
    print("round  at once (s)  one after another (s)  one-after-another / at-once")
    for r in range(args.rounds):
        a, b = results["at once"][r], results["one after another"][r]
        print(f"{r + 1:5}  {float(a['wall']):11.1f}  {float(b['wall']):21.1f}  "
              f"{float(b['wall']) / float(a['wall']):.2f}x   (load {a['load']} / {b['load']})")


if __name__ == "__main__":
    main()
