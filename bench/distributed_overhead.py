#!/usr/bin/env python3
"""The per-cell overhead of the distributed nightly against the in-process one.

Side by side in one run, on one fixture matrix of N pure cells (tests/packages/tinypure
copies; real pip builds and verification, the user's managed environment), each into a
fresh index:
  L: `wheelforge nightly` in-process (plan, build, publish, one cell after another);
  D: the three parts as an engine runs them: `nightly plan`, one `nightly run --cell ID`
     process per cell (as one job per cell would), `nightly publish` of the stages;
  R: `nightly --executor ray` on a Ray cluster started here on 127.0.0.1 (a head and one
     builder node with one CPU, so the cells run one after another as in L; its own
     WHEELFORGE_CACHE; start and stop not timed), stopped with `ray stop` after.
An untimed in-process run first warms the file caches; L runs again last, to show the
run-to-run noise.  Prints each wall, D's parts, and (D - L)/N and (R - L)/N: the overhead
per cell of planning, dispatch, staging and publishing (goal: under 2 s).  GitHub's own job start
(minutes on hosted runners) is not in D.  The load average is printed before and after.

    .venv/bin/python bench/distributed_overhead.py [--cells 6] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).absolute().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))

from conftest import make_sdist, pure_recipe, tinypure_as, write_recipe  # noqa: E402


def project(root: Path, n: int) -> list[str]:
    names = [f"benchpure{chr(ord('a') + i)}" for i in range(n)]
    for name in names:
        _, sha = make_sdist(tinypure_as(root, name), root / "sdists", name, "0.1.0")
        write_recipe(root, name, pure_recipe(name, sha))
    (root / "wheelforge.yaml").write_text(yaml.safe_dump({"matrix": {
        "recipes": names, "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}],
        "archs": ["12.0"]}}))
    return names


def wf(args: list[str | Path], env: dict[str, str]) -> tuple[float, str]:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "wheelforge", *map(str, args)], env=env,
                         capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - start
    if res.returncode != 0:
        raise SystemExit(f"wheelforge {' '.join(map(str, args))} failed:\n{res.stderr[-3000:]}")
    return took, res.stdout


def cache_for(root: Path, shared: Path) -> Path:
    root.mkdir(parents=True)
    for sub in ("envs", "sources"):
        (root / sub).symlink_to(shared / sub)
    return root


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=6)
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    shared = Path(os.environ.get("WHEELFORGE_CACHE") or Path.home() / ".cache" / "wheelforge")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS")}
    env["PYTHONPATH"] = str(REPO / "src")
    print(f"load average before: {load()} ({os.cpu_count()} cores); {args.cells} pure cells",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="wf-bench-dist-") as tmp:
        t = Path(tmp)
        n = len(project(t, args.cells))
        common: list[str | Path] = ["--config", t / "wheelforge.yaml", "--recipes",
                                    t / "recipes"]
        src: list[str | Path] = ["--sources", t / "sdists"]

        # untimed: the first build of the night pays for cold file caches
        wf(["nightly", *common, *src, "--index", t / "index-w", "--cache-dir",
            cache_for(t / "cache-w", shared)], env)
        local, _ = wf(["nightly", *common, *src, "--index", t / "index-l", "--cache-dir",
                       cache_for(t / "cache-l", shared)], env)
        print(f"L in-process nightly:  {local:7.1f} s  ({local / n:.2f} s/cell)", flush=True)

        cache = cache_for(t / "cache-d", shared)
        d_plan, _ = wf(["nightly", "plan", *common, "--index", t / "index-d", "--cache-dir",
                        cache, "--output", t / "plan.json"], env)
        ids = [c["id"] for c in json.loads((t / "plan.json").read_text())["cells"]]
        d_run = 0.0
        for i in ids:
            took, _ = wf(["nightly", "run", "--plan", t / "plan.json", "--cell", str(i),
                          "--stage-dir", t / "stage", *common, *src, "--cache-dir", cache], env)
            d_run += took
        d_pub, _ = wf(["nightly", "publish", "--plan", t / "plan.json", t / "stage",
                       "--index", t / "index-d", "--cache-dir", cache], env)
        dist = d_plan + d_run + d_pub
        print(f"D plan/run/publish:    {dist:7.1f} s  (plan {d_plan:.1f}, {n} runs {d_run:.1f}, "
              f"publish {d_pub:.1f})", flush=True)
        print(f"  overhead per cell:   {(dist - local) / n:7.2f} s", flush=True)

        if not args.no_ray:
            ray_overhead(t, shared, env, common, src, local, n)
        again, _ = wf(["nightly", *common, *src, "--index", t / "index-l2", "--cache-dir",
                       cache_for(t / "cache-l2", shared)], env)
        print(f"L again (the noise):   {again:7.1f} s  ({again / n:.2f} s/cell)")
    print(f"load average after: {load()}")


def ray_overhead(t: Path, shared: Path, env: dict[str, str], common: list[str | Path],
                 src: list[str | Path], local: float, n: int) -> None:
    cli = str(Path(sys.executable).parent / "ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    short = Path(tempfile.mkdtemp(prefix="wfray-"))
    base = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats",
            "--object-store-memory", str(100 * 1024 * 1024)]
    try:
        subprocess.run([cli, "start", "--head", "--port", str(port), "--num-cpus", "0",
                        "--include-dashboard=false", "--temp-dir", str(short / "ray"), *base],
                       env=env, check=True, capture_output=True, timeout=180)
        node_env = {**env, "WHEELFORGE_CACHE": str(cache_for(t / "cache-r-node", shared))}
        subprocess.run([cli, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1",
                        "--resources", '{"wheelforge-builder": 1}', *base], env=node_env,
                       check=True, capture_output=True, timeout=180)
        took, _ = wf(["nightly", "--executor", "ray", "--ray-address", f"127.0.0.1:{port}",
                      *common, *src, "--index", t / "index-r", "--cache-dir",
                      cache_for(t / "cache-r", shared)], env)
        print(f"R Ray, one builder:    {took:7.1f} s")
        print(f"  overhead per cell:   {(took - local) / n:7.2f} s")
    finally:
        subprocess.run([cli, "stop", "--force"], env=env, capture_output=True, timeout=180)
        shutil.rmtree(short, ignore_errors=True)


if __name__ == "__main__":
    main()
