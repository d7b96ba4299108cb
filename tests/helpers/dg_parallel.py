"""The ranks of tests/test_diffusion_gemma_tp.py: each of 2 gloo ranks builds the same small random
DiffusionGemma (both attention kinds, 2 key/value heads in each), keeps its share (parallel/sharding.py),
and decodes the same seeded requests; rank 0 writes its logits and tokens to out/rank0.pt."""

from __future__ import annotations

import torch
import torch.distributed as dist

from caidllm.models.diffusion_gemma_cache import DecoderView, DGCache
from caidllm.parallel.mesh import init_group
from caidllm.parallel.sharding import shard_modules
from helpers.dg_reference import run_engine, serve_lm

SHAPE = dict(num_key_value_heads=2, num_global_key_value_heads=2, num_experts=6)
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15]]


def results(lm) -> dict:
    """One decoder forward's logits (a prompt encoded, a canvas with self-conditioning) and the tokens of
    seeded requests under two decoders (greedy's argmax, the CAI rule's samples), batched."""
    g = torch.Generator().manual_seed(0)
    cache = DGCache.empty(lm.config.n_layers)
    lm.model.encode(torch.tensor([PROMPTS[1]]), cache)
    canvas = torch.randint(2, 96, (1, 8), generator=g)
    soft = lm.model.soft_embeddings(torch.randn(1, 8, 96, generator=g))
    logits = lm.model.denoise(canvas, DecoderView.batch([cache]), soft)
    # few steps a canvas: the self-conditioning loop of a random model grows the ranks' rounding
    # differences (~1e-6, another summation order) about 3x a step (docs/diffusion-gemma.md's parity note)
    knobs = dict(entropy_bound=0.5, max_denoising_steps=4, confidence_threshold=5.0)
    tokens = {
        method: [
            (r.token_ids, r.steps_per_block) for r in run_engine(lm, PROMPTS, 3, 16, method=method, **knobs)
        ]
        for method in ("greedy", "diffusiongemma-cai")  # the official rule and the CAI one
    }
    return {"logits": logits, "tokens": tokens}


def run_rank(rank: int, size: int, port: int, out: str) -> None:
    """The model comes from out/model.pt (the parent's: transformers is not imported in a rank)."""
    torch.set_num_threads(1)
    tp = init_group(rank, size, port, torch.device("cpu"), 60.0)
    try:
        lm = serve_lm(torch.load(f"{out}/model.pt"))
        shard_modules(lm.model, lm.model.config, tp)
        with torch.no_grad():
            found = results(lm)
        found["collectives"] = tp.collectives
        found["q_rows"] = lm.model.backbone.layers[1].self_attn.q_proj.out_features
        if rank == 0:
            torch.save(found, f"{out}/rank0.pt")
    finally:
        dist.destroy_process_group()
