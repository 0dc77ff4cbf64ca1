#!/usr/bin/env python3
"""The fault run of issue 15, larger than the test suite's: kill points, concurrency
rounds and full-disk fill levels against real `wheelforge` processes.

    .venv/bin/python scripts/fault_run.py                    # everything, default sizes
    .venv/bin/python scripts/fault_run.py kills --wheels 300 --repeat 2
    .venv/bin/python scripts/fault_run.py rounds --rounds 10
    .venv/bin/python scripts/fault_run.py disk --levels 24   # root only (mounts a tmpfs)

Prints one line per class: trials, and how many found a lying index, a duplicate, a
traceback or a wrong exit status (each failure's problems follow).  Exits 1 when any
trial failed.  Builds use the managed environment in the user's wheelforge cache (or
--cache-dir).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "faults"))

import harness  # noqa: E402


def kills(work: Path, cache: Path, wheels: int, repeat: int, serve: bool) -> int:
    variants = harness.pure_recipe(work, variants=2)  # two trials at a time
    recipes = variants[0]
    template = work / "template"
    harness.populate(template, work / "dist", wheels)
    failed = 0
    for label, base in (("first publish", None), (f"into {wheels} wheels", template)):
        points = harness.count_points(work, recipes, work / "count-index", cache) \
            if base is None else _count_into(work, recipes, base, cache)
        for then in ("build", "serve") if serve else ("build",):
            trials = harness.kill_trials(work, variants, base, cache,
                                         list(range(1, points + 1)) * repeat, then=then)
            bad = [t for t in trials if t.problems]
            failed += len(bad)
            print(f"kill points, {label}, next command {then}: {points} points x {repeat}: "
                  f"{len(trials)} trials, {sum(t.killed for t in trials)} killed, "
                  f"{len(bad)} failed", flush=True)
            for t in bad:
                print(f"  kill at {t.kill_at}: {'; '.join(t.problems)}\n{t.output}")
    return failed


def _count_into(work: Path, recipes: Path, template: Path, cache: Path) -> int:
    import shutil

    index = work / "count-populated"
    shutil.rmtree(index, ignore_errors=True)
    shutil.copytree(template, index)
    return harness.count_points(work, recipes, index, cache)


def rounds(work: Path, cache: Path, n_rounds: int, builds: int) -> int:
    failed = 0
    same = harness.pure_recipe(work, "samekey")
    many = harness.pure_recipe(work, "manykeys", variants=builds)
    for label, dirs, name in (("one build key", same, "samekey"),
                              (f"{builds} build keys of one project", many, "manykeys")):
        results = []
        started = time.monotonic()
        for r in range(n_rounds):
            results.append(harness.concurrent_round(work, dirs, cache, builds, f"{name}-{r}",
                                                    name=name))
        bad = [r for r in results if r.problems]
        failed += len(bad)
        print(f"concurrency, {builds} builds of {label}: {n_rounds} rounds, "
              f"{n_rounds * builds} processes, {len(bad)} rounds failed "
              f"({time.monotonic() - started:.0f} s)", flush=True)
        for r in bad:
            print("  " + "\n  ".join(r.problems))
    return failed


def disk(work: Path, cache: Path, levels: int) -> int:
    if os.geteuid() != 0:
        print("full disk: skipped (needs root to mount a tmpfs)")
        return 0
    [recipes] = harness.pure_recipe(work, "diskpkg")
    results = harness.fill_sweep(work, recipes, cache, levels, name="diskpkg")
    bad = [r for r in results if r.problems]
    print(f"full disk: {len(results)} fill levels: "
          f"{sum(r.published for r in results)} published completely, "
          f"{sum(r.code == 9 for r in results)} refused with exit 9, {len(bad)} failed",
          flush=True)
    for r in bad:
        print(f"  {r.free} bytes free: {'; '.join(r.problems)}\n{r.output}")
    writes = harness.library_fill_sweep(work, levels * 2)
    wbad = [r for r in writes if r.problems]
    print(f"full disk at every write of a batch (publish_build, space check off): "
          f"{len(writes)} fill levels: {sum(r.published for r in writes)} published, "
          f"{sum(r.code == 9 for r in writes)} PublishError with the index unchanged, "
          f"{len(wbad)} failed", flush=True)
    for r in wbad:
        print(f"  {r.free} bytes free: {'; '.join(r.problems)}\n{r.output}")
    return len(bad) + len(wbad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="*", metavar="CLASS",
                        help="kills, rounds or disk (default: all three)")
    parser.add_argument("--wheels", type=int, default=300, help="wheels in the populated index")
    parser.add_argument("--repeat", type=int, default=1, help="trials per kill point")
    parser.add_argument("--no-serve", action="store_true",
                        help="only a build as the command after a kill, no serve")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--builds", type=int, default=8)
    parser.add_argument("--levels", type=int, default=24)
    parser.add_argument("--cache-dir", type=Path,
                        default=Path(os.environ.get("WHEELFORGE_CACHE",
                                                    Path.home() / ".cache" / "wheelforge")))
    args = parser.parse_args()
    args.what = args.what or ["kills", "rounds", "disk"]
    unknown = set(args.what) - {"kills", "rounds", "disk"}
    if unknown:
        parser.error(f"unknown class(es) {', '.join(sorted(unknown))}: choose kills, rounds, disk")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="wf-faults-") as tmp:
        work = Path(tmp)
        if "kills" in args.what:
            failed += kills(work, args.cache_dir, args.wheels, args.repeat, not args.no_serve)
        if "rounds" in args.what:
            failed += rounds(work, args.cache_dir, args.rounds, args.builds)
        if "disk" in args.what:
            failed += disk(work, args.cache_dir, args.levels)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
