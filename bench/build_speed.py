#!/usr/bin/env python3
"""Build speed of a split recipe (causal-conv1d, mamba-ssm), side by side in one run.

  A  upstream's default build (9 architectures under CUDA 13, --threads 4), CUDA_HOME
     set so that it builds at all: causal-conv1d's unpatched sdist; mamba-ssm's pinned
     commit with only patch 0003 (C++20: torch 2.14's headers refuse C++17)
  B  one architecture, the series before the split (causal-conv1d 0001-0004,
     mamba-ssm 0001-0007)
  C  one architecture, the whole series: causal-conv1d's 0005 splits the backward
     kernels into as many units as MAX_JOBS can use, 0006 drops debug info from the
     binding unit, 0007 compresses every unit's fatbin; mamba-ssm's 0008 splits every
     dispatcher by launch configuration into units sized by MAX_JOBS
  G  C's tree compiled as `wheelforge build` compiles it by default: each unit's nvcc
     behind the gate of a pool of MAX_JOBS slots that lends nothing, with
     builder/artifact/reproducible.py's options: nvcc as the toolkit runs it (no ptxas
     split, no step runner); setuptools' wheel stored, then relabelled (wheel.relabel: the
     extension deflated once, on every core).  --builds GD: the default against the
     opt-in lending and runner
  D  G as `wheelforge build` compiles with WHEELFORGE_NVCC_STEPS=1 (the default until
     issue 51): the pool lends its free slots through its jobserver, with
     builder/compiling/jobserver.py's options (ptxas splits each unit on as many threads as
     the pool's jobserver lends it) and the step runner in front of nvcc.
     --builds DC runs both, D first; CD, C first
  E  D after an earlier build recorded its unit costs (builder/compiling/unitcosts.py; E
     needs a D, E, S or P before it).  Since issue 53 the record never reaches the split
     patches (it only orders a command's compiles), so E packs the units as D does; the
     letter stays for the runs in docs/performance.md.  A letter may repeat (--builds
     DEEE); each build has a tree of its own
  S  E with each unit's steps as nvcc runs them, one after another (before stop 49):
     D, E and P run the host compile beside ptxas and fatbinary (builder/compiling/nvccsteps.py),
     S after them (--builds DESESE: the two side by side, each packed by the record)
  P  D with the pool's previous lending (before stop 45): a slot freed by an ending unit
     went to ptxas's threads only once no gate had ended for LEND_AFTER_S (1 s), where
     D lends it LEND_AFTER_END_S (0.25 s) after the end (--builds DPPD: the two side by
     side)

Each is a bare build without isolation in wheelforge's managed build environment with
the same MAX_JOBS and the recipe's build.env: pypa/build's build_wheel hook, as
wheelforge builds (default), or `pip wheel --no-build-isolation` with --frontend pip
(runs setup.py twice).  Prints wall time, CPU time (user+sys of all compiler
processes), wheel size, the ratios, the load average before and after, and where each
build's time went: before ninja (setup.py, torch's checks), ninja (its longest steps),
the link, packaging.  On 2 cores A alone takes ~30-40 min (causal-conv1d) or over an
hour (mamba-ssm).

    .venv/bin/python bench/build_speed.py [--recipe causal-conv1d|mamba-ssm]
        [--arch 12.0] [--jobs N] [--builds CBA] [--frontend build|pip] [--python PATH]
        [--sources DIR] [--git-mirror URL=PATH] [--keep DIR]

--python builds with an existing interpreter that has torch (as `wheelforge build
--python` does) instead of the managed environment; --sources takes the sdist from a
directory and --git-mirror a git source from a bundle or repository (as `wheelforge
build` does): together they run on a machine without network.  --keep copies the
wheels to DIR (DIR/<letter>/, the last of a repeated letter; to test or inspect them
afterwards), with each build's .ninja_log (DIR/<letter>/ninja_log.txt, and
ninja_log-<place><letter>.txt for each build: every compile step's start and end).
With --keep, --phases also keeps, for each D, E, S and P build, the time each of its
nvcc's phases took (nvcc --time: phases-<place><letter>.csv), the pool's free slots
sampled every 0.1 s (free-<place><letter>.json) and the unit-cost record written after
it (record-<place><letter>.json: each unit's seconds and files); scripts/unit-timeline.py
and scripts/record-predict.py read them (under --phases nvcc times its own steps, so
D, E and P run them as S does: one after another).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from wheelforge.builder.artifact import reproducible  # noqa: E402
from wheelforge.builder.artifact.identity import tree_id  # noqa: E402
from wheelforge.builder.compiling import backend, jobserver, nvccsteps, toolchain, unitcosts  # noqa: E402
from wheelforge.builder.config import cpu_count, resolve  # noqa: E402
from wheelforge.builder.env import buildenv, bytecode  # noqa: E402
from wheelforge.builder.source.fetch import extract, fetch  # noqa: E402
from wheelforge.builder.source.patch import apply_series  # noqa: E402
from wheelforge.recipe.format import RecipeBook  # noqa: E402
from wheelforge.wheel import relabel  # noqa: E402


@dataclass(frozen=True)
class Split:
    first: str  # the first build-speed patch: B is the series before it
    upstream: tuple[str, ...] = ()  # the patches A needs to build at all
    env: dict[str, str] = field(default_factory=dict)


SPLITS = {
    "causal-conv1d": Split("0005", env={"CAUSAL_CONV1D_FORCE_BUILD": "TRUE"}),
    "mamba-ssm": Split("0008", upstream=("0003",)),
}


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" ({cpu_count()} cores)"


@dataclass
class Result:
    name: str
    wall: float
    cpu: float
    size: int
    ninja: float | None = None  # wall seconds in ninja (the parallel compile)


def ninja_steps(tree: Path) -> list[tuple[float, float, str]]:
    """(start s, end s, output) of every step in the build's .ninja_log."""
    steps = []
    for log in tree.glob("build/*/.ninja_log"):
        for line in log.read_text().splitlines():
            if line.startswith("#"):
                continue
            start, end, _mtime, output = line.split("\t")[:4]
            steps.append((int(start) / 1000, int(end) / 1000, Path(output).name))
    return steps


