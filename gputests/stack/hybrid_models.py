#!/usr/bin/env python3
"""Tiny hybrid models from the installed transformers, on the GPU: does each take the fast
path through the installed stack, shown by the CUDA kernels that ran?

    python hybrid_models.py OUT_DIR [--device cuda]

Families: a GatedDeltaNet hybrid (Qwen3.5: fla's chunk kernels and causal-conv1d), a
Mamba-2 hybrid (NemotronH, else FalconH1: mamba-ssm's SSD kernels and causal-conv1d) and
a Mamba-1 hybrid (Jamba: selective_scan_cuda and causal-conv1d).  Each runs twice, in
processes of their own: as installed ("fast", under torch.profiler: the kernel names), and
with fla, mamba_ssm, causal_conv1d and their CUDA modules made unimportable before
transformers loads ("fallback", the PyTorch path of a machine without the wheels).  Both
build the same random model (the fast run saves its weights) and the same input.

Writes OUT_DIR/hybrids.json and prints it: per family the model class, the stack's kernels
seen, whether the expected ones ran (fast_path_taken), transformers' fallback warnings of
each run, max |logits fast - logits fallback| in fp32 with max |logits|, and the bf16
forward time of each (median of 10 after 3 warm-ups) with their ratio.  Exits 1 when a
family that this transformers has did not take its fast path.
"""

from __future__ import annotations

import importlib.abc
import json
import logging
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BLOCKED = ("fla", "mamba_ssm", "causal_conv1d", "selective_scan_cuda", "causal_conv1d_cuda")
FALLBACK_WORDS = ("falling back", "fast path is not available", "naive implementation",
                  "is not installed")
#: the stack's kernels, by the names the profiler gives them
STACK_KERNEL = re.compile(r"causal_conv1d|selective_scan|chunk|gated_delta|fused_recurrent|"
                          r"state_passing|bmm_chunk|ssd|mamba", re.I)
EXPECTED = {  # every pattern must match a kernel that ran
    "gated-deltanet": [r"causal_conv1d", r"chunk_gated_delta_rule|chunk_.*delta|gated_delta"],
    "mamba2": [r"causal_conv1d", r"chunk_scan|chunk_state|state_passing"],
    "mamba1": [r"causal_conv1d", r"selective_scan"],
}


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} blocked for the fallback run")
        return None


def build(family: str) -> tuple[Any, str]:
    """The family's tiny model (random weights) and its class name; SystemExit(3) when this
    transformers has none of its classes."""
    import transformers as tf

    tries: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
        "gated-deltanet": [
            ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(
                vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                linear_value_head_dim=64, linear_conv_kernel_dim=4,
                layer_types=["linear_attention", "linear_attention", "linear_attention",
                             "full_attention"])),
            ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
                vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                linear_value_head_dim=64, num_experts=0, mlp_only_layers=[0, 1, 2, 3],
                layer_types=["linear_attention", "linear_attention", "linear_attention",
                             "full_attention"])),
        ],
        "mamba2": [
            ("NemotronHConfig", "NemotronHForCausalLM", dict(
                vocab_size=512, hidden_size=256, hybrid_override_pattern="M*M-",
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                intermediate_size=512, mamba_num_heads=8, mamba_head_dim=64,
                ssm_state_size=64, n_groups=2, chunk_size=64, use_mamba_kernels=True)),
            ("FalconH1Config", "FalconH1ForCausalLM", dict(
                vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, intermediate_size=512, mamba_d_ssm=512,
                mamba_n_heads=8, mamba_d_head=64, mamba_d_state=64, mamba_n_groups=2,
                mamba_chunk_size=64, use_mamba_kernels=True)),
        ],
        "mamba1": [
            ("JambaConfig", "JambaForCausalLM", dict(
                vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2,
                attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                num_experts=2, num_experts_per_tok=1, mamba_d_state=16, mamba_d_conv=4,
                mamba_expand=2, use_mamba_kernels=True)),
        ],
    }
    errors = []
    for cfg_name, model_name, kw in tries[family]:
        if not hasattr(tf, cfg_name) or not hasattr(tf, model_name):
            errors.append(f"{model_name}: not in transformers {tf.__version__}")
            continue
        try:
            return getattr(tf, model_name)(getattr(tf, cfg_name)(**kw)), model_name
        except Exception as exc:  # noqa: BLE001 - try the next model of the family
            errors.append(f"{model_name}: {type(exc).__name__}: {exc}")
    print(json.dumps({"unavailable": "; ".join(errors)}))
    raise SystemExit(3)


