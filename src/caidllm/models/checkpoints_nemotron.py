"""NVIDIA's Nemotron-Labs-Diffusion checkpoints (May 2026; issue 46): 3B, 8B and 14B, each instruct and
-Base, one dense Ministral-3 checkpoint that decodes autoregressively, by block diffusion or by
self-speculation (models/nemotron.py, decode/nemotron.py).

Plain rows (hub id, family, random: shape, instruct, Recommendation fields) that checkpoints.py turns into
its KNOWN table. The hub ids: the nvidia organisation's listing as stored copies give it (the
Nemotron-Labs-Diffusion collection: -3B, -3B-Base, -8B, -8B-Base, -14B, -14B-Base; -VLM-8B is a vision
model caidllm does not load). The shapes: docs/nemotron.md names the stored config.json copies.
"""

from __future__ import annotations

DLM_SOURCE = (
    "the hub repository's chat_dlm.py (model.generate: max_new_tokens 512, block_length 32, threshold 0.9, "
    "eos the tokenizer's) and modeling_nemotron_labs_diffusion.py's generate (causal_context True, one "
    "denoising step per block position at most: steps = gen_length; temperature 0); the nemotron-dlm "
    "preset; ar (chat_ar.py) and linear-spec (chat_linear_spec.py: block_length 32, threshold 0) are the "
    "other two modes; gating and f do not apply (its own decoders)"
)
BASE_SOURCE = DLM_SOURCE + "; a -Base model decodes raw text (no chat template by default)"
NEMOTRON_DLM = dict(
    gen_length=512,
    block_length=32,
    steps=512,
    temperature=0.0,
    confidence_gating=False,
    refresh_every=32,
    decoder="nemotron-dlm",
    threshold=0.9,
)

NEMOTRON_ROWS: tuple[tuple[str, str, str, bool, dict], ...] = tuple(
    (
        f"nvidia/Nemotron-Labs-Diffusion-{size}{suffix}",
        "nemotron_labs_diffusion",
        f"nemotron-labs-diffusion-{size.lower()}",
        not suffix,
        dict(NEMOTRON_DLM, source=BASE_SOURCE if suffix else DLM_SOURCE),
    )
    for size in ("3B", "8B", "14B")
    for suffix in ("", "-Base")
)