class Unused:
    """The pool's free slots (neither at a gate nor with ptxas's threads) sampled every
    0.1 s while a build runs: [(time.time(), free)]."""

    def __init__(self, pool: jobserver.Pool) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pool,), daemon=True)

    def _run(self, pool: jobserver.Pool) -> None:
        while not self._stop.wait(0.1):
            self.samples.append((time.time(), pool.free()))

    def __enter__(self) -> Unused:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def report(self, tree: Path, steps: list[tuple[float, float, str]]) -> str:
        """Slot-seconds unused in ninja's phase, and once it has started its last CUDA
        unit (no gate asks for slots after that)."""
        ninja_files = list(tree.glob("build/*/build.ninja"))
        if len(ninja_files) != 1:
            return "    pool: (no single build.ninja)"
        names = {Path(line.split()[1].rstrip(":").replace("$:", ":")).name
                 for line in ninja_files[0].read_text().splitlines()
                 if line.startswith("build ") and " cuda_compile " in line}
        cuda = [b for b, _, o in steps if o in names]
        if not cuda:
            return "    pool: (no CUDA unit in ninja's log)"
        start = ninja_files[0].stat().st_mtime
        end, tail = start + max(e for _, e, _ in steps), start + max(cuda)
        inside = [f for t, f in self.samples if start <= t <= end]
        after = [f for t, f in self.samples if tail <= t <= end]
        return (f"    pool: {sum(inside) * 0.1:.0f} slot-s unused in ninja's phase, "
                f"{sum(after) * 0.1:.0f} of them after it started its last CUDA unit "
                f"(the last {end - tail:.1f} s)")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def phases(tree: Path, t0: float, t1: float, steps: list[tuple[float, float, str]]
           ) -> dict[str, float] | None:
    """Wall seconds before ninja, in ninja, linking and packaging, from the times the
    build wrote build.ninja (just before ninja starts), its .ninja_log and the
    extension (the link's output); t0, t1: the build's start and end (time.time())."""
    ninja_files = list(tree.glob("build/*/build.ninja"))
    libs = list(tree.glob("build/lib*/**/*.so"))
    if len(ninja_files) != 1 or not libs or not steps:
        return None
    start = ninja_files[0].stat().st_mtime
    end = start + max(e for _, e, _ in steps)
    linked = max(p.stat().st_mtime for p in libs)
    return {"before ninja": start - t0, "ninja": end - start, "link": linked - end,
            "package": t1 - linked}