def run(family: str, mode: str, out: Path, device: str) -> dict[str, Any]:
    if mode == "fallback":
        sys.meta_path.insert(0, _Block())
    import torch
    import transformers

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    transformers.logging.set_verbosity_warning()
    logging.getLogger("transformers").addHandler(Keep())
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model, name = build(family)
    weights = out / f"{family}-weights.pt"
    if mode == "fast":
        torch.save(model.state_dict(), weights)
    else:
        model.load_state_dict(torch.load(weights))
    model = model.to(device).eval()
    length = 512 if device == "cuda" else 64
    ids = torch.randint(0, 512, (2, length), generator=torch.Generator().manual_seed(1)).to(device)
    kernels: list[str] = []
    with torch.no_grad():
        if mode == "fast" and device == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                logits = model(input_ids=ids, use_cache=False).logits.float()
                torch.cuda.synchronize()
            kernels = sorted({e.key for e in prof.key_averages()
                              if STACK_KERNEL.search(e.key)})
        else:
            logits = model(input_ids=ids, use_cache=False).logits.float()
    torch.save(logits.cpu(), out / f"{family}-logits-{mode}.pt")
    model = model.to(torch.bfloat16)
    times = []
    with torch.no_grad():
        for i in range(13 if device == "cuda" else 2):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= (3 if device == "cuda" else 1):
                times.append(time.perf_counter() - t0)
    fallback = sorted({r[:300] for r in records if any(w in r.lower() for w in FALLBACK_WORDS)})
    return {"model": name, "transformers": transformers.__version__,
            "torch": torch.__version__, "kernels": kernels, "fallback_warnings": fallback,
            "forward_ms_bf16": round(statistics.median(times) * 1000, 3)}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    if len(sys.argv) > 2 and sys.argv[2] in EXPECTED:  # a child: one family, one mode
        print("WF-HYBRID " + json.dumps(run(sys.argv[2], sys.argv[3], out, device)))
        return
    import torch

    report: dict[str, Any] = {}
    failed = False
    for family, patterns in EXPECTED.items():
        runs: dict[str, Any] = {}
        for mode in ("fast", "fallback"):
            proc = subprocess.run([sys.executable, __file__, str(out), family, mode,
                                   "--device", device], capture_output=True, text=True,
                                  timeout=900)
            found = [ln for ln in proc.stdout.splitlines() if ln.startswith(("WF-HYBRID ", "{"))]
            if proc.returncode == 3:
                runs = {"unavailable": json.loads(found[-1])["unavailable"]}
                break
            if proc.returncode != 0 or not found:
                runs = {"error": f"{mode} run failed: {proc.stderr[-3000:]}"}
                break
            runs[mode] = json.loads(found[-1].split(" ", 1)[1])
        if "fast" not in runs or "fallback" not in runs:
            report[family] = runs
            failed = failed or "error" in runs
            continue
        fast, slow = (torch.load(out / f"{family}-logits-{m}.pt") for m in ("fast", "fallback"))
        kernels = runs["fast"]["kernels"]
        taken = all(any(re.search(p, k, re.I) for k in kernels) for p in patterns)
        report[family] = {
            "model": runs["fast"]["model"],
            "kernels": kernels,
            "fast_path_taken": taken,
            "fallback_warnings_fast": runs["fast"]["fallback_warnings"],
            "fallback_warnings_fallback": runs["fallback"]["fallback_warnings"],
            "max_abs_delta_logits_fp32": (fast - slow).abs().max().item(),
            "max_abs_logits_fp32": slow.abs().max().item(),
            "forward_ms_bf16_fast": runs["fast"]["forward_ms_bf16"],
            "forward_ms_bf16_fallback": runs["fallback"]["forward_ms_bf16"],
            "speedup": round(runs["fallback"]["forward_ms_bf16"]
                             / runs["fast"]["forward_ms_bf16"], 2),
            "transformers": runs["fast"]["transformers"], "torch": runs["fast"]["torch"],
        }
        failed = failed or (device == "cuda" and not taken)
    (out / "hybrids.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
