#!/usr/bin/env python3
"""How much one build's noise costs the next packing of mamba-ssm's units: a simulation
by patch 0010's own cost model, not a measurement (docs/performance.md, stop 46).

The truth is run 25's (H100 machine, 16 cores, --arch 9.0, MAX_JOBS=16): six builds that
all packed the 15 units by the model, so each unit's files were the same six times.  A
unit's true seconds are its mean over the six; a file's true cost is its model cost times
its unit's mean ratio (seconds over modelled cost), a kind's headers its model times the
kind's mean ratio.  A simulated build measures each unit of its packing at its true cost
times (1 + e), e normal with the relative spread run 25 showed (its pooled standard
deviation, or --sd).  Each round plays six builds, each packed by the record before it
(patch 0010's selective_scan_units, as shipped, given WHEELFORGE_UNIT_COSTS) holding the
last 1, 2 or 4 builds, and reports the longest unit of the last packing by the truth.

    scripts/record-noise.py [--rounds 30] [--sd 0.04]

Needs the pinned mamba source (the offline mirror beside the checkout, as the tests do).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from conftest import setup_py_function  # noqa: E402  (the tests' reading of setup.py)
from test_mamba_ssm_patches import MAMBA_URL, mirror  # noqa: E402
from test_unit_costs import _cost_mamba, _headers_mamba, included  # noqa: E402  (the model)
from wheelforge.builder.source.fetch import extract, fetch  # noqa: E402
from wheelforge.builder.source.patch import apply_series  # noqa: E402
from wheelforge.recipe.format import RecipeBook  # noqa: E402

#: run 25, ninja's seconds for each unit in the six builds (0D 1P 2P 3D 4D 5P)
RUN25 = {
    "unit_01_of_15": [81.0, 73.1, 73.8, 76.7, 76.9, 78.7],
    "unit_02_of_15": [79.4, 75.6, 75.3, 75.8, 75.9, 76.4],
    "unit_03_of_15": [80.5, 74.4, 74.6, 74.7, 77.7, 78.4],
    "unit_04_of_15": [80.2, 74.7, 76.5, 76.1, 75.9, 78.3],
    "unit_05_of_15": [78.8, 69.0, 76.5, 75.8, 74.0, 75.5],
    "unit_06_of_15": [60.3, 56.7, 51.5, 56.8, 54.9, 76.7],
    "unit_07_of_15": [77.8, 69.1, 73.4, 73.1, 75.5, 75.5],
    "unit_08_of_15": [60.4, 53.9, 62.1, 59.3, 53.5, 59.2],
    "unit_09_of_15": [79.4, 72.9, 72.2, 75.5, 75.3, 75.7],
    "unit_10_of_15": [79.5, 74.8, 73.5, 73.7, 73.3, 68.0],
    "unit_11_of_15": [55.1, 49.2, 51.4, 54.3, 51.3, 50.9],
    "unit_12_of_15": [59.5, 49.1, 48.6, 48.0, 47.5, 47.1],
    "unit_13_of_15": [71.9, 62.0, 65.3, 72.6, 64.4, 68.0],
    "unit_14_of_15": [71.3, 68.3, 64.9, 68.3, 62.2, 63.6],
    "unit_15_of_15": [70.9, 64.4, 62.4, 68.8, 61.4, 68.7],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--sd", type=float, default=None,
                    help="a unit's relative noise (default: run 25's pooled spread)")
    args = ap.parse_args()
    pooled = statistics.fmean(statistics.stdev(v) / statistics.fmean(v)
                              for v in RUN25.values())
    sd = args.sd if args.sd is not None else pooled

    with tempfile.TemporaryDirectory(prefix="wf-record-noise-") as tmp:
        simulate(Path(tmp), sd, pooled, args.rounds)


def simulate(tmp: Path, sd: float, pooled: float, rounds: int) -> None:
    recipe = RecipeBook(REPO / "recipes", REPO / "patches").load("mamba-ssm")
    tree = extract(fetch(recipe, tmp / "cache", git_mirrors={MAMBA_URL: mirror()}).archive,
                   tmp / "src")
    apply_series(tree, recipe.patches, project="mamba-ssm")
    units = setup_py_function(tree, "selective_scan_units", HIP_BUILD=False)
    work = tmp / "units"
    work.mkdir()
    os.chdir(work)
    os.environ["MAX_JOBS"] = "16"
    os.environ.pop("WHEELFORGE_UNIT_COSTS", None)
    os.environ.pop("MAMBA_SELECTIVE_SCAN_UNITS", None)

    def packing() -> dict[str, list[str]]:
        return {Path(u).stem: included(work / u) for u in units()}

    model = packing()
    if sorted(model) != sorted(RUN25):
        raise SystemExit(f"the model packs {sorted(model)}, run 25 built {sorted(RUN25)}")

    def modelled(files: list[str]) -> float:
        return _headers_mamba(files) + sum(map(_cost_mamba, files))

    ratio = {u: statistics.fmean(RUN25[u]) / modelled(fs) for u, fs in model.items()}
    true_file = {f: _cost_mamba(f) * ratio[u] for u, fs in model.items() for f in fs}
    true_head = {kind: _headers_mamba([f"selective_scan_{kind}_"]) * statistics.fmean(
        r for u, r in ratio.items() if f"_{kind}_" in model[u][0]) for kind in ("fwd", "bwd")}

    def true_load(files: list[str]) -> float:
        return true_head["fwd" if "_fwd_" in files[0] else "bwd"] + sum(
            true_file[f] for f in files)

    def longest(layout: dict[str, list[str]]) -> float:
        return max(map(true_load, layout.values()))

    rng = random.Random(1)
    record = work.parent / "record.json"
    print(f"the model's packing: longest unit {longest(model):.1f} s by the truth, mean "
          f"{statistics.fmean(map(true_load, model.values())):.1f} s, {len(model)} units; "
          f"noise sd {sd:.1%} of a unit (run 25's pooled: {pooled:.1%})")
    for keep in (1, 2, 4):
        ends = []
        for _ in range(rounds):
            builds: list[list[dict[str, object]]] = []
            layout = model
            for _ in range(6):
                builds.insert(0, [{"source": f"csrc/{u}.cu", "members": fs,
                                   "seconds": true_load(fs) * (1 + rng.gauss(0, sd))}
                                  for u, fs in layout.items()])
                del builds[keep:]
                record.write_text(json.dumps({"units": builds[0], "earlier": builds[1:]}))
                os.environ["WHEELFORGE_UNIT_COSTS"] = str(record)
                layout = packing()
            ends.append(longest(layout))
        print(f"a record of {keep} build(s): the longest unit of the sixth packing "
              f"{statistics.fmean(ends):.1f} s on average, {min(ends):.1f}-{max(ends):.1f} s "
              f"over {rounds} rounds")


if __name__ == "__main__":
    main()
