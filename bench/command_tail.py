#!/usr/bin/env python3
"""The steps after a compile, an older revision against this tree, side by side.

What `wheelforge build RECIPE` does once its compile is done (post-process, verify with
its import check, publish, the stack check) runs on one core while the machine waits.
This times those steps for two revisions of wheelforge in one run: the old one from
``git archive REV`` (its ``src`` first on ``PYTHONPATH``, this checkout's ``.venv``
otherwise), the new one this working tree.  Every build is ``wheelforge build RECIPE
--force`` into a fresh index per run, the compile served by the compile cache (a first,
untimed build fills it), so what is timed is the steps around the compile.

Each variant is timed in its steady state.  Under ``PYTHONDONTWRITEBYTECODE=1`` the old
code's import check keeps no bytecode (only setup.py's imports have theirs: torch's), so
before each old build every ``.pyc`` in the managed environments but torch's is removed
(setup.py writes what else it needs again, in the compile, which is not compared); the
new code keeps the import check's, so its first build after that writes it (reported,
not compared) and its second is timed.  Prints each step's seconds as the builds report
them, the wall time, the load average, and the ratios.  No timing is asserted.

    .venv/bin/python bench/command_tail.py [--old REV] [--recipe mamba-ssm] [--rounds 2]
        [--arch 12.0] [--git-mirror URL=PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parent.parent
#: main before stop 44's changes to these steps (bytecode of the import check, the stack
#: check's early venv and pip check beside the imports)
OLD = "706a39a"
STEP = re.compile(r"^(?:\[(?P<recipe>[^\]]+)\])?\s+ok (?P<step>post-process wheel|verify|"
                  r"publish to \S+|stack check of \S+)[^(]*\((?P<s>[0-9.]+)s\)$")
STEPS = ("post-process wheel", "verify", "publish", "stack check")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def build(src: Path, recipe: str, arch: str, index: Path, mirrors: list[str],
          log: Path) -> dict[str, float]:
    """One `wheelforge build --force` with ``src`` first on the path: each step's seconds
    for ``recipe`` (the stack check's for the command) and the wall time."""
    env = dict(os.environ, PYTHONPATH=str(src))
    argv = [sys.executable, "-m", "wheelforge", "build", recipe, "--arch", arch,
            "--index", str(index), "--force"]
    for m in mirrors:
        argv += ["--git-mirror", m]
    start = time.monotonic()
    with log.open("w") as out:
        res = subprocess.run(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    if res.returncode != 0:
        sys.exit(f"the build failed ({res.returncode}); see {log}")
    found = {"wall": wall}
    for line in log.read_text().splitlines():
        m = STEP.match(line)
        if m and m["recipe"] in (None, recipe):
            step = next(s for s in STEPS if m["step"].startswith(s))
            found[step] = float(m["s"])
    return found


def site_packages() -> list[Path]:
    """The managed environments' site-packages directories (the cache's envs)."""
    cache = Path(os.environ.get("WHEELFORGE_CACHE", Path.home() / ".cache" / "wheelforge"))
    return sorted(cache.glob("envs/*/lib/python*/site-packages"))


def forget_bytecode() -> int:
    """Remove the managed environments' bytecode but torch's: the old code's steady
    state (see the module's text)."""
    n = 0
    for site in site_packages():
        for pyc in site.rglob("*.pyc"):
            if pyc.relative_to(site).parts[0] != "torch":
                pyc.unlink(missing_ok=True)
                n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default=OLD, help=f"the older revision (default {OLD})")
    ap.add_argument("--recipe", default="mamba-ssm")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--git-mirror", action="append", default=[], metavar="URL=PATH")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="wf-tail-") as tmp:
        root = Path(tmp)
        old_src = root / "old"
        old_src.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.old, "src"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_src)], input=archive, check=True)
        variants = {"old": old_src / "src", "new": REPO / "src"}
        print(f"{args.recipe}, arch {args.arch}, {os.cpu_count()} cores; old {args.old}, "
              f"new this tree; load before {load()}", flush=True)
        print("warm-up (untimed): fills the compile cache", flush=True)
        build(variants["new"], args.recipe, args.arch, root / "idx-warm", args.git_mirror,
              root / "warm.log")
        runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        n = 0
        for r in range(1, args.rounds + 1):
            removed = forget_bytecode()
            for name, timed in (("old", True), ("new", False), ("new", True)):
                n += 1
                got = build(variants[name], args.recipe, args.arch, root / f"idx-{n}",
                            args.git_mirror, root / f"build-{n}.log")
                what = "timed" if timed else "writes its bytecode, not compared"
                print(f"round {r} {name} ({what}): " + ", ".join(
                    f"{k} {v:.1f} s" for k, v in got.items()) + f"; load {load()}"
                    + (f"; {removed} .pyc removed before" if name == "old" else ""),
                    flush=True)
                if timed:
                    runs[name].append(got)
        print(f"load after {load()}")
        print()
        for key in (*STEPS, "wall"):
            old = [g[key] for g in runs["old"] if key in g]
            new = [g[key] for g in runs["new"] if key in g]
            if old and new:
                mo, mn = sum(old) / len(old), sum(new) / len(new)
                print(f"{key:20} old {mo:6.1f} s  new {mn:6.1f} s  "
                      f"(old / new {mo / mn:.2f}x; old - new {mo - mn:+.1f} s)" if mn else "")


if __name__ == "__main__":
    main()
