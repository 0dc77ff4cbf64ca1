#!/usr/bin/env python3
"""Cross-host compile cache: causal-conv1d built on builder A, then cold on builder B.

Side by side in one run, same machine, same arch list and job settings, against one
redis-server started here on 127.0.0.1 (a free port, a temporary directory, stopped
after):
  A: `wheelforge build causal-conv1d` with an empty local cache and an empty remote
     (every unit compiled, every object written to the remote);
  B: the same build on "another host": another cache root at another path and depth
     (hence other work and build-environment paths on the compiler's command line), an
     empty local cache, the same remote.
Prints both wall times, B/A, both compile cache lines and B's remote hit rate, and the
load average before and after.  The managed torch environments and sources are the
user's (linked into both cache roots, so their bytes are the same and their paths
differ).  About 5-10 minutes on 2 cores (A dominates).  No timing is asserted.

    .venv/bin/python bench/cross_host_cache.py [--arch 12.0]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def builder(root: Path, shared: Path) -> Path:
    cache = root / "cache"
    cache.mkdir(parents=True)
    for sub in ("envs", "sources", "stats"):
        (shared / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(shared / sub)
    return cache


def build(cache: Path, index: Path, env: dict[str, str], arch: str) -> tuple[float, str]:
    argv = [sys.executable, "-m", "wheelforge", "build", "causal-conv1d", "--arch", arch,
            "--cache-dir", str(cache), "--index", str(index)]
    start = time.monotonic()
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    took = time.monotonic() - start
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return took, res.stderr


def cache_line(stderr: str) -> str:
    found = re.findall(r"compile cache: \d+ hits?.*", stderr)
    return found[-1] if found else "no compile cache line"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="12.0")
    args = ap.parse_args()
    redis = shutil.which("redis-server")
    if redis is None:
        raise SystemExit("redis-server is required (apt-get install redis-server)")
    shared = Path(os.environ.get("WHEELFORGE_CACHE") or Path.home() / ".cache" / "wheelforge")
    print(f"load average before: {load()} ({os.cpu_count()} cores)", flush=True)
    with tempfile.TemporaryDirectory(prefix="wf-bench-xhost-") as tmp:
        t = Path(tmp)
        port = free_port()
        server = subprocess.Popen([redis, "--bind", "127.0.0.1", "--port", str(port),
                                   "--save", "", "--appendonly", "no", "--dir", tmp],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            env = {k: v for k, v in os.environ.items()
                   if k not in ("TORCH_CUDA_ARCH_LIST", "WHEELFORGE_COMPILE_CACHE")}
            env["PYTHONPATH"] = str(REPO / "src")
            env["WHEELFORGE_COMPILE_CACHE_REMOTE"] = f"redis://127.0.0.1:{port}"
            a, err_a = build(builder(t / "a", shared), t / "index-a", env, args.arch)
            print(f"A cold build:       {a:8.1f} s  [{cache_line(err_a)}]", flush=True)
            b, err_b = build(builder(t / "elsewhere" / "deeper" / "b", shared),
                             t / "index-b", env, args.arch)
            line = cache_line(err_b)
            print(f"B cold, other host: {b:8.1f} s  [{line}]")
            m = re.match(r"compile cache: (\d+) hits? \((\d+) remote\), (\d+) miss", line)
            if m:
                hits, remote, misses = map(int, m.groups())
                print(f"B remote hit rate:  {remote}/{hits + misses} units")
            print(f"ratio B/A:          {b / a:8.3f}  ({a / b:.1f}x faster)")
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
