#!/usr/bin/env python3
"""The op-call overhead of a stable-ABI causal-conv1d against the per-torch one, side by
side on one GPU (issue 55): the host microseconds of one call of ``causal_conv1d_update``
(a decoding step) and of a 16-token ``causal_conv1d_fn``, on tensors so small that the
kernel launch and the dispatch are the whole call.  The per-torch wheel calls its pybind11
module through ``torch.library.custom_op``; the stable wheel registers its ops with
``STABLE_TORCH_LIBRARY`` and goes through the dispatcher's boxed calling convention.

Each python (a venv holding one of the two wheels) runs bench/_causal_conv1d_timer.py,
alternately, ``--repeat`` times; prints each figure's median and the ratio stable/per-torch.
Standard library only:

    python3 bench/stable_op_overhead.py --per-torch VENV_PY --stable VENV_PY [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

TIMER = Path(__file__).with_name("_causal_conv1d_timer.py")


def run_timer(python: str) -> dict[str, object]:
    out = subprocess.run([python, str(TIMER)], capture_output=True, text=True, timeout=600,
                         check=False)
    if out.returncode != 0:
        sys.exit(f"{python} {TIMER.name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-torch", required=True, help="python of the per-torch wheel's venv")
    ap.add_argument("--stable", required=True, help="python of the stable-ABI wheel's venv")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    arms = {"per-torch": args.per_torch, "stable": args.stable}
    got: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    seen: dict[str, dict[str, object]] = {}
    for _ in range(args.repeat):
        for arm, python in arms.items():
            result = run_timer(python)
            seen[arm] = result
            got[arm].append(result["us_per_call"])  # type: ignore[arg-type]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.repeat} alternating runs per arm")
    for arm, result in seen.items():
        print(f"  {arm:9s} causal-conv1d {result['version']}, torch {result['torch']}: "
              f"{result['file']}")
    print(f"{'function':24s} {'per-torch us':>13s} {'stable us':>10s} {'stable/per-torch':>17s}")
    for fn in got["per-torch"][0]:
        a = statistics.median(r[fn] for r in got["per-torch"])
        b = statistics.median(r[fn] for r in got["stable"])
        print(f"{fn:24s} {a:13.2f} {b:10.2f} {b / a:17.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
