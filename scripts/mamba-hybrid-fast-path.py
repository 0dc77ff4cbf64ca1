#!/usr/bin/env python3
"""A tiny Mamba-2 hybrid from transformers on the GPU: does it take the fast path (the
installed mamba-ssm and causal-conv1d), and how far and how fast is it from the fallback?

    python3 scripts/mamba-hybrid-fast-path.py OUT_DIR

Runs itself twice: once as installed (fast), once with mamba_ssm, causal_conv1d and
their CUDA modules made unimportable before transformers loads (the PyTorch fallback, as
on a machine without the wheels).  Both build the same random model (the first run saves
its weights, the second loads them) and the same input.  Reports, as JSON on stdout and
in OUT_DIR/hybrid.json: the model class, the transformers warnings of each run (the fast
run must have no fallback warning, the fallback run must have one), max |logits fast -
logits fallback| in fp32, and the forward time of each in bf16 (median of 10 after 3
warm-ups) with their ratio.
"""

from __future__ import annotations

import importlib.abc
import json
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path

BLOCKED = ("mamba_ssm", "causal_conv1d", "selective_scan_cuda", "causal_conv1d_cuda")
FALLBACK_WORDS = ("falling back", "fast path is not available", "naive implementation")


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} blocked for the fallback run")
        return None


def tiny_model():  # type: ignore[no-untyped-def]
    """The first of NemotronH, FalconH1, GraniteMoeHybrid that this transformers has."""
    import transformers as tf

    tries = [
        ("NemotronHConfig", "NemotronHForCausalLM", dict(
            vocab_size=512, hidden_size=256, hybrid_override_pattern="M*M-",
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
            mamba_num_heads=8, mamba_head_dim=64, ssm_state_size=64, n_groups=2,
            chunk_size=64, use_mamba_kernels=True)),
        ("FalconH1Config", "FalconH1ForCausalLM", dict(
            vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, intermediate_size=512, mamba_d_ssm=512,
            mamba_n_heads=8, mamba_d_head=64, mamba_d_state=64, mamba_n_groups=2,
            mamba_chunk_size=64, use_mamba_kernels=True)),
        ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", dict(
            vocab_size=512, hidden_size=256, num_hidden_layers=2,
            layer_types=["mamba", "attention"], num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=512, num_local_experts=2, num_experts_per_tok=1,
            mamba_n_heads=8, mamba_d_head=64, mamba_d_state=64, mamba_n_groups=2,
            mamba_chunk_size=64, mamba_expand=2)),
    ]
    errors = []
    for cfg_name, model_name, kw in tries:
        if not hasattr(tf, cfg_name):
            continue
        try:
            return getattr(tf, model_name)(getattr(tf, cfg_name)(**kw)), model_name
        except Exception as exc:  # noqa: BLE001 - try the next family
            errors.append(f"{model_name}: {type(exc).__name__}: {exc}")
    raise SystemExit("no Mamba-2 hybrid could be built: " + "; ".join(errors))


def run(mode: str, out: Path) -> dict[str, object]:
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
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    model, name = tiny_model()
    weights = out / "hybrid-weights.pt"
    if mode == "fast":
        torch.save(model.state_dict(), weights)
    else:
        model.load_state_dict(torch.load(weights))
    model = model.cuda().eval()
    ids = torch.randint(0, 512, (2, 1024), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
    torch.save(logits.cpu(), out / f"logits-{mode}.pt")
    model = model.to(torch.bfloat16)
    times = []
    with torch.no_grad():
        for i in range(13):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False)
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
    fallback = [r for r in records if any(w in r.lower() for w in FALLBACK_WORDS)]
    return {"mode": mode, "model": name, "transformers": transformers.__version__,
            "torch": torch.__version__, "fallback_warnings": sorted(set(fallback)),
            "forward_ms_bf16": round(statistics.median(times) * 1000, 3)}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 2:
        print(json.dumps(run(sys.argv[2], out)))
        return
    results = {}
    for mode in ("fast", "fallback"):
        proc = subprocess.run([sys.executable, __file__, str(out), mode], capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} run failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    import torch

    fast, slow = (torch.load(out / f"logits-{m}.pt") for m in ("fast", "fallback"))
    report = {
        **{f"{k}_{m}": v for m, r in results.items() for k, v in r.items() if k != "mode"},
        "max_abs_delta_logits_fp32": (fast - slow).abs().max().item(),
        "max_abs_logits_fp32": slow.abs().max().item(),
        "speedup_fast_over_fallback_bf16": round(
            results["fallback"]["forward_ms_bf16"] / results["fast"]["forward_ms_bf16"], 2),
    }
    report["fast_path_taken"] = (not results["fast"]["fallback_warnings"]
                                 and bool(results["fallback"]["fallback_warnings"]))
    (out / "hybrid.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    sys.exit(0 if report["fast_path_taken"] else 1)


if __name__ == "__main__":
    main()
