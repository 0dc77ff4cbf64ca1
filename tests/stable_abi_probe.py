"""Run in a venv that holds torch and the stable-ABI causal-conv1d wheel
(tests/test_e2e_stable_abi.py): import it, list its ops, and let each op's own argument
check refuse CPU tensors.  Prints one JSON line."""

from __future__ import annotations

import json

import causal_conv1d
import causal_conv1d_cuda
import torch

from probe_refusal import refusal  # isort: skip


def main() -> None:
    ns = torch.ops.causal_conv1d_cuda
    ops = [n for n in ("causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_update")
           if hasattr(ns, n)]
    x = torch.randn(2, 8, 16)
    w = torch.randn(8, 4)
    state = torch.zeros(2, 8, 3)
    print(json.dumps({
        "torch": torch.__version__,
        "module": causal_conv1d_cuda.__file__,
        "ops": ops,
        "fn": refusal(lambda: causal_conv1d.causal_conv1d_fn(x, w)),
        "update": refusal(lambda: causal_conv1d.causal_conv1d_update(x[:, :, :1], state, w)),
    }))


if __name__ == "__main__":
    main()