def run_frontend(frontend: str, tree: Path, env: buildenv.BuildEnv,
                 environ: dict[str, str], out: Path, packed: bool = False) -> None:
    if frontend == "pip":
        subprocess.run([str(env.python), "-m", "pip", "wheel", "--no-build-isolation",
                        "--no-deps", "-q", "-w", str(out), str(tree)],
                       env=environ, check=True, stdout=subprocess.DEVNULL)
    else:
        # wheelforge's own build step (pypa/build's build_wheel hook); the compilers'
        # output (ptxas -v is loud) goes to a log that a failure names
        with warnings.catch_warnings():  # the backend's deprecation notices
            warnings.simplefilter("ignore")
            backend.build_wheel(tree=tree, env=env, environ=environ, out_dir=out,
                                log=out.parent / f"{out.name}-build.log", stored=packed)
    if packed:  # as the pipeline packs it: the stored wheel relabelled, deflated once
        (raw,) = out.glob("*.whl")
        final = relabel(raw, out.parent / f"{out.name}-final", local="bench", torch_pin=None)
        raw.unlink()
        final.replace(out / final.name)


def build(name: str, tree: Path, env: buildenv.BuildEnv, environ: dict[str, str], out: Path,
          keep: Path | None, frontend: str) -> Result:
    print(f"building {name} ...", flush=True)
    cpu0, t0, w0 = children_cpu(), time.monotonic(), time.time()
    run_frontend(frontend, tree, env, environ, out, packed=name[0] in "DEPS")
    wall, cpu, w1 = time.monotonic() - t0, children_cpu() - cpu0, time.time()
    (wheel,) = out.glob("*.whl")
    steps = ninja_steps(tree)
    res = Result(name, wall, cpu, wheel.stat().st_size)
    print(f"  {name}: wall {wall:.0f} s, cpu {cpu:.0f} s, wheel {res.size / 2**20:.1f} MiB",
          flush=True)
    if steps:
        top = sorted(((e - s, o) for s, e, o in steps), reverse=True)[:6]
        print(f"    ninja: {len(steps)} compile steps; longest: "
              + ", ".join(f"{o} {d:.0f} s" for d, o in top), flush=True)
    split = phases(tree, w0, w1, steps)
    if split:
        print("    wall: " + ", ".join(f"{k} {v:.1f} s" for k, v in split.items()),
              flush=True)
        res.ninja = split["ninja"]
    if keep:
        (keep / name[0]).mkdir(parents=True, exist_ok=True)  # a repeated letter: the last
        for log in tree.glob("build/*/.ninja_log"):  # every step's start and end, in ms
            shutil.copy2(log, keep / name[0] / "ninja_log.txt")
            # and by the build's place in --builds (0D, 1E, ...), for a repeated letter
            shutil.copy2(log, keep / name[0] / f"ninja_log-{out.parent.name}.txt")
        part = keep / name[0] / (wheel.name + ".part")  # appears whole, or not at all
        shutil.copy2(wheel, part)
        os.replace(part, keep / name[0] / wheel.name)
    return res


