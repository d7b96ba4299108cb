"""The `uniform` objective of `caidllm train`: a small DiffusionGemma-architecture model
(models/diffusion_gemma.py, the recipe of tiny-dg) trained with the uniform-state loss of
train/uniform_objective.py.

The model is tiny's size (hidden 256, 6 layers, tiny's tokenizer) in the family's layout: sliding-window
layers interleaved with full layers (a wider head, fewer key/value heads, V = K, proportional RoPE), a dense
MLP beside a few routed experts, QK-norm with attention scale 1, soft-capped tied logits, self-conditioning.

A training row is one canvas of an answer: the answer (ending in the end-of-turn token, then EOS padding) is
cut into canvases of `canvas_length`; each row draws one of its canvases, the encoder reads the prompt and
the answer's earlier canvases (as the sampler's cache holds them when that canvas is decoded), and the
decoder denoises the drawn canvas.
"""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from caidllm.errors import InputError
from caidllm.models.diffusion_gemma_config import FULL, GENERATION_DEFAULTS, SLIDING
from caidllm.train.data import Batch
from caidllm.train.uniform_objective import uniform_state_loss

# Every third layer full (the released model: every sixth of 30); tiny has 6 layers, so two of each kind.
LAYER_PATTERN = (SLIDING, SLIDING, FULL)
SLIDING_WINDOW = 128  # the prompts and a canvas fit; web_of_lies' facts can fall outside it
EXPERTS, TOP_K, EXPERT_WIDTH = 4, 2, 192


def dg_config_dict(cfg, vocab_size: int, special: dict[str, int]) -> dict:
    """config.json in DiffusionGemmaForBlockDiffusion's layout at the TrainConfig's size."""
    head_dim = cfg.d_model // cfg.n_heads
    layer_types = [LAYER_PATTERN[i % len(LAYER_PATTERN)] for i in range(cfg.n_layers - 1)] + [FULL]
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "model_type": "diffusion_gemma",
        "canvas_length": cfg.canvas_length,
        "tie_word_embeddings": True,
        "use_bidirectional_attention": "vision",
        "image_token_id": None,  # no vision tower, no image token in tiny's vocabulary
        "eos_token_id": special["eos"],
        "pad_token_id": special["eos"],
        "bos_token_id": special["bos"],
        "torch_dtype": "float32",
        "text_config": {
            "model_type": "diffusion_gemma_text",
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_heads,
            "num_global_key_value_heads": max(1, cfg.n_heads // 2),
            "head_dim": head_dim,
            "global_head_dim": 2 * head_dim,
            "intermediate_size": cfg.mlp_hidden_size,
            "moe_intermediate_size": EXPERT_WIDTH,
            "num_experts": EXPERTS,
            "top_k_experts": TOP_K,
            "vocab_size": vocab_size,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-6,
            "final_logit_softcapping": 30.0,
            "sliding_window": SLIDING_WINDOW,
            "layer_types": layer_types,
            "max_position_embeddings": cfg.max_sequence_length,
            "rope_parameters": {
                FULL: {"rope_theta": 1_000_000.0, "partial_rotary_factor": 0.25, "rope_type": "proportional"},
                SLIDING: {"rope_theta": 10_000.0, "rope_type": "default"},
            },
            "eos_token_id": special["eos"],
            "pad_token_id": special["eos"],
            "bos_token_id": special["bos"],
        },
    }


def generation_config_dict(special: dict[str, int]) -> dict:
    """generation_config.json: the released model's sampler defaults, tiny's end tokens."""
    return dict(
        GENERATION_DEFAULTS,
        eos_token_id=[special["eos"], special["eot"]],
        pad_token_id=special["eos"],
        bos_token_id=special["bos"],
    )


@torch.no_grad()
def initialise(model) -> None:
    """PyTorch's default init for what it initialises; the routed experts (left uninitialised by the
    family) like nn.Linear; the q/k norms at head_dim^-1/4, so that attention with scale 1 starts with
    the usual 1/sqrt(head_dim) logits rather than saturated ones."""
    for layer in model.backbone.layers:
        experts = layer.experts
        for name in ("gate_proj", "up_proj", "down_proj"):
            weight = getattr(experts, name)
            bound = weight.shape[-1] ** -0.5
            weight.uniform_(-bound, bound)
        attn = layer.self_attn
        attn.q_norm.weight.fill_(attn.head_dim**-0.25)
        attn.k_norm.weight.fill_(attn.head_dim**-0.25)


