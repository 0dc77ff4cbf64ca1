"""A transformers model with ``attn_implementation="flash_attention_2"`` against ``sdpa``.

A small random Llama (bf16, head dim 128 by default), a padded batch (so transformers
unpads and takes flash-attn's varlen path), forward and backward under both attention
implementations with the same weights and inputs. It prints and writes (JSON, to the
folder given) the flash kernels the profiler names, max |Δ logits| on the real (unpadded)
tokens against the logits' scale, the relative difference of the gradients, and the
forward+backward time of each implementation.

    python attention_model.py OUT_DIR [--head-dim 128] [--layers 2]

A kernel subset (``flash_attn_2_cuda.kernel_subset``) decides what can run: without head
dim 128 the largest built one, without bf16 fp16, forward only without the backward
(no gradients then); the JSON says what ran. ``wheelforge test --stack`` runs this file as
the attention family's model check when the channel holds flash-attn, and reads the JSON.

Exits 1 when flash-attn's kernels were not seen, or the logits or the gradients differ by
more than bf16 allows (the tolerances are printed with the figures), 3 when flash-attn or
transformers' flash_attention_2 is not available (the JSON's ``unavailable`` says why).
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


def built_subset() -> tuple[list[int], list[str], bool]:
    """Head dims, dtypes and whether the backward is built, from the extension's own
    ``kernel_subset`` (a build without it, e.g. upstream's, holds everything)."""
    import flash_attn_2_cuda

    text = getattr(flash_attn_2_cuda, "kernel_subset", "")
    if not text:
        return [32, 64, 96, 128, 192, 256], ["fp16", "bf16"], True
    parts = [p.strip() for p in text.split(";")]  # "head dims 128; dtypes bf16; ..."
    hdims = [int(h) for h in parts[0].removeprefix("head dims ").split(",")]
    dtypes = parts[1].removeprefix("dtypes ").split(",")
    return hdims, dtypes, "forward only" not in text


def choose(head_dim: int) -> tuple[int, torch.dtype, bool]:
    """The head dim, dtype and backward this build can run, nearest what was asked."""
    hdims, dtypes, backward = built_subset()
    dim = head_dim if head_dim in hdims else max(hdims)
    return dim, torch.bfloat16 if "bf16" in dtypes else torch.float16, backward


def model_pair(head_dim: int, layers: int, dtype: torch.dtype = torch.bfloat16):
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
                                                    dtype=dtype).cuda())
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


def step(model, ids: torch.Tensor, mask: torch.Tensor,
         backward: bool = True) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(backward):
        logits = model(input_ids=ids, attention_mask=mask).logits
    if not backward:
        return logits.detach().float(), {}
    real = mask.bool()
    loss = logits[real].float().logsumexp(-1).mean()
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return logits.detach().float(), grads


def timed(model, ids, mask, backward: bool, repeats: int = 10) -> float:
    for _ in range(3):
        step(model, ids, mask, backward)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        step(model, ids, mask, backward)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


def flash_kernels(model, ids, mask, backward: bool) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(model, ids, mask, backward)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    return sorted(n for n in names if "flash" in n.lower() and "cudnn" not in n.lower())


def unavailable(out: Path, why: str) -> int:
    """The check cannot run here: say why (JSON) and exit 3."""
    result = {"unavailable": why}
    (out / "attention_model.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        head_dim, dtype, backward = choose(args.head_dim)
    except ImportError as exc:
        return unavailable(args.out, f"flash-attn does not import: {exc}")
    try:
        flash, sdpa = model_pair(head_dim, args.layers, dtype)
    except (ImportError, ValueError) as exc:  # transformers refuses flash_attention_2, saying why
        return unavailable(args.out, f"transformers: {exc}")
    ids, mask = padded_batch([256, 200, 97, 31], flash.config.vocab_size)
    real = mask.bool()
    logits_f, grads_f = step(flash, ids, mask, backward)
    logits_s, grads_s = step(sdpa, ids, mask, backward)
    delta = (logits_f[real] - logits_s[real]).abs().max().item()
    scale = logits_s[real].abs().max().item()
    num = sum(((grads_f[n] - grads_s[n]) ** 2).sum().item() for n in grads_s)
    den = sum((grads_s[n] ** 2).sum().item() for n in grads_s)
    grad_rel = ((num / den) ** 0.5 if den else float("inf")) if backward else None
    kernels = flash_kernels(flash, ids, mask, backward)
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    result = {
        "model": f"LlamaForCausalLM, {args.layers} layers, head dim {head_dim}, {name}",
        "batch": "4 sequences of 256, 200, 97 and 31 tokens, right-padded",
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "backward": backward,
        "flash_kernels": kernels,
        "max_abs_delta_logits": delta, "max_abs_logit": scale,
        "relative_delta_logits": delta / scale if scale else float("inf"),
        "relative_delta_grads": grad_rel,
        "fwd_bwd_ms": {"flash_attention_2": 1e3 * timed(flash, ids, mask, backward),
                       "sdpa": 1e3 * timed(sdpa, ids, mask, backward)},
        "tolerances": {"relative_delta_logits": LOGITS_TOL, "relative_delta_grads": GRAD_TOL},
    }
    result["passed"] = (bool(kernels) and result["relative_delta_logits"] <= LOGITS_TOL
                        and (grad_rel is None or grad_rel <= GRAD_TOL))
    (args.out / "attention_model.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print("attention model:", "ok" if result["passed"] else "FAILED")
    return 0 if result["passed"] else 1

if __name__ == "__main__":
    sys.exit(main())
