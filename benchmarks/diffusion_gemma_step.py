"""DiffusionGemma on a CPU: (1) peak resident memory of one sampler step's post-processing at canvas 256 and
the released vocabulary (262144), caidllm's chunked path against the naive float32 path (the reference's
ops on whole [canvas, vocab] tensors), each in a fresh process; (2) a random 26B-A4B shape reduced to a few
layers (the real widths and vocabulary, bf16): time of the prompt's encoder forward, of a decoder step, and
of a finished canvas's encoder forward, with the MoE kernel auto picks.

    python benchmarks/diffusion_gemma_step.py memory
    python benchmarks/diffusion_gemma_step.py shape --layers 2 --steps 3
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

CANVAS, VOCAB, HIDDEN = 256, 262144, 2816


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_one(path: str) -> dict:
    """One step's post-processing of the logits (sampling, entropy, acceptance, self-conditioning input)."""
    from caidllm.decode.diffusiongemma_rule import accepted_positions
    from caidllm.decode.diffusiongemma_sampler import draw

    g = torch.Generator().manual_seed(0)
    embedding = torch.empty(VOCAB, HIDDEN, dtype=torch.bfloat16).normal_(generator=g)
    logits = torch.randn(CANVAS, VOCAB, generator=g) * 4  # the forward's own tensor
    before = _peak_mb()
    if path == "chunked":
        scaled = logits.div_(0.8)
        _, _, entropy = draw(scaled, g, True, 64)
        accepted_positions(entropy, 0.1)
        soft = torch.empty(CANVAS, HIDDEN, dtype=torch.bfloat16)
        for s in range(0, CANVAS, 64):
            soft[s : s + 64] = (
                scaled[s : s + 64].to(torch.bfloat16).softmax(-1, dtype=torch.float32).to(torch.bfloat16)
                @ embedding
            )
    else:
        scaled = logits / 0.8
        probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
        torch.multinomial(probs, 1, generator=g)
        scaled.argmax(-1)
        entropy = torch.distributions.Categorical(logits=scaled).entropy()
        accepted_positions(entropy, 0.1)
        sc = scaled.to(torch.bfloat16)
        soft = sc.softmax(-1, dtype=torch.float32).to(torch.bfloat16) @ embedding
    return {
        "path": path,
        "peak_mb_over_inputs": round(_peak_mb() - before),
        "logits_mb": CANVAS * VOCAB * 4 // 2**20,
    }


def shape(layers: int, steps: int) -> dict:
    from caidllm.models import load
    from caidllm.models.diffusion_gemma_cache import DecoderView, DGCache

    torch.set_num_threads(1)
    lm = load(f"random:diffusiongemma-26b-a4b?num_hidden_layers={layers}", device="cpu", dtype="bfloat16")
    model, g = lm.model, torch.Generator().manual_seed(0)
    prompt = torch.randint(0, VOCAB, (1, 64), generator=g)
    cache = DGCache.empty(layers)
    t = time.perf_counter()
    model.encode(prompt, cache)
    prefill = time.perf_counter() - t
    canvas = torch.randint(0, VOCAB, (1, CANVAS), generator=g)
    soft, times, soft_times = None, [], []
    for _ in range(steps):
        t = time.perf_counter()
        logits = model.denoise(canvas, DecoderView.batch([cache]), soft)
        middle = time.perf_counter()
        soft = model.soft_embeddings(logits)
        times.append(time.perf_counter() - t)
        soft_times.append(time.perf_counter() - middle)
    t = time.perf_counter()
    model.encode(canvas, cache)
    canvas_encode = time.perf_counter() - t
    decode = min(times[1:] or times)
    soft_share = min(soft_times[1:] or soft_times) / decode
    return {
        "layers": layers,
        "prompt_64_encode_s": round(prefill, 3),
        "decoder_step_s": round(decode, 3),
        "canvas_256_encode_s": round(canvas_encode, 3),
        "self_conditioning_share_of_a_step": round(soft_share, 3),
        "encoder_share_of_a_48_step_canvas": round(canvas_encode / (canvas_encode + 48 * decode), 4),
        "moe_kernel": "auto",
        "threads": 1,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["memory", "memory-one", "shape"])
    p.add_argument("--path", default="chunked")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    if a.what == "memory-one":
        print(json.dumps(memory_one(a.path)))
    elif a.what == "memory":
        for path in ("naive", "chunked"):
            out = subprocess.run(
                [sys.executable, __file__, "memory-one", "--path", path],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            print(out.strip().splitlines()[-1])
    else:
        print(json.dumps(shape(a.layers, a.steps)))


if __name__ == "__main__":
    main()
