"""A transformers model with ``attn_implementation="flash_attention_2"`` against ``sdpa``.

A small random Llama (bf16, head dim 128 by default), a padded batch (so transformers
unpads and takes flash-attn's varlen path), forward and backward under both attention
implementations with the same weights and inputs. It prints and writes (JSON, to the
folder given) the flash kernels the profiler names, max |Δ logits| on the real (unpadded)
tokens against the logits' scale, the relative difference of the gradients, and the
forward+backward time of each implementation.

    python attention_model.py OUT_DIR [--head-dim 128] [--layers 2]

Exits 1 when flash-attn's kernels were not seen, or the logits or the gradients differ by
more than bf16 allows (the tolerances are printed with the figures).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

LOGITS_TOL = 0.05  # max |Δ logits| over the largest |logit|: bf16 keeps ~3 significant digits
GRAD_TOL = 0.05  # ||Δ grad|| / ||grad|| over every parameter


def model_pair(head_dim: int, layers: int):
    """The same random Llama twice: flash_attention_2 and sdpa, equal weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = 4
    config = LlamaConfig(vocab_size=1024, hidden_size=heads * head_dim, intermediate_size=1024,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=2, head_dim=head_dim,
                         max_position_embeddings=512)
    models = []
    for impl in ("flash_attention_2", "sdpa"):  # a config each: the choice is kept in it
        torch.manual_seed(0)
        own = LlamaConfig.from_dict(config.to_dict())
        models.append(LlamaForCausalLM._from_config(own, attn_implementation=impl,
                                                    dtype=torch.bfloat16).cuda())
    if models[0].config._attn_implementation != "flash_attention_2":
        raise SystemExit(f"the flash model runs {models[0].config._attn_implementation}")
    models[1].load_state_dict(models[0].state_dict())
    return models[0], models[1]


def padded_batch(lengths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and the attention mask of sequences of these lengths."""
    g = torch.Generator().manual_seed(1)
    longest = max(lengths)
    ids = torch.zeros(len(lengths), longest, dtype=torch.long)
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(1, vocab, (n,), generator=g)
        mask[row, :n] = 1
    return ids.cuda(), mask.cuda()


def step(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    loss = logits[real].float().logsumexp(-1).mean()
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return logits.detach().float(), grads


def timed(model, ids, mask, repeats: int = 10) -> float:
    for _ in range(3):
        step(model, ids, mask)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        step(model, ids, mask)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


def flash_kernels(model, ids, mask) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(model, ids, mask)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    return sorted(n for n in names if "flash" in n.lower() and "cudnn" not in n.lower())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    flash, sdpa = model_pair(args.head_dim, args.layers)
    ids, mask = padded_batch([256, 200, 97, 31], flash.config.vocab_size)
    real = mask.bool()
    logits_f, grads_f = step(flash, ids, mask)
    logits_s, grads_s = step(sdpa, ids, mask)
    delta = (logits_f[real] - logits_s[real]).abs().max().item()
    scale = logits_s[real].abs().max().item()
    num = sum(((grads_f[n] - grads_s[n]) ** 2).sum().item() for n in grads_s)
    den = sum((grads_s[n] ** 2).sum().item() for n in grads_s)
    grad_rel = (num / den) ** 0.5 if den else float("inf")
    kernels = flash_kernels(flash, ids, mask)
    result = {
        "model": f"LlamaForCausalLM, {args.layers} layers, head dim {args.head_dim}, bf16",
        "batch": "4 sequences of 256, 200, 97 and 31 tokens, right-padded",
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "flash_kernels": kernels,
        "max_abs_delta_logits": delta, "max_abs_logit": scale,
        "relative_delta_logits": delta / scale if scale else float("inf"),
        "relative_delta_grads": grad_rel,
        "fwd_bwd_ms": {"flash_attention_2": 1e3 * timed(flash, ids, mask),
                       "sdpa": 1e3 * timed(sdpa, ids, mask)},
        "tolerances": {"relative_delta_logits": LOGITS_TOL, "relative_delta_grads": GRAD_TOL},
    }
    (args.out / "attention_model.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ok = (bool(kernels) and result["relative_delta_logits"] <= LOGITS_TOL
          and grad_rel <= GRAD_TOL)
    print("attention model:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
