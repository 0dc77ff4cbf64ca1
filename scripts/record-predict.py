#!/usr/bin/env python3
"""How well a unit-cost record predicts the next build's units: mamba-ssm, offline, from
what `bench/build_speed.py --keep DIR --phases` kept (record-<place>.json: each unit's
seconds and files), docs/performance.md, stop 48.

For each record-packed build at PLACE (1E, 2E, ...) the record of the build before it
(the record it was packed by: its latest build and up to three before) gives every file
an estimate, and the estimate of each of the build's own units (its headers + its files)
is set against the seconds it took.  Three estimators: patch 0010's (a unit's seconds over
its model spread over its files, the mean over the builds), the same iterated to a fixed
point (each file scaled by the geometric mean of the ratios of the units that held it),
and least squares over the units pulled toward patch 0010's estimates.  Prints, for each,
the standard deviation of the errors (what a packing cannot plan) and their mean (the
build as a whole faster or slower, which moves every unit alike).

    scripts/record-predict.py DIR 1E 2E 3E

DIR holds D/ and E/ as --keep writes them.  Files of the halves (stop 47, ..._even.cu,
..._uneven.cu) cost half their launcher by the model, the launcher nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests")]

from test_unit_costs import (  # type: ignore[import-not-found]  # noqa: E402  (the model)
    _cost_mamba,
    _headers_mamba,
)

PLACE = re.compile(r"(\d+)[A-Z]")  # a build's place and letter in --builds: 0D, 1E, ...
Units = list[tuple[float, list[str]]]  # (seconds, files)
Estimate = tuple[dict[str, float], dict[str, float]]  # headers by kind, cost by file


def kind(name: str) -> str:
    return "fwd" if "_fwd_" in name else "bwd"


def model(name: str, halves: bool) -> float:
    for half in ("_even.cu", "_uneven.cu"):
        if name.endswith(half):
            return float(_cost_mamba(name[: -len(half)] + ".cu")) / 2
    return 0.0 if halves and "_bwd_" in name else float(_cost_mamba(name))


def read(path: Path) -> list[Units]:
    data = json.loads(path.read_text())
    builds = [data["units"], *data.get("earlier", [])]
    return [[(float(u["seconds"]), list(u["members"])) for u in b if u.get("members")]
            for b in builds]


def patch_0010(units: Units, cost: Callable[[str], float]) -> Estimate:
    est: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {"fwd": [], "bwd": []}
    for seconds, files in units:
        r = seconds / (_headers_mamba(files) + sum(cost(f) for f in files))
        ratios[kind(files[0])].append(r)
        for f in files:
            est.setdefault(f, []).append(cost(f) * r)
    mean = {k: statistics.mean(v) if v else 1.0 for k, v in ratios.items()}
    heads = {"fwd": 7.5 * mean["fwd"], "bwd": 9.0 * mean["bwd"]}
    return heads, {f: statistics.mean(v) for f, v in est.items()}


def iterated(units: Units, cost: Callable[[str], float], rounds: int = 50) -> Estimate:
    heads, files = patch_0010(units, cost)
    for _ in range(rounds):
        logs: dict[str, list[float]] = {}
        hlogs: dict[str, list[float]] = {"fwd": [], "bwd": []}
        for seconds, members in units:
            k = kind(members[0])
            r = math.log(seconds / (heads[k] + sum(files[f] for f in members)))
            hlogs[k].append(r)
            for f in members:
                logs.setdefault(f, []).append(r)
        for f, v in logs.items():
            files[f] *= math.exp(statistics.mean(v))
        for k, v in hlogs.items():
            if v:
                heads[k] *= math.exp(statistics.mean(v))
    return heads, files


def least_squares(units: Units, cost: Callable[[str], float], pull: float = 1.0) -> Estimate:
    heads, files = patch_0010(units, cost)
    for k in ("fwd", "bwd"):
        names = sorted(f for f in files if kind(f) == k)
        n = len(names) + 1
        col = {f: i + 1 for i, f in enumerate(names)}
        a = [[pull if i == j else 0.0 for j in range(n)] for i in range(n)]
        b = [pull * x for x in [heads[k], *(files[f] for f in names)]]
        for seconds, members in units:
            if kind(members[0]) != k:
                continue
            row = {0: 1.0}
            for f in members:
                row[col[f]] = row.get(col[f], 0.0) + 1.0
            for i, x in row.items():
                b[i] += x * seconds
                for j, y in row.items():
                    a[i][j] += x * y
        for c in range(n):  # Gaussian elimination; the pull keeps it well posed
            p = max(range(c, n), key=lambda r: abs(a[r][c]))  # noqa: B023 (used at once)
            a[c], a[p] = a[p], a[c]
            b[c], b[p] = b[p], b[c]
            for r in range(c + 1, n):
                m = a[r][c] / a[c][c]
                if m:
                    a[r] = [x - m * y for x, y in zip(a[r], a[c], strict=True)]
                    b[r] -= m * b[c]
        sol = [0.0] * n
        for c in reversed(range(n)):
            sol[c] = (b[c] - sum(a[c][j] * sol[j] for j in range(c + 1, n))) / a[c][c]
        heads[k] = sol[0]
        files.update({f: max(0.0, sol[col[f]]) for f in names})
    return heads, files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("places", nargs="+", help="record-packed builds: 1E 2E ...")
    args = ap.parse_args()
    kept = {}  # place in --builds (its number) -> (place, the record's path)
    for path in args.dir.glob("*/record-*.json"):
        m = PLACE.fullmatch(path.name[len("record-"):-len(".json")])
        if m:
            kept[int(m[1])] = (m[0], path)
    for place in args.places:
        m = PLACE.fullmatch(place)
        before = sorted(n for n in kept if m and n < int(m[1]))
        if not m or int(m[1]) not in kept or not before:
            print(f"record-predict: no record of {place} or of a build before it in "
                  f"{args.dir} (bench/build_speed.py --keep DIR --phases writes them)",
                  file=sys.stderr)
            return 2
        packer, packed_path = kept[before[-1]]
        try:
            packed_by = read(packed_path)
            target = read(kept[int(m[1])][1])[0]
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            print(f"record-predict: cannot read the records of {packer} and {place}: {exc}",
                  file=sys.stderr)
            return 2
        halves = any(f.endswith("even.cu") for _, fs in target for f in fs)
        units = [u for b in packed_by for u in b]
        print(f"{place}, packed by {packed_path.name} ({len(packed_by)} builds)")
        def cost(name: str, halves: bool = halves) -> float:
            return model(name, halves)

        for label, estimator in (("patch 0010", patch_0010), ("iterated", iterated),
                                 ("least squares", least_squares)):
            heads, files = estimator(units, cost)
            errors = [s - heads[kind(fs[0])] - sum(files.get(f, model(f, halves))
                                                   for f in fs) for s, fs in target]
            print(f"  {label:14} errors: sd {statistics.pstdev(errors):5.2f} s, mean "
                  f"{statistics.mean(errors):6.2f} s ({len(errors)} units)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
