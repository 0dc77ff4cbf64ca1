#!/usr/bin/env python3
"""The 180-cell night on paper: 1, 4 and 16 builders, cold and after a setup.py-only
patch, with and without the shared compile cache.

Nothing is built.  The inputs are measured figures (defaults: bench/cross_host_cache.py,
causal-conv1d on 2 cores: cold 383.0 s, every unit a remote hit 24.7 s; the per-cell
overhead of the distributed path from bench/distributed_overhead.py) and the issue's
night: 5 recipes x 4 Pythons x 3 torch pins x 3 arch sets = 180 cells of 5 to 60
minutes, about 98 hours cold on one host (taken as 36 cells each of 5, 15, 35, 48 and
60 minutes: 97.8 h).

Model:
* a cell whose units all hit takes ``cold x hit/cold`` (the measured ratio: the packaging,
  verification and environment check that remain scale with the cell as the compile does
  for causal-conv1d; an approximation);
* cells go longest first onto the least loaded builder (the plan's order; Ray and a
  GitHub matrix start them in that order), plus ``--overhead-s`` per cell;
* after a setup.py-only patch every cell is rebuilt (new build keys, same sources).  With
  the shared cache every unit hits.  Without it, a cell hits only on the builder that
  built it the night before: with an engine that knows no affinity (GitHub's runners,
  Ray's default placement) that is 1 in N; the makespan is averaged over 200 random
  placements;
* a cold night (an empty cache, a new nvcc or torch pin) misses everywhere, with or
  without the shared cache.

    .venv/bin/python bench/night_model.py [--cold-s 383.0 --hit-s 24.7 --overhead-s 0]
"""

from __future__ import annotations

import argparse
import random

MINUTES = (5, 15, 35, 48, 60)
CELLS_PER_RECIPE = 36


def makespan(durations: list[float], builders: int, overhead: float) -> float:
    loads = [0.0] * builders
    for d in sorted(durations, reverse=True):
        i = min(range(builders), key=loads.__getitem__)
        loads[i] += d + overhead
    return max(loads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cold-s", type=float, default=383.0)
    ap.add_argument("--hit-s", type=float, default=24.7)
    ap.add_argument("--overhead-s", type=float, default=0.0)
    args = ap.parse_args()
    ratio = args.hit_s / args.cold_s
    cold = [m * 60.0 for m in MINUTES for _ in range(CELLS_PER_RECIPE)]
    print(f"180 cells, {sum(cold) / 3600:.1f} h cold on one builder; all-hit/cold "
          f"{ratio:.3f}; overhead {args.overhead_s:g} s per cell\n")
    print("builders | cold night | setup.py patch, no shared cache | "
          "setup.py patch, shared cache")
    rng = random.Random(19)
    for n in (1, 4, 16):
        c = makespan(cold, n, args.overhead_s)
        shared = makespan([d * ratio for d in cold], n, args.overhead_s)
        trials = []
        for _ in range(200):
            # LPT decides today's builder; the cell hits when it built there last night
            loads = [0.0] * n
            for d in sorted(cold, reverse=True):
                i = min(range(n), key=loads.__getitem__)
                hit = rng.randrange(n) == i
                loads[i] += (d * ratio if hit else d) + args.overhead_s
            trials.append(max(loads))
        local = sum(trials) / len(trials)
        print(f"{n:8} | {c / 3600:8.1f} h | {local / 3600:29.1f} h | {shared / 3600:26.2f} h")


if __name__ == "__main__":
    main()
