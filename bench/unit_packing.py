#!/usr/bin/env python3
"""The split builds packed by the built-in cost model against packed by recorded costs.

For each recipe (default causal-conv1d and mamba-ssm), side by side in one run, same
machine, jobs and arch list, the compile cache off, into a private cache root (the managed
torch environments of the usual cache are linked in, not rebuilt) and a private index:
  A: model     `wheelforge build NAME --force` with no record: the patch's cost model
               packs the units; the build records what ninja logged (CACHE/stats)
  B: recorded  the same build again: the patch packs by A's recorded unit costs
               (WHEELFORGE_UNIT_COSTS)
and prints, for each, the wall time of the build command, its CPU time (user + system of
every child), wall / (CPU / cores), the ninja phase's longest unit against the sum of its
units, the compile step against the units' sum / cores (the split's own ratio), and the
load average before and after.  No timing is asserted.  --python, --sources and
--git-mirror as `wheelforge build` takes them (a machine without network).  A companion
(mamba-ssm's causal-conv1d) is built once first and reused.  On 2 cores about 10 minutes
for causal-conv1d, 15 for mamba-ssm.

    .venv/bin/python bench/unit_packing.py [--recipe causal-conv1d] [--arch 12.0] [--jobs N]
        [--python PATH] [--sources DIR] [--git-mirror URL=PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parent.parent
sys.path.insert(0, str(REPO / "src"))

from wheelforge.builder.config import cpu_count, default_cache_dir  # noqa: E402


def build(name: str, cache: Path, index: Path, arch: str, jobs: int | None,
          env: dict[str, str], extra: list[str]) -> dict[str, float | str]:
    argv = [sys.executable, "-m", "wheelforge", "build", name, "--force", "--arch", arch,
            "--cache-dir", str(cache), "--index", str(index), "--no-stack-check", *extra]
    if jobs:
        argv += ["--jobs", str(jobs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.monotonic()
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    units = json.loads((cache / "stats" / f"{name}.units.json").read_text())["units"]
    jobs_line = next((ln.strip() for ln in res.stderr.splitlines() if "MAX_JOBS=" in ln
                      and "compile" in ln), "")
    # the last compile step is the recipe's (--force rebuilds a companion first)
    step = next((m for ln in reversed(res.stderr.splitlines())
                 if (m := re.search(r"ok compile \(.*\) \((?:(\d+)m)?([\d.]+)s\)$", ln))), None)
    compile_s = (int(step[1] or 0) * 60 + float(step[2])) if step else float("nan")
    return {"wall": wall, "cpu": cpu, "load": f"{load:.1f}-{os.getloadavg()[0]:.1f}",
            "longest": max(u["seconds"] for u in units),
            "sum": sum(u["seconds"] for u in units), "units": len(units),
            "jobs": jobs_line[:100], "compile": compile_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", action="append", default=None)
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--python", default=None)
    ap.add_argument("--sources", default=None)
    ap.add_argument("--git-mirror", default=None)
    args = ap.parse_args()
    extra = (["--python", args.python] if args.python else []) + \
        (["--sources", args.sources] if args.sources else []) + \
        (["--git-mirror", args.git_mirror] if args.git_mirror else [])
    names = args.recipe or ["causal-conv1d", "mamba-ssm"]
    cores = cpu_count()
    root = Path(tempfile.mkdtemp(prefix="wf-bench-packing-"))
    cache, index = root / "cache", root / "index"
    (cache / "envs").mkdir(parents=True)
    shared = default_cache_dir()
    for entry in (shared / "envs").glob("*"):  # torch environments: linked, not rebuilt
        (cache / "envs" / entry.name).symlink_to(entry)
    for sub in ("sources",):  # verified sources: linked, not fetched again
        if (shared / sub).is_dir():
            (cache / sub).symlink_to(shared / sub)
    env = dict(os.environ, WHEELFORGE_COMPILE_CACHE="off")
    env.pop("MAX_JOBS", None)
    mirror = REPO.parent / "shared" / "upstream" / "state-spaces-mamba.bundle"
    if not mirror.is_file():
        mirror = Path("/work/shared/upstream/state-spaces-mamba.bundle")
    if mirror.is_file():
        env.setdefault("WHEELFORGE_GIT_MIRRORS", f"https://github.com/state-spaces/mamba={mirror}")
    print(f"{cores} cores, cache root {root}, load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for name in names:
        if name == "mamba-ssm":  # its companion, built (and recorded) once, not measured
            build("causal-conv1d", cache, index, args.arch, args.jobs, env, extra)
        (cache / "stats" / f"{name}.units.json").unlink(missing_ok=True)
        for label in ("model", "recorded"):
            r = build(name, cache, index, args.arch, args.jobs, env, extra)
            rows.append((name, label, r))
            print(f"{name:14} {label:8} wall {r['wall']:7.1f} s  CPU {r['cpu']:7.1f} s  "
                  f"wall/(CPU/{cores}) {r['wall'] / (r['cpu'] / cores):.2f}  longest unit "
                  f"{r['longest']:.1f} s of {r['units']} (sum {r['sum']:.0f} s)  compile step "
                  f"{r['compile']:.1f} s, / (sum/{cores}) "
                  f"{r['compile'] / (r['sum'] / cores):.2f}  load {r['load']}", flush=True)
    print()
    print(f"recipe          wall model / recorded   wall/(CPU/{cores}) model -> recorded")
    for name in names:
        a, b = (r for n, _label, r in rows if n == name)
        print(f"{name:14}  {a['wall']:6.1f} / {b['wall']:6.1f} s ({a['wall'] / b['wall']:.2f}x)"
              f"   {a['wall'] / (a['cpu'] / cores):.2f} -> {b['wall'] / (b['cpu'] / cores):.2f}"
              f"   (load {a['load']} / {b['load']})")


if __name__ == "__main__":
    main()
