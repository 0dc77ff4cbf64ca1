#!/usr/bin/env python3
"""Where a split build's compile slots went: each CUDA unit's phases on ninja's clock.

    scripts/unit-timeline.py DIR/<letter> PLACE [--cores N]

reads what `bench/build_speed.py --keep DIR --phases` kept of the build at PLACE (its
place and letter in --builds: 0D, 1E, ...): ninja_log-PLACE.txt (each step's start and
end), phases-PLACE.csv (nvcc --time: the seconds of each phase of each unit's nvcc) and
free-PLACE.json (the pool's free slots every 0.1 s).  For each unit, from its start in
ninja's log: its front end (host preprocessing, cudafe++, device preprocessing, cicc:
one thread), ptxas (on as many threads as the pool's jobserver lent it), its tail
(fatbinary and the host compile: one thread), and the seconds ninja counted beyond
them (the gate's wait, nvcc's own).  Then the slot-seconds the pool held free in each
stretch of ninja's phase: until the host units end, until the first ptxas starts, until
the first unit ends, and after.  A measurement aid, not a test: nvcc writes its rows as
each phase ends, so a unit's phases are placed one after another from its start.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

FRONT = ("gcc (preprocessing 4)", "cudafe++", "gcc (preprocessing 1)", "cicc")
TAIL = ("fatbinary", "gcc (compiling)")


@dataclass(frozen=True)
class Unit:
    name: str
    start: float  # seconds after ninja started
    end: float
    front: float
    ptxas: float
    tail: float

    @property
    def ptxas_start(self) -> float:
        return self.start + (self.end - self.start) - self.tail - self.ptxas


def read_steps(path: Path) -> dict[str, tuple[float, float]]:
    steps = {}
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            continue
        start, end, _mtime, output = line.split("\t")[:4]
        steps[Path(output).name] = (int(start) / 1000, int(end) / 1000)
    return steps


def read_phases(path: Path) -> dict[str, dict[str, float]]:
    """{unit object name: {phase: seconds}}, from nvcc --time's rows."""
    out: dict[str, dict[str, float]] = {}
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if len(row) < 8 or row[0].strip() == "source file name":
                continue
            source, phase, metric = row[0].strip(), row[1].strip(), row[6].strip()
            if not source:
                continue
            name = Path(source).with_suffix(".o").name
            try:
                seconds = float(metric) / 1000  # ms
            except ValueError:
                continue
            out.setdefault(name, {})
            out[name][phase] = out[name].get(phase, 0.0) + seconds
    return out


def free_in(samples: list[tuple[float, int]], lo: float, hi: float) -> float:
    return sum(f for t, f in samples if lo <= t < hi) * 0.1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path, help="DIR/<letter> of bench/build_speed.py --keep")
    ap.add_argument("place", help="the build's place and letter in --builds: 0D, 1E, ...")
    args = ap.parse_args()
    try:
        steps = read_steps(args.dir / f"ninja_log-{args.place}.txt")
        phases = read_phases(args.dir / f"phases-{args.place}.csv")
        free = json.loads((args.dir / f"free-{args.place}.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"unit-timeline: cannot read the build's files: {exc}", file=sys.stderr)
        return 2
    units = sorted((Unit(name, s, e, sum(phases[name].get(p, 0.0) for p in FRONT),
                         phases[name].get("ptxas", 0.0),
                         sum(phases[name].get(p, 0.0) for p in TAIL))
                    for name, (s, e) in steps.items() if name in phases),
                   key=lambda u: u.end)
    hosts = {name: se for name, se in steps.items() if name not in phases}
    if not units:
        print("unit-timeline: no unit of ninja's log has nvcc phase times", file=sys.stderr)
        return 2
    end = max(e for _, e in steps.values())
    print(f"ninja: {end:.1f} s, {len(units)} CUDA units, host units: "
          + ", ".join(f"{n} {s:.1f}-{e:.1f} s" for n, (s, e) in sorted(hosts.items())))
    print(f"{'unit':22} {'start':>6} {'front':>6} {'ptxas':>6} {'tail':>5} {'other':>6} "
          f"{'ptxas at':>8} {'end':>6}")
    for u in units:
        other = (u.end - u.start) - u.front - u.ptxas - u.tail
        print(f"{u.name:22} {u.start:6.1f} {u.front:6.1f} {u.ptxas:6.1f} {u.tail:5.1f} "
              f"{other:6.1f} {u.ptxas_start:8.1f} {u.end:6.1f}")
    spread = units[-1].end - units[0].end
    print(f"units end {units[0].end:.1f}-{units[-1].end:.1f} s ({spread:.1f} s apart); "
          f"front ends {min(u.start + u.front for u in units):.1f}-"
          f"{max(u.start + u.front for u in units):.1f} s")
    zero = free.get("ninja_start")
    if zero is None:
        return 0
    samples = [(t - zero, f) for t, f in free["samples"]]
    host_end = max((e for _, e in hosts.values()), default=0.0)
    first_ptxas = min(u.ptxas_start for u in units)
    first_end = units[0].end
    marks = sorted({0.0, host_end, first_ptxas, first_end, end})
    print("slot-s the pool held free (neither at a gate nor lent to ptxas):")
    for lo, hi in zip(marks, marks[1:], strict=False):
        what = []
        if lo == 0.0:
            what.append("from ninja's start; a host unit holds no slot, its core is busy")
        if lo == host_end:
            what.append("from the host units' end")
        if lo == first_ptxas:
            what.append("from the first ptxas")
        if lo == first_end:
            what.append("from the first unit's end")
        print(f"  {lo:5.1f}-{hi:5.1f} s ({', '.join(what)}): {free_in(samples, lo, hi):6.1f}")
    print(f"  in all: {free_in(samples, 0.0, end):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