# tiny's (LLaDA layout) tensor -> this model's, per layer; a tensor whose shape differs is left as drawn
LLADA_NAMES = {
    "attn_norm": "input_layernorm",
    "ff_norm": "pre_feedforward_layernorm",
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ff_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
}


@torch.no_grad()
def init_from_llada(model, folder) -> list[str]:
    """Copy a LLaDA-layout model's embeddings, final norm, attention and MLP weights where the shapes match
    (tiny's SiLU MLP goes into the GELU-tanh dense MLP); returns the names copied."""
    weights = load_file(str(folder / "model.safetensors"))
    pairs = {"model.transformer.wte.weight": "model.decoder.embed_tokens.weight"}
    pairs["model.transformer.ln_f.weight"] = "model.decoder.norm.weight"
    for i in range(len(model.backbone.layers)):
        for src, dst in LLADA_NAMES.items():
            pairs[f"model.transformer.blocks.{i}.{src}.weight"] = f"model.decoder.layers.{i}.{dst}.weight"
    own = dict(model.named_parameters())
    copied = []
    for src, dst in pairs.items():
        if src in weights and dst in own and own[dst].shape == weights[src].shape:
            own[dst].copy_(weights[src].float())
            copied.append(dst)
    return copied


@torch.no_grad()
def init_from_uniform(model, folder) -> list[str]:
    """Copy every tensor of a DiffusionGemma-layout folder (an earlier export: tiny-dg), so a run continues
    from shipped weights; a tensor missing or of another shape is refused, naming it."""
    weights = load_file(str(folder / "model.safetensors"))
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    wrong = [name for name in own if name in weights and weights[name].shape != own[name].shape]
    if missing or wrong:
        first = (missing or wrong)[0]
        raise InputError(
            f"init_from {str(folder)!r}: tensor {first} is {'missing' if missing else 'of another shape'} "
            "(the run's --d-model / --n-layers / vocabulary must be the start's)"
        )
    # load_state_dict, not copies into state_dict()'s tensors: some of those are built on the fly
    model.load_state_dict({name: weights[name].to(value.dtype) for name, value in own.items()})
    return list(own)


def canvas_rows(batch: Batch, canvas_length: int, eos_id: int, generator: torch.Generator):
    """(prompts, canvases [B, canvas_length]): each row's prompt plus a drawn number of its answer's
    earlier canvases, and the drawn canvas (EOS after the answer)."""
    prompts, canvases = [], []
    for r in range(batch.input_ids.shape[0]):
        ids = batch.input_ids[r]
        start, end = int(batch.answer_start[r]), int(batch.answer_end[r])
        n_canvases = -(-(end - start) // canvas_length)
        k = int(torch.randint(n_canvases, (1,), generator=generator))
        begin = start + k * canvas_length
        canvas = torch.full((canvas_length,), eos_id, dtype=torch.long)
        piece = ids[begin : min(end, begin + canvas_length)]
        canvas[: len(piece)] = piece
        prompts.append(ids[:begin])
        canvases.append(canvas)
    return prompts, torch.stack(canvases)


def uniform_loss(trainer, step: int, batch: Batch, generator: torch.Generator) -> torch.Tensor:
    cfg = trainer.cfg
    prompts, canvases = canvas_rows(batch, cfg.canvas_length, trainer.special["eos"], generator)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
        return uniform_state_loss(trainer.model, prompts, canvases, generator, cfg.self_conditioning)


def uniform_decode(lm, prompts: list[str], gen_length: int) -> list[str]:
    """Validation: the greedy uniform-state decoder (seeded, reproducible)."""
    from caidllm.decode import generate

    return [r.text for r in generate(lm, prompts, method="greedy", gen_length=gen_length, batch_size=8)]
