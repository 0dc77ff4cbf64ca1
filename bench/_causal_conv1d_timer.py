"""Run by bench/stable_op_overhead.py inside one python: the host time of one call of
causal-conv1d's public functions on tensors so small that the kernel is nothing and the
call's dispatch is all (a decoding step's ``causal_conv1d_update``, a 16-token
``causal_conv1d_fn``).  Prints one JSON object: microseconds a call, per function."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from causal_conv1d import causal_conv1d_fn, causal_conv1d_update

CALLS = 2000
ROUNDS = 7


def per_call_us(fn) -> float:  # type: ignore[no-untyped-def]
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(times)


def main() -> None:
    dev, dt = "cuda", torch.bfloat16
    dim, width = 64, 4
    weight = torch.randn(dim, width, device=dev, dtype=dt)
    bias = torch.randn(dim, device=dev, dtype=dt)
    x_step = torch.randn(1, dim, device=dev, dtype=dt)
    state = torch.randn(1, dim, width - 1, device=dev, dtype=dt)
    x_seq = torch.randn(1, dim, 16, device=dev, dtype=dt)
    found = {
        "causal_conv1d_update": per_call_us(
            lambda: causal_conv1d_update(x_step, state, weight, bias, activation="silu")),
        "causal_conv1d_fn": per_call_us(
            lambda: causal_conv1d_fn(x_seq, weight, bias, activation="silu")),
    }
    import causal_conv1d
    print(json.dumps({"version": causal_conv1d.__version__, "torch": torch.__version__,
                      "file": causal_conv1d.__file__, "us_per_call": found}))


if __name__ == "__main__":
    sys.exit(main())
