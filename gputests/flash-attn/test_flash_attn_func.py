"""flash-attn on a GPU, against a plain PyTorch reference, with upstream's tolerance rule.

For every dtype (fp16, bf16), head dim (64, 128, 256) and causal or not: the kernel's
output and gradients are compared with an fp32 reference; the error may be at most twice
the error of the same reference computed in the low precision, plus 1e-5 (upstream's
tests/test_flash_attn.py rule).  A kernel subset build (flash_attn_2_cuda.kernel_subset)
is tested on what it holds; for what it does not hold, the call must raise the clear
RuntimeError, never run another kernel.  Plus one varlen case and one
flash_attn_with_kvcache case with num_splits 0 and 1.
"""

from __future__ import annotations

import math
import re

import pytest
import torch  # first: the extension links against torch's libraries (libc10.so)

# isort: split
import flash_attn_2_cuda
from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SUBSET = flash_attn_2_cuda.kernel_subset  # e.g. "head dims 128; dtypes bf16; forward only; ..."
HDIMS = {int(h) for h in re.search(r"head dims ([0-9,]+)", SUBSET).group(1).split(",")}
DTYPES = set(re.search(r"dtypes ([a-z0-9,]+)", SUBSET).group(1).split(","))
BACKWARD = "forward and backward" in SUBSET
SPLITKV = "no split-kv" not in SUBSET
NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def attention_ref(q, k, v, causal, upcast=True):
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    scores = torch.einsum("bthd,bshd->bhts", q / math.sqrt(q.shape[-1]), k)
    if causal:
        t, s = q.shape[1], k.shape[1]
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).triu(s - t + 1)
        scores = scores.masked_fill(mask, float("-inf"))
    attn = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.einsum("bhts,bshd->bthd", attn, v).to(dtype)


def built(dtype, hdim):
    return NAMES[dtype] in DTYPES and hdim in HDIMS


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_func_forward_backward(dtype, hdim, causal):
    torch.manual_seed(0)
    b, t, h = 2, 257, 4
    q, k, v = (torch.randn(b, t, h, hdim, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    if not built(dtype, hdim):
        with pytest.raises(RuntimeError, match="this build holds no"):
            flash_attn_func(q, k, v, causal=causal)
        return
    out = flash_attn_func(q, k, v, causal=causal)
    ref = attention_ref(q, k, v, causal)
    pt = attention_ref(q, k, v, causal, upcast=False)
    assert (out - ref).abs().max().item() <= 2 * (pt - ref).abs().max().item() + 1e-5
    g = torch.randn_like(out)
    if not BACKWARD:
        with pytest.raises(RuntimeError, match="this build holds no backward kernels"):
            out.backward(g)
        return
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    dq_ref, dk_ref, dv_ref = torch.autograd.grad(ref, (q, k, v), g)
    dq_pt, dk_pt, dv_pt = torch.autograd.grad(pt, (q, k, v), g)
    for d, d_ref, d_pt in ((dq, dq_ref, dq_pt), (dk, dk_ref, dk_pt), (dv, dv_ref, dv_pt)):
        assert (d - d_ref).abs().max().item() <= 2 * (d_pt - d_ref).abs().max().item() + 1e-5


def test_varlen():
    dtype = torch.bfloat16 if "bf16" in DTYPES else torch.float16
    hdim = max(HDIMS)
    torch.manual_seed(0)
    lens = [5, 130, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda",
                      dtype=torch.int32)
    q, k, v = (torch.randn(sum(lens), 4, hdim, device="cuda", dtype=dtype) for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for i in range(len(lens)):
        s = slice(cu[i].item(), cu[i + 1].item())
        args = (q[s][None], k[s][None], v[s][None], True)
        ref, pt = attention_ref(*args), attention_ref(*args, upcast=False)
        assert (out[s][None] - ref).abs().max() <= 2 * (pt - ref).abs().max() + 1e-5


@pytest.mark.parametrize("num_splits", [0, 1])
def test_kvcache(num_splits):
    dtype = torch.bfloat16 if "bf16" in DTYPES else torch.float16
    hdim = max(HDIMS)
    torch.manual_seed(0)
    q = torch.randn(2, 1, 4, hdim, device="cuda", dtype=dtype)
    kc, vc = (torch.randn(2, 512, 4, hdim, device="cuda", dtype=dtype) for _ in range(2))
    seqlens = torch.tensor([300, 512], device="cuda", dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True,
                                  num_splits=num_splits)
    for i, n in enumerate(seqlens.tolist()):
        args = (q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], True)
        ref, pt = attention_ref(*args), attention_ref(*args, upcast=False)
        assert (out[i:i + 1] - ref).abs().max() <= 2 * (pt - ref).abs().max() + 1e-5
    if not SPLITKV:
        with pytest.raises(RuntimeError, match="split-kv"):
            flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=2)
