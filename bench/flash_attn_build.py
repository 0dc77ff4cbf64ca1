#!/usr/bin/env python3
"""flash-attn 2.8.3.post2: upstream's default build against wheelforge's, side by side.

  upstream   the sdist with only the C++20 fix (patch 0003, without which nothing builds
             against torch 2.14): FLASH_ATTN_CUDA_ARCHS' default four architectures
             (sm_80, sm_90, sm_100, sm_120), NVCC_THREADS=4, MAX_JOBS by upstream's own
             formula, min(cores // 2, available GB / 9)
  wheelforge the recipe's six patches: TORCH_CUDA_ARCH_LIST=ARCH (one architecture),
             NVCC_THREADS=1, MAX_JOBS = the cores, capped at available memory / 7 GiB (the
             recipe's job-memory)

Both arms compile the same translation units with the flags the real setup.py gives
them: setup.py runs for real up to the point where torch writes build.ninja, and then
ninja builds the chosen objects of that file.  `--units all` is the whole build (72
kernel units and flash_api.cpp: hours for upstream's arm); the default is a sample, the
forward, split-kv forward and backward units of one head dim and dtype plus flash_api.cpp,
from which the whole build is extrapolated: total CPU time over the usable cores, at least
the longest unit.  `--concurrent` runs both arms at once (the sample's threads fit 16
cores; the CPU times it measures are what the extrapolation uses, the walls are inflated
by the sharing).  Prints per unit wall, CPU and peak RSS, the ratio, the load average, and
writes JSON with --json.  Standard library only (runs where wheelforge is not installed):

    python3 bench/flash_attn_build.py --sdist flash_attn-2.8.3.post2.tar.gz [--arch 12.0]
        [--units fwd,fwd_split,bwd] [--hdim 128] [--dtype bf16] [--concurrent] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "patches" / "flash-attn"
SDIST = "flash_attn-2.8.3.post2.tar.gz"
CXX20 = "0003-cxx20.patch"
KINDS = ("fwd", "fwd_split", "bwd")
JOB_GIB = 7.0  # recipes/flash-attn.yaml build.job-memory

# Run setup.py build_ext up to torch's ninja call: build.ninja is written, nothing compiled.
_GENERATE = r"""
import runpy, sys
import torch.utils.cpp_extension as ce
ce._run_ninja_build = lambda *a, **k: None
sys.argv = ["setup.py", "build_ext"]
try:
    runpy.run_path("setup.py", run_name="__main__")
except BaseException as exc:  # the link step finds no objects: expected
    print("generated build.ninja (link skipped: %s)" % type(exc).__name__)
