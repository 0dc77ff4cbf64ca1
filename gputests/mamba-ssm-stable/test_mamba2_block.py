"""mamba-ssm on the GPU: a Mamba2 block, forward and backward, on its fast paths (the fused
mamba_split_conv1d_scan_combined, and causal_conv1d_fn + mamba_chunk_scan_combined)
against a reference written here in plain PyTorch: the causal depthwise convolution with
F.conv1d and the state-space recurrence step by step.  Run by `wheelforge test mamba-ssm`
against the installed wheels (mamba-ssm and its companion causal-conv1d)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICE = "cuda"


def err_ratio(x: torch.Tensor, ref: torch.Tensor) -> float:
    """RMS error relative to the RMS of the reference."""
    x, ref = x.detach().float(), ref.detach().float()
    return ((x - ref).pow(2).mean().sqrt() / (ref.pow(2).mean().sqrt() + 1e-12)).item()


def reference_forward(m: torch.nn.Module, u: torch.Tensor) -> torch.Tensor:
    """Mamba2.forward (d_ssm = d_inner, rmsnorm, norm_before_gate=False) from its own
    parameters, without any of the package's kernels."""
    b, length, _ = u.shape
    h, p, g, n = m.nheads, m.headdim, m.ngroups, m.d_state
    z, xbc, dt = torch.split(m.in_proj(u), [m.d_ssm, m.d_ssm + 2 * g * n, h], dim=-1)
    xbc = F.conv1d(xbc.transpose(1, 2), m.conv1d.weight, m.conv1d.bias,
                   padding=m.d_conv - 1, groups=xbc.shape[-1])[..., :length]
    xbc = F.silu(xbc).transpose(1, 2)
    x, bmat, cmat = torch.split(xbc, [m.d_ssm, g * n, g * n], dim=-1)
    x = x.reshape(b, length, h, p)
    bmat = bmat.reshape(b, length, g, n).repeat_interleave(h // g, dim=2)
    cmat = cmat.reshape(b, length, g, n).repeat_interleave(h // g, dim=2)
    dt = F.softplus(dt + m.dt_bias)  # (b, L, h)
    a = -torch.exp(m.A_log.float())  # (h,)
    state = torch.zeros(b, h, p, n, device=u.device, dtype=torch.float32)
    ys = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * a)[..., None, None]
        state = state * decay + (dt[:, t, :, None, None] * x[:, t, :, :, None]
                                 * bmat[:, t, :, None, :])
        ys.append((state * cmat[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, dim=1) + x * m.D[None, None, :, None]
    y = y.reshape(b, length, h * p) * F.silu(z)
    yg = y.reshape(b, length, g, -1)
    yg = yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + m.norm.eps)
    return m.out_proj(yg.reshape(b, length, -1) * m.norm.weight)


def test_companion_is_used() -> None:
    import mamba_ssm.modules.mamba2 as mamba2
    import mamba_ssm.ops.selective_scan_interface as ssi

    # mamba-ssm imports causal-conv1d quietly (None when missing) and runs slower paths
    # without it, or fails (mamba_inner_fn)
    assert mamba2.causal_conv1d_fn is not None
    assert ssi.causal_conv1d_fn is not None


@pytest.mark.parametrize("mem_eff", [True, False], ids=["fused", "conv1d+chunk-scan"])
def test_mamba2_block_forward_backward(mem_eff: bool) -> None:
    from mamba_ssm import Mamba2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    block = Mamba2(d_model=256, d_state=64, d_conv=4, expand=2, headdim=64, ngroups=2,
                   chunk_size=64, use_mem_eff_path=mem_eff, device=DEVICE,
                   dtype=torch.float32)
    u = torch.randn(2, 200, 256, device=DEVICE, requires_grad=True)  # not a chunk multiple
    grad_out = torch.randn(2, 200, 256, device=DEVICE)

    out = block(u)
    (out * grad_out).sum().backward()
    fast = {"out": out.detach(), "u": u.grad.detach().clone()}
    fast |= {n: p.grad.detach().clone() for n, p in block.named_parameters()}
    block.zero_grad()
    u.grad = None

    ref = reference_forward(block, u)
    (ref * grad_out).sum().backward()
    expected = {"out": ref.detach(), "u": u.grad.detach()}
    expected |= {n: p.grad.detach() for n, p in block.named_parameters()}

    ratios = {name: err_ratio(fast[name], expected[name]) for name in expected}
    print("mamba2", "fused" if mem_eff else "conv1d+chunk-scan",
          " ".join(f"{k}={v:.2e}" for k, v in ratios.items()))
    bad = {k: v for k, v in ratios.items() if not v < 5e-3}
    assert not bad, bad
