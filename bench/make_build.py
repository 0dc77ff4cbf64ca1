#!/usr/bin/env python3
"""A fresh clone's `make build`, an older revision against a newer one, side by side.

Issue 26's 2-core goal: `make build` on a fresh clone with cold caches, today's code
against the code before the issue's work, on the same machine in one run.  For each
revision (the order alternates between rounds): `git clone` of this repository at it into
a new directory (with `shared` beside it, as CI has: the upstream git bundles), a fresh
wheelforge cache (WHEELFORGE_CACHE: no sources, environments, compile cache or unit-cost
record), then `make build` there, whole: wheelforge's own .venv, the torch build
environment, the four recipes.  pip's and uv's own caches and this machine's local wheel
mirrors are left as they are (downloads are not what is measured).  Prints each
variant's wall time, its CPU time (user + system of every child), the load average before
and after, and the ratio.  No timing is asserted.

    .venv/bin/python bench/make_build.py [--old REV] [--new REV] [--rounds 1] [--arch 12.0]
        [--first old|new]
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
#: main before issue 26's work (the parent of its first commit: uv environments)
OLD = "b4f2795~1"


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def make_build(rev: str, root: Path, arch: str) -> dict[str, float | str]:
    clone = root / "main"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (root / "shared").symlink_to(shared)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WHEELFORGE_", "VIRTUAL_ENV", "PYTHON"))}
    env["WHEELFORGE_CACHE"] = str(root / "cache")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start_load = load()
    start = time.monotonic()
    log = root / "make-build.log"
    with log.open("w") as out:
        res = subprocess.run(["make", "build", f"ARCH={arch}"], cwd=clone, env=env,
                             stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        sys.exit(f"make build at {rev} failed ({res.returncode}); see {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    wheels = sorted(p.name for p in (clone / "index" / "files").glob("*.whl"))
    return {"wall": wall, "cpu": cpu, "load": f"{start_load} -> {load()}",
            "wheels": len(wheels)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default=OLD, help=f"the older revision (default {OLD})")
    ap.add_argument("--new", default="HEAD", help="the newer revision (default HEAD)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--first", choices=("old", "new"), default="old",
                    help="the variant of the first round (the order alternates after it)")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("--keep", action="store_true", help="keep the clones and caches")
    args = ap.parse_args()
    revs = {name: subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev],
                                 check=True, capture_output=True, text=True).stdout.strip()
            for name, rev in (("old", args.old), ("new", args.new))}
    print(f"make build, --arch {args.arch}: old {revs['old']} against new {revs['new']}, "
          f"{os.cpu_count()} cores, load {load()}", flush=True)
    results: dict[str, list[dict[str, float | str]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        order = ["old", "new"] if (r % 2 == 0) == (args.first == "old") else ["new", "old"]
        for name in order:
            root = Path(tempfile.mkdtemp(prefix=f"wf-bench-make-{name}-"))
            got = make_build(revs[name], root, args.arch)  # a failure keeps its log
            if not args.keep:
                shutil.rmtree(root, ignore_errors=True)
            results[name].append(got)
            print(f"round {r + 1} {name} ({revs[name]}): wall {got['wall']:.1f} s, "
                  f"CPU {got['cpu']:.1f} s, {got['wheels']} wheels, load {got['load']}",
                  flush=True)
    old = sum(float(g["wall"]) for g in results["old"]) / args.rounds
    new = sum(float(g["wall"]) for g in results["new"]) / args.rounds
    print(f"mean wall: old {old:.1f} s, new {new:.1f} s: new is {old / new:.2f}x "
          f"({(1 - new / old) * 100:.0f}% less time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