def keep_phases(keep: Path, place: str, work: Path, tree: Path, unused: Unused) -> None:
    """--phases: the build's nvcc phase times and the pool's free slots, with ninja's
    start (build.ninja's mtime, the zero of its .ninja_log), into ``keep``."""
    keep.mkdir(parents=True, exist_ok=True)
    if (work / "phases.csv").is_file():
        shutil.copy2(work / "phases.csv", keep / f"phases-{place}.csv")
    ninja_files = list(tree.glob("build/*/build.ninja"))
    free = {"ninja_start": ninja_files[0].stat().st_mtime if len(ninja_files) == 1 else None,
            "samples": unused.samples}
    (keep / f"free-{place}.json").write_text(json.dumps(free))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", choices=sorted(SPLITS), default="causal-conv1d")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--builds", default="CBA",
                    help="which builds, in the order given, a letter may repeat (default "
                         "CBA; CB leaves out upstream's; GD: the default build against "
                         "the opt-in lending and runner; DC and CD: the pool's jobserver "
                         "against none; DE: packed by the model against by the record; DP: "
                         "lent 0.25 s after a unit's end against as before)")
    ap.add_argument("--skip-upstream", action="store_true", help="same as --builds CB")
    ap.add_argument("--frontend", choices=("build", "pip"), default="build",
                    help="pypa/build's build_wheel hook (default: setup.py runs once, as "
                         "in wheelforge) or pip wheel (runs setup.py twice, for metadata "
                         "and the wheel)")
    ap.add_argument("--python", type=Path, default=None,
                    help="build with this interpreter (it must have torch) instead of "
                         "the managed environment")
    ap.add_argument("--sources", type=Path, action="append", default=[],
                    help="directory holding the sdist (no download)")
    ap.add_argument("--git-mirror", action="append", default=[], metavar="URL=PATH",
                    help="fetch the git URL from this bundle or repository only")
    ap.add_argument("--keep", type=Path, default=None, help="copy the wheels here")
    ap.add_argument("--phases", action="store_true",
                    help="with --keep: keep each D, E, S and P build's nvcc phase times "
                         "(nvcc --time), the pool's free slots and the unit-cost record, "
                         "for scripts/unit-timeline.py and scripts/record-predict.py (nvcc "
                         "then runs each unit's steps one after another, as in S)")
    args = ap.parse_args()
    if args.phases and args.keep is None:
        ap.error("--phases keeps its files with the wheels: give --keep DIR")
    recipe = RecipeBook(REPO / "recipes", REPO / "patches").load(args.recipe)
    split = SPLITS[args.recipe]
    mirrors = {}
    for item in args.git_mirror:
        url, sep, path = item.partition("=")
        if not sep:
            ap.error(f"--git-mirror {item!r}: expected URL=PATH")
        mirrors[url] = Path(path).absolute()
    config = resolve(arch=args.arch, jobs=args.jobs,
                     environ={k: v for k, v in os.environ.items()
                              if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")})
    if args.python:
        env = buildenv.inspect_env(args.python.absolute())
    else:
        env = buildenv.managed_env(config.cache_dir, base_python=config.base_python,
                                   torch_req=config.torch, requirements=recipe.build.requires)
    cuda = toolchain.find_cuda()
    archive = fetch(recipe, config.cache_dir, sources_dirs=args.sources,
                    git_mirrors=mirrors).archive
    # B: the series up to the build-speed patches; A: only what upstream needs to build
    unsplit = [p for p in recipe.patches if p.name < split.first]
    upstream = [p for p in recipe.patches if p.name[:4] in split.upstream]
    # TORCH_NO_COMPILER_WRAPPER: torch would otherwise route compilers through a ccache
    # it finds on PATH, and a cache hit is not a build
    base = {**os.environ, "MAX_JOBS": str(config.jobs), "NVCC_THREADS": "1",
            "TORCH_NO_COMPILER_WRAPPER": "1", "CUDA_HOME": str(cuda.home),
            **dict(recipe.build.env), **split.env,  # (causal-conv1d's recipe has it too)
            "PATH": f"{env.bin_dir}:{cuda.home / 'bin'}:{os.environ['PATH']}"}
    base.pop("TORCH_CUDA_ARCH_LIST", None)
    # as the pipeline runs the backend: torch's bytecode kept (builder/env/bytecode.py)
    base = bytecode.environ(base, python=env.python, managed=env.managed,
                            cache_dir=config.cache_dir)
    print(f"{recipe.name} {recipe.version}, nvcc {cuda.version}, {cpu_count()} cores, "
          f"MAX_JOBS={config.jobs}, arch {config.arch_list}, {env.describe()}", flush=True)
    builds = "CB" if args.skip_upstream else args.builds.upper()
    names = {"A": "A upstream", "B": "B one arch", "C": "C split", "D": "D split, pool",
             "G": "G split, pool, as nvcc runs",
             "E": "E split, pool, recorded", "P": "P split, pool, lent as before",
             "S": "S split, pool, recorded, nvcc's steps"}
    if set(builds) - set(names) or not builds:
        ap.error(f"--builds {builds!r}: letters of ABCDEGPS")
    for packed in "ES":
        if packed in builds and "D" not in builds[:builds.index(packed)]:
            ap.error(f"--builds: {packed} packs by an earlier D's record: put a D before it")
    series = {"A": upstream, "B": unsplit}
    results = []
    with tempfile.TemporaryDirectory(prefix="wf-speed-") as tmp:
        t = Path(tmp)
        one_arch = dict(base, TORCH_CUDA_ARCH_LIST=config.arch_list)
        flags = reproducible.nvcc_flags(cuda.nvcc) + jobserver.nvcc_flags(cuda.nvcc)
        # the first build does not pay for what the others find ready: torch's files in
        # the page cache and, under PYTHONDONTWRITEBYTECODE, its bytecode (bytecode.py)
        t0 = time.monotonic()
        subprocess.run([str(env.python), "-c", "import setuptools, torch.utils.cpp_extension"],
                       env=base, check=True, capture_output=True)
        print(f"warm-up: setup.py's imports in {time.monotonic() - t0:.1f} s", flush=True)
        print(f"load average before: {load()}", flush=True)
        record = None  # the unit costs of the D, E and P builds so far (the latest 4)
        for i, letter in enumerate(builds):
            name, work = names[letter], t / f"{i}{letter}"
            tree = extract(archive, work / "src")
            apply_series(tree, series.get(letter, recipe.patches), project=recipe.name)
            environ = base if letter == "A" else one_arch
            # P: a slot an ending unit frees is lent only once no gate has ended for
            # LEND_AFTER_S, as before stop 45 (the pool reads the constants as it runs)
            lend_after_end = jobserver.LEND_AFTER_END_S
            if letter == "P":
                jobserver.LEND_AFTER_END_S = jobserver.LEND_AFTER_S
            with jobserver.Pool(config.jobs, lend=letter != "G") as pool:
                # nvcc appends a row per phase per unit to one file (O_APPEND lines)
                timed = ["--time", str(work / "phases.csv")] if args.phases else []
                steps_report = work / "nvcc-steps.txt"
                if letter == "G":  # as `wheelforge build` compiles by default
                    nvcc = " ".join([str(cuda.nvcc), *reproducible.nvcc_flags(cuda.nvcc),
                                     *timed])
                    environ = dict(environ, PYTORCH_NVCC=pool.gate(nvcc, 1, 0.0))
                    print(f"  G: nvcc as the toolkit runs it, a pool of {pool.size}",
                          flush=True)
                if letter in "DEPS":
                    nvcc = " ".join([str(cuda.nvcc), *flags, *timed])
                    if letter != "S":  # as _compile_slots puts it in front of nvcc
                        nvcc = jobserver.steps_in_front(nvcc, {}, t / "nvcc-steps")
                    environ = dict(environ, PYTORCH_NVCC=pool.gate(nvcc, 1, 0.0),
                                   **{nvccsteps.REPORT_ENV: str(steps_report)})
                    print(f"  {letter}: nvcc {' '.join(flags)}, a pool of {pool.size}"
                          + (", after a build that recorded its units" if
                             letter in "ES" else "")
                          + (", nvcc's steps one after another" if letter == "S" else
                             ", each unit's host compile beside its ptxas"), flush=True)
                if letter in "ES" and record is None:
                    raise SystemExit(f"{letter}: the build before it recorded no units "
                                     "(no .ninja_log in its tree)")
                with Unused(pool) as unused:
                    results.append(build(name, tree, env, environ, work / "out",
                                         args.keep, args.frontend))
                if letter in "DEPSG":
                    print(unused.report(tree, ninja_steps(tree)), flush=True)
                    if steps_report.is_file():  # how each unit's host compile ran
                        hows = [line.split()[0] for line in steps_report.read_text().splitlines()]
                        print("    host compiles: " + ", ".join(
                            f"{hows.count(h)} {h}" for h in sorted(set(hows))), flush=True)
                    if args.phases:
                        keep_phases(args.keep / letter, f"{i}{letter}", work, tree, unused)
            jobserver.LEND_AFTER_END_S = lend_after_end
            if letter in "DEPSG":  # as the pipeline records a cold compile's units
                record = unitcosts.record(t, recipe.name, tree=tree_id(recipe),
                                          arch_list=config.arch_list, jobs=config.jobs,
                                          threads=1,
                                          costs=unitcosts.read_ninja_costs(tree))
                if args.phases and record is not None:  # which files each unit held
                    shutil.copy2(record, args.keep / letter / f"record-{i}{letter}.json")
    by = {r.name[0]: r for r in results}  # a repeated letter: its last build
    print(f"load average after: {load()}")
    print()
    print(f"{'build':24} {'wall s':>8} {'cpu s':>8} {'wheel MiB':>10}")
    for r in results:
        print(f"{r.name:24} {r.wall:8.0f} {r.cpu:8.0f} {r.size / 2**20:10.1f}")
    print()
    if "A" in by and "B" in by:
        print(f"A/B wall ratio (one arch vs upstream default): {by['A'].wall / by['B'].wall:6.2f}x")
    if "A" in by and "C" in by:
        print(f"A/C wall ratio (split one arch vs upstream):   {by['A'].wall / by['C'].wall:6.2f}x")
    if "B" in by and "C" in by:
        print(f"B/C wall ratio (split vs unsplit, one arch):   "
              f"{by['B'].wall / by['C'].wall:6.2f}x")
    if "A" in by and "D" in by:
        print(f"A/D wall ratio (split, pool vs upstream):      {by['A'].wall / by['D'].wall:6.2f}x")
    if "G" in by and "D" in by:
        print(f"G/D wall ratio (the opt-in lending and runner vs the default): "
              f"{by['G'].wall / by['D'].wall:6.2f}x")
    if "C" in by and "D" in by:
        print(f"C/D wall ratio (the pool's jobserver vs none): "
              f"{by['C'].wall / by['D'].wall:6.2f}x")
    if "D" in by and "P" in by:
        ds, ps = ([r.wall for r in results if r.name[0] == k] for k in "DP")
        print(f"P/D wall ratio (lent 0.25 s after an end vs 1 s of quiet, means of "
              f"{len(ds)} and {len(ps)}): {sum(ps) / len(ps) / (sum(ds) / len(ds)):6.2f}x")
    if "D" in by and "E" in by:
        print(f"D/E wall ratio (packed by the record vs the model): "
              f"{by['D'].wall / by['E'].wall:6.2f}x")
    if "E" in by and "S" in by:
        es, ss = ([r.wall for r in results if r.name[0] == k] for k in "ES")
        print(f"S/E wall ratio (host compile beside ptxas vs after it, means of "
              f"{len(es)} and {len(ss)}): {sum(ss) / len(ss) / (sum(es) / len(es)):6.2f}x")
    for c in (r for r in results if r.name[0] in "CDEGPS"):
        k = c.name[0]
        print(f"{k} wall / ({k} cpu / {cpu_count()} cores):              "
              f"{c.wall / (c.cpu / cpu_count()):6.2f}  (1.0 = every core busy the whole build)")
        if c.ninja:
            # outside ninja (setup.py and torch's import, the link, packaging) one process
            # runs on one core: its CPU time is about its wall time
            outside = c.wall - c.ninja
            print(f"  of which: {outside:.1f} s outside ninja, on one core; ninja's wall / "
                  f"((cpu - {outside:.1f} s) / {cpu_count()}): "
                  f"{c.ninja / ((c.cpu - outside) / cpu_count()):.2f}")


if __name__ == "__main__":
    main()
