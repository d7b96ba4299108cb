"""The prepared GPU check of the 2026 families and decoders (one GPU, a few minutes, nothing downloaded):
does each run on CUDA, is a seeded request's output independent of its batch there, do the lossless claims
hold in bf16, and what does a step cost.

    python benchmarks/gpu_check_families.py --out runs/gpu_families          # on the GPU machine
    python benchmarks/gpu_check_families.py --device cpu --small --out /tmp/g # a reduced run on a CPU

1. random:diffusiongemma-26b-a4b reduced to a few layers (real widths, bf16): encoder and decoder step times,
   batch 1 and 8; a seeded `diffusiongemma` request alone and batched (tokens equal?); where a step's peak
   memory goes at batch 8 (the decoder forward under each MoE kernel, the self-conditioning embeddings,
   one row's draw chunked against the naive float32 ops: vLLM #50699's OOM).
2. tiny-dg (fp32): seeded requests alone, batched, and on the CPU (tokens equal?).
3. Nemotron-Labs-Diffusion-8B reduced (real widths, bf16 and fp32): `linear-spec` against `ar` token for
   token (the lossless claim), forwards per token, ms per forward.
4. LLaDA2.2-flash reduced (bf16): the `llada2.2` InDel decoder runs; forwards, tokens.
5. S2D2 on tiny-bd (fp32): `s2d2` (AR-like caching) and `sdar`, alone and batched (tokens equal?).
Each section's result or its error goes into gpu_families.json and gpu_families.md in --out.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import torch

import caidllm

CANVAS = 256
BOOLEAN_PROMPTS = [  # three BBH-style questions the embedded models answer
    "not ( True ) and ( True ) is",
    "True and not not ( not False ) is",
    "not True or ( False and True ) is",
]


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _peak_reset(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return 0


def _peak_mb(device, base):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        return round((torch.cuda.max_memory_allocated() - base) / 2**20)
    return None


def _reduced_dg(device, small):
    """random:diffusiongemma-26b-a4b with 4 of its layers (released widths; --small: tiny ones), bf16."""
    layers = 2 if small else 4
    extra = "&vocab_size=512&hidden_size=64&intermediate_size=64" if small else ""
    name = f"random:diffusiongemma-26b-a4b?num_hidden_layers={layers}{extra}"
    return caidllm.load(name, device=device, dtype="bfloat16"), layers


def dg_shape(device, small):
    from caidllm.models.diffusion_gemma_cache import DecoderView, DGCache

    lm, layers = _reduced_dg(device, small)
    model, vocab = lm.model, lm.config.vocab_size
    g = torch.Generator().manual_seed(0)
    out = {"layers": layers}
    for batch in (1, 8):
        caches = [DGCache.empty(layers) for _ in range(batch)]
        prompt = torch.randint(0, vocab, (1, 512), generator=g).to(device)
        _sync(device)
        t = time.perf_counter()
        for c in caches:
            model.encode(prompt, c)
        _sync(device)
        out[f"batch{batch}_prompt512_encode_ms"] = round(1000 * (time.perf_counter() - t), 1)
        canvas = torch.randint(0, vocab, (batch, CANVAS), generator=g).to(device)
        times, soft = [], None
        base = _peak_reset(device)
        for _ in range(4):
            _sync(device)
            t = time.perf_counter()
            logits = model.denoise(canvas, DecoderView.batch(caches), soft)
            soft = model.soft_embeddings(logits)
            _sync(device)
            times.append(time.perf_counter() - t)
        out[f"batch{batch}_decoder_step_ms"] = round(1000 * min(times[1:]), 1)
        out[f"batch{batch}_step_peak_mb"] = _peak_mb(device, base)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (9, 33, 17)]
    alone = [
        lm.generate([p], method="diffusiongemma", gen_length=CANVAS, seed=5)[0].token_ids for p in prompts
    ]
    batched = [
        r.token_ids
        for r in lm.generate(prompts, method="diffusiongemma", gen_length=CANVAS, seed=5, batch_size=3)
    ]
    out["seeded_alone_equals_batched"] = alone == batched
    return out


def dg_step_peaks(device, small):
    """Where a decoder step's peak memory goes (4 layers, real widths, bf16, canvas 256, batch 8): the
    decoder forward under each MoE kernel, the self-conditioning embeddings, one row's draw."""
    from caidllm.decode.diffusiongemma_sampler import draw
    from caidllm.models.diffusion_gemma_cache import DecoderView, DGCache
    from caidllm.models.moe import set_moe_kernel

    lm, layers = _reduced_dg(device, small)
    model, vocab = lm.model, lm.config.vocab_size
    g = torch.Generator().manual_seed(0)
    caches = [DGCache.empty(layers) for _ in range(8)]
    prompt = torch.randint(0, vocab, (1, 512), generator=g).to(device)
    for c in caches:
        model.encode(prompt, c)
    canvas = torch.randint(0, vocab, (8, CANVAS), generator=g).to(device)
    out = {"weights_mb": round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20)}
    for kernel in ("auto", "loop", "grouped", "padded"):
        try:
            set_moe_kernel(model, kernel)
            base = _peak_reset(device)
            logits = model.denoise(canvas, DecoderView.batch(caches), None)
            out[f"denoise_{kernel}_peak_mb"] = _peak_mb(device, base)
            del logits
        except Exception as e:  # noqa: BLE001 - a kernel that does not run here is a finding
            out[f"denoise_{kernel}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    set_moe_kernel(model, "auto")
    logits = model.denoise(canvas, DecoderView.batch(caches), None)
    base = _peak_reset(device)
    model.soft_embeddings(logits)
    out["soft_embeddings_peak_mb"] = _peak_mb(device, base)
    gen = torch.Generator(device=device).manual_seed(0)
    base = _peak_reset(device)
    draw(logits[0], gen, True, 64)
    out["draw_one_row_chunk64_peak_mb"] = _peak_mb(device, base)
    base = _peak_reset(device)
    probs = torch.softmax(logits[0], dim=-1, dtype=torch.float32)
    torch.distributions.Categorical(logits=logits[0]).entropy()
    del probs
    out["naive_one_row_peak_mb"] = _peak_mb(device, base)
    out["logits_mb"] = round(logits.numel() * logits.element_size() / 2**20)
    return out


def tiny_dg(device, small):
    prompts = BOOLEAN_PROMPTS
    lm = caidllm.load("tiny-dg", device=device, dtype="float32")
    alone = [lm.generate([p], method="diffusiongemma", gen_length=64, seed=3)[0] for p in prompts]
    batched = lm.generate(prompts, method="diffusiongemma", gen_length=64, seed=3, batch_size=3)
    cpu = caidllm.load("tiny-dg", device="cpu", dtype="float32")
    on_cpu = [cpu.generate([p], method="diffusiongemma", gen_length=64, seed=3)[0] for p in prompts]
    greedy = lm.generate(prompts, method="greedy", gen_length=64, seed=0, batch_size=3)
    greedy_cpu = cpu.generate(prompts, method="greedy", gen_length=64, seed=0, batch_size=3)
    return {
        "alone_equals_batched": [r.token_ids for r in alone] == [r.token_ids for r in batched],
        "sampled_equals_cpu": [r.token_ids for r in alone] == [r.token_ids for r in on_cpu],
        "greedy_equals_cpu": [r.token_ids for r in greedy] == [r.token_ids for r in greedy_cpu],
        "answers": [r.text.strip().splitlines()[-1] for r in alone],
        "forwards": [r.nfe for r in alone],
    }


def nemotron(device, small):
    hidden, vocab = (64, 512) if small else (4096, 131072)
    fields = dict(
        num_hidden_layers=2 if small else 4,
        hidden_size=hidden,
        intermediate_size=hidden * 7 // 2,
        num_attention_heads=max(4, hidden // 128),
        num_key_value_heads=max(2, hidden // 512),
        vocab_size=vocab,
    )
    if small:
        fields["head_dim"] = 16
    name = "random:nemotron-labs-diffusion-8b?" + "&".join(f"{k}={v}" for k, v in fields.items())
    out = {}
    for dtype in ("bfloat16", "float32"):
        torch.manual_seed(0)
        lm = caidllm.load(name, device=device, dtype=dtype)
        prompts = torch.randint(min(1000, vocab // 2), vocab, (2, 64)).tolist()
        runs = {}
        lm.generate(prompts[:1], method="ar", gen_length=8)  # warm-up: kernels chosen, caches built
        for method, options in (
            ("ar", {}),
            ("linear-spec", {"block_length": 8}),
            ("nemotron-dlm", {"block_length": 8}),
        ):
            _sync(device)
            t = time.perf_counter()
            results = lm.generate(prompts, method=method, gen_length=64, early_stop=False, **options)
            _sync(device)
            wall = time.perf_counter() - t
            forwards = sum(r.nfe for r in results)
            tokens = sum(len(r.token_ids) for r in results)
            runs[method] = [r.token_ids for r in results]
            out[f"{dtype}_{method}"] = {
                "forwards_per_token": round(forwards / tokens, 3),
                "ms_per_forward": round(1000 * wall / forwards, 2),
            }
        out[f"{dtype}_linear_spec_equals_ar"] = runs["linear-spec"] == runs["ar"]
        out[f"{dtype}_linear_spec_first_difference"] = next(
            (
                i
                for a, b in zip(runs["linear-spec"], runs["ar"])
                for i, (x, y) in enumerate(zip(a, b))
                if x != y
            ),
            None,
        )
    return out


def llada22(device, small):
    if small:
        name = (
            "random:llada2.2-flash?num_hidden_layers=2&hidden_size=32&num_attention_heads=4&num_key_value_heads=2"
            "&head_dim=8&rotary_dim=4&intermediate_size=48&moe_intermediate_size=8&num_experts=16"
            "&num_experts_per_tok=2&expert_capacity=4&block_size=8&max_position_embeddings=256"
        )
    else:
        name = "random:llada2.2-flash?num_hidden_layers=2"
    lm = caidllm.load(name, device=device, dtype="bfloat16")
    prompts = torch.randint(100, 1000, (2, 16)).tolist()
    _sync(device)
    t = time.perf_counter()
    results = lm.generate(prompts, method="llada2.2", gen_length=32, block_length=8 if small else 32)
    _sync(device)
    return {
        "forwards": [r.nfe for r in results],
        "tokens": [len(r.token_ids) for r in results],
        "wall_s": round(time.perf_counter() - t, 2),
    }


def s2d2(device, small):
    prompts = BOOLEAN_PROMPTS
    lm = caidllm.load("tiny-bd", device=device, dtype="float32")
    out = {}
    for method in ("sdar", "s2d2"):
        alone = [lm.generate([p], method=method, gen_length=64, block_length=4, seed=1)[0] for p in prompts]
        batched = lm.generate(prompts, method=method, gen_length=64, block_length=4, seed=1, batch_size=3)
        out[method] = {
            "alone_equals_batched": [r.token_ids for r in alone] == [r.token_ids for r in batched],
            "forwards": [r.nfe for r in alone],
            "answers": [r.text.strip().splitlines()[-1] for r in alone],
        }
    return out


SECTIONS = {
    "dg_shape": dg_shape,
    "dg_step_peaks": dg_step_peaks,
    "tiny_dg": tiny_dg,
    "nemotron": nemotron,
    "llada22": llada22,
    "s2d2": s2d2,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="reduced shapes (a CPU's quick run)")
    p.add_argument("--only", default=None, help="comma-separated sections (default: all)")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "sections": {},
    }
    chosen = a.only.split(",") if a.only else list(SECTIONS)
    for name, fn in ((n, SECTIONS[n]) for n in chosen):
        t = time.perf_counter()
        try:
            result = fn(a.device, a.small)
        except Exception:  # noqa: BLE001 - one section's failure is a finding; the others still run
            result = {"error": traceback.format_exc(limit=6)}
        result["section_s"] = round(time.perf_counter() - t, 1)
        report["sections"][name] = result
        print(name, json.dumps(result), flush=True)
        (out / "gpu_families.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# GPU check of the 2026 families ({report['device']}, torch {report['torch']})", ""]
    for name, result in report["sections"].items():
        lines += [f"## {name}", "", "```json", json.dumps(result, indent=2), "```", ""]
    (out / "gpu_families.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
