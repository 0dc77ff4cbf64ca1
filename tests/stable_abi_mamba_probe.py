"""Run in a venv that holds torch, beside mamba-ssm-stable's selective_scan_cuda
(tests/test_e2e_stable_abi_mamba.py): import it, list its ops, and let each op's own
argument check refuse CPU tensors.  Prints one JSON line."""

from __future__ import annotations

import json

import torch  # first: the binding's torch symbols are libtorch's, loaded by torch

import selective_scan_cuda  # isort: skip
from probe_refusal import refusal  # isort: skip


def main() -> None:
    ns = torch.ops.selective_scan_cuda
    ops = [n for n in ("fwd", "bwd") if hasattr(ns, n)]
    u = torch.randn(2, 8, 16)
    delta = torch.rand(2, 8, 16)
    A = -torch.rand(8, 4)
    B = torch.randn(8, 4)
    C = torch.randn(8, 4)
    print(json.dumps({
        "torch": torch.__version__,
        "module": selective_scan_cuda.__file__,
        "ops": ops,
        "fwd": refusal(lambda: ns.fwd(u, delta, A, B, C, None, None, None, False)),
        "bwd": refusal(lambda: ns.bwd(u, delta, A, B, C, None, None, None, u, None, None,
                                      None, False, False)),
        "dtype": refusal(lambda: ns.fwd(u.double(), delta, A, B, C, None, None, None, False)),
    }))


if __name__ == "__main__":
    main()