"""


def mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1024 * 1024)
    return 0.0


def unpack(sdist: Path, dest: Path, patches: list[Path]) -> Path:
    with tarfile.open(sdist) as tf:
        tf.extractall(dest, filter="data")
    (tree,) = [p for p in dest.iterdir() if p.is_dir()]
    for patch in patches:
        if shutil.which("git"):
            subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=tree,
                           check=True)
        else:  # a machine without git
            subprocess.run(["patch", "-s", "-p1", "-i", str(patch)], cwd=tree, check=True)
    return tree


def generate(tree: Path, python: str, environ: dict[str, str]) -> Path:
    done = subprocess.run([python, "-c", _GENERATE], cwd=tree, env=environ, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    found = sorted(tree.glob("build/temp*/build.ninja"))
    if not found:
        sys.exit(f"no build.ninja written in {tree}:\n{done.stdout[-3000:]}")
    return found[0]


def targets(ninja_file: Path) -> dict[str, str]:
    """source file name -> object path, for every compile edge of build.ninja."""
    out = {}
    for line in ninja_file.read_text().splitlines():
        m = re.match(r"build (\S+\.o): (?:cuda_)?compile (\S+)", line)
        if m:
            out[Path(m.group(2)).name] = m.group(1)
    return out


def flags(ninja_file: Path) -> str:
    text = ninja_file.read_text()
    m = re.search(r"^cuda_cflags = (.*)$", text, re.M)
    n = re.search(r"^cuda_post_cflags = (.*)$", text, re.M)
    both = (m.group(1) if m else "") + " " + (n.group(1) if n else "")
    archs = sorted(set(re.findall(r"code=(sm_\d+a?|compute_\d+a?)", both)))
    threads = re.search(r"--threads (\d+)", both)
    std = re.search(r"-std=(c\+\+\d+)", both)
    return (f"{', '.join(archs)}; nvcc --threads {threads.group(1) if threads else '?'}; "
            f"{std.group(1) if std else '?'}")


def choose(all_targets: dict[str, str], units: str, hdim: str, dtype: str) -> list[str]:
    if units == "all":
        return sorted(all_targets)
    names = ["flash_api.cpp"]
    for kind in units.split(","):
        if kind not in KINDS:
            sys.exit(f"--units: {kind!r} is not one of {', '.join(KINDS)} (or 'all')")
        names.append(f"flash_{kind}_hdim{hdim}_{dtype}_sm80.cu")
    missing = [n for n in names if n not in all_targets]
    if missing:
        sys.exit(f"not in build.ninja: {', '.join(missing)}")
    return names


class LoadSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(5.0):
            self.samples.append(os.getloadavg()[0])


def timed_ninja(ninja_file: Path, objs: list[str], jobs: int) -> dict[str, object]:
    """Build ``objs`` with ninja; per unit: wall from .ninja_log, CPU and peak RSS from a
    wrapper around each compiler (ninja's own rusage covers all children together)."""
    work = ninja_file.parent
    for o in objs:
        Path(o).unlink(missing_ok=True)
    log = work / ".ninja_log"
    log.unlink(missing_ok=True)
    usage = work / "usage.jsonl"
    usage.unlink(missing_ok=True)
    wrapped = work / "wrapped.ninja"
    text = ninja_file.read_text()
    wrapper = f"{sys.executable} {Path(__file__).resolve()} --measure {usage} --"
    text = re.sub(r"^(\s+command = )", rf"\1{wrapper} ", text, flags=re.M)
    wrapped.write_text(text)
    start = time.monotonic()
    proc = subprocess.run(["ninja", "-f", str(wrapped), "-j", str(jobs), *objs], cwd=work,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"ninja failed in {work}:\n{proc.stdout[-4000:]}")
    per_unit = {}
    for line in usage.read_text().splitlines():
        rec = json.loads(line)
        per_unit[rec["unit"]] = rec
    return {"wall_s": round(wall, 1), "units": per_unit}


def measure(usage: str, argv: list[str]) -> int:
    """--measure FILE -- CMD...: run CMD, append its wall, CPU and peak RSS to FILE."""
    unit = next((Path(a).name for a in argv if a.endswith((".cu", ".cpp"))), "?")
    start = time.monotonic()
    rc = subprocess.run(argv).returncode
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = {"unit": unit, "wall_s": round(time.monotonic() - start, 1),
           "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
           "peak_rss_gb": round(ru.ru_maxrss / (1024 * 1024), 2)}
    with open(usage, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return rc


def extrapolate(result: dict[str, object], cores: int, slots: int, sample_all: bool) -> float:
    """Wall of the whole build: its CPU time over the usable slots, at least its longest
    unit.  A sample of one unit per kind stands for the 24 units of that kind."""
    units = result["units"]  # type: ignore[assignment]
    if sample_all:
        cpu = sum(u["cpu_s"] for u in units.values())  # type: ignore[union-attr]
        longest = max(u["wall_s"] for u in units.values())  # type: ignore[union-attr]
    else:
        cpu = sum((1 if name == "flash_api.cpp" else 24) * u["cpu_s"]  # type: ignore[index]
                  for name, u in units.items())  # type: ignore[union-attr]
        longest = max(u["cpu_s"] for u in units.values())  # type: ignore[union-attr]
    return max(cpu / min(cores, slots), longest)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        sys.exit(measure(sys.argv[2], sys.argv[4:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sdist", type=Path, required=True, help=SDIST)
    ap.add_argument("--arch", default="12.0", help="wheelforge's arch (default 12.0)")
    ap.add_argument("--units", default="fwd,fwd_split,bwd",
                    help="kinds of kernel unit to compile (one each), or 'all'")
    ap.add_argument("--hdim", default="128")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--concurrent", action="store_true", help="both arms at once")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch")
    ap.add_argument("--work", type=Path, help="keep the trees here (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--dry-run", action="store_true", help="generate and print, compile nothing")
    args = ap.parse_args()

    cores = len(os.sched_getaffinity(0))
    mem = mem_available_gb()
    up_jobs = max(1, min(cores // 2, int(mem / 9)))  # upstream's NinjaBuildExtension
    wf_jobs = max(1, min(cores, int(mem // JOB_GIB)))
    cuda = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    base = {k: v for k, v in os.environ.items()
            if k not in ("TORCH_CUDA_ARCH_LIST", "NVCC_THREADS", "MAX_JOBS")
            and not k.startswith("FLASH_ATTN")}
    base.update(CUDA_HOME=cuda, FLASH_ATTENTION_FORCE_BUILD="TRUE",
                TORCH_NO_COMPILER_WRAPPER="1", PATH=f"{cuda}/bin:{base.get('PATH', '')}")
    arms = {
        "upstream": ([PATCHES / CXX20], dict(base, MAX_JOBS=str(up_jobs)), up_jobs),
        "wheelforge": (sorted(PATCHES.glob("*.patch")),
                       dict(base, TORCH_CUDA_ARCH_LIST=args.arch, NVCC_THREADS="1",
                            MAX_JOBS=str(wf_jobs)), wf_jobs),
    }
    tmp = args.work or Path(tempfile.mkdtemp(prefix="fa-bench-"))
    print(f"{cores} cores, {mem:.0f} GB available; sample: {args.units} "
          f"(hdim {args.hdim}, {args.dtype})", flush=True)
    plans = {}
    for name, (patches, environ, jobs) in arms.items():
        tree = unpack(args.sdist, tmp / name, patches)
        ninja_file = generate(tree, args.python, environ)
        objs = targets(ninja_file)
        chosen = choose(objs, args.units, args.hdim, args.dtype)
        plans[name] = (ninja_file, [objs[n] for n in chosen], jobs)
        print(f"{name:10}: {len(objs)} units in build.ninja, compiling {len(chosen)}; "
              f"{flags(ninja_file)}; MAX_JOBS={jobs}", flush=True)
    if args.dry_run:
        return
    results: dict[str, dict[str, object]] = {}
    sampler = LoadSampler()
    sampler.start()

    def run(name: str) -> None:
        ninja_file, objs, jobs = plans[name]
        results[name] = timed_ninja(ninja_file, objs, jobs)
        print(f"{name} done: {results[name]['wall_s']} s", flush=True)

    if args.concurrent:
        threads = [threading.Thread(target=run, args=(n,)) for n in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for n in plans:
            run(n)
    sampler.stop.set()
    load = sum(sampler.samples) / len(sampler.samples) if sampler.samples else 0.0

    print(f"\n{'unit':42} {'arm':10} {'wall s':>7} {'CPU s':>7} {'RSS GB':>6}")
    for name, res in results.items():
        for unit, rec in sorted(res["units"].items()):  # type: ignore[union-attr]
            print(f"{unit:42} {name:10} {rec['wall_s']:7.0f} {rec['cpu_s']:7.0f} "
                  f"{rec['peak_rss_gb']:6.2f}")
    slots = {"upstream": up_jobs * 4, "wheelforge": wf_jobs}  # jobs x nvcc threads
    est = {n: extrapolate(r, cores, slots[n], args.units == "all") for n, r in results.items()}
    cpu = {n: sum(u["cpu_s"] for u in r["units"].values())  # type: ignore[union-attr]
           for n, r in results.items()}
    print(f"\nsample wall: upstream {results['upstream']['wall_s']} s, wheelforge "
          f"{results['wheelforge']['wall_s']} s; sample CPU: upstream {cpu['upstream']:.0f} s, "
          f"wheelforge {cpu['wheelforge']:.0f} s (ratio {cpu['upstream'] / cpu['wheelforge']:.2f})")
    what = "measured" if args.units == "all" else "extrapolated"
    print(f"whole build on {cores} cores ({what}): upstream {est['upstream'] / 60:.0f} min, "
          f"wheelforge {est['wheelforge'] / 60:.0f} min, ratio "
          f"{est['upstream'] / est['wheelforge']:.2f}x; mean load {load:.1f} "
          f"({'both arms at once' if args.concurrent else 'one arm at a time'})")
    if args.json:
        args.json.write_text(json.dumps({
            "cores": cores, "mem_gb": round(mem, 1), "units": args.units, "hdim": args.hdim,
            "dtype": args.dtype, "concurrent": args.concurrent, "arch": args.arch,
            "results": results, "estimate_s": est, "load": round(load, 2),
            "jobs": {"upstream": up_jobs, "wheelforge": wf_jobs}}, indent=1))
    if not args.work:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
