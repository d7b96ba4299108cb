"""Random-weight models of the official shapes, by name: ``random:llada-8b``,
``random:dream-7b``, ``random:llada-moe-7b`` ... (OFFICIAL: one per public checkpoint layout), and the
block-diffusion ``random:llada2-mini``, ``random:llada2-flash``, ``random:sdar-1.7b``, ``random:sdar-8b``,
``random:sdar-30b-a3b`` (block_random.py), with config.json fields overridden by a query string:

    caidllm.load("random:llada-8b?n_layers=4&d_model=1024&n_heads=8&n_kv_heads=8&mlp_hidden_size=2816")

They exist to measure speed and memory without a checkpoint: the weights are
drawn directly on the target device in the target dtype (no file, no CPU
round-trip), and a small generated tokenizer (models/generated_tokenizer.py) stands in for
the real one, so every command accepts them. The text they write means
nothing. ``device="meta"`` builds the module without memory (to count
parameters). The token ids of the config (mask, eos, pad, bos) are those of the
generated tokenizer; every other field is the official one unless overridden.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from urllib.parse import parse_qsl

import torch
from torch import nn

from ..errors import ModelLoadError
from . import block_random
from .device import check_device_dtype, resolve_dtype
from .diffusion_gemma_config import RELEASED_26B_A4B, with_overrides
from .families import get_family, parse_config
from .generated_tokenizer import generated_tokenizer
from .layers import RMSNorm
from .lm import DiffusionLM
from .moe import Router
from .moe_experts import PROJECTIONS, StackedExperts
from .quantize import decoder_layers, make_plan
from .tokenizer import end_of_turn_ids

PREFIX = "random:"

# The official config.json fields that matter (REFERENCE.md); token ids come from the generated tokenizer.
OFFICIAL = {
    "llada-8b": {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "activation_type": "silu",
        "alibi": False,
        "attention_layer_norm": False,
        "bias_for_layer_norm": False,
        "block_type": "llama",
        "d_model": 4096,
        "embedding_size": 126464,
        "include_bias": False,
        "include_qkv_bias": False,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "max_sequence_length": 4096,
        "mlp_hidden_size": 12288,
        "n_heads": 32,
        "n_kv_heads": 32,
        "n_layers": 32,
        "rms_norm_eps": 1e-5,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": 500000.0,
        "scale_logits": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 126464,
        "weight_tying": False,
    },
    "dream-7b": {
        "architectures": ["DreamModel"],
        "model_type": "Dream",
        "hidden_act": "silu",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "max_position_embeddings": 131072,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
}
DREAM_CODER = {**OFFICIAL["dream-7b"], "max_position_embeddings": 32768}  # Qwen2.5-Coder-7B's context
OFFICIAL.update(
    {
        # MMaDA-8B (Gen-Verse): LLaDA's layout, its vocabulary grown by 8192 image codes (its text path).
        "mmada-8b": {
            **OFFICIAL["llada-8b"],
            "architectures": ["MMadaModelLM"],
            "model_type": "mmada",
            "embedding_size": 134656,
            "vocab_size": 134656,
            "llm_vocab_size": 126464,
            "codebook_size": 8192,
        },
        # Dream-Coder-v0-Instruct-7B (Dream-org) and DiffuCoder-7B (Apple): Dream's layout on
        # Qwen2.5-Coder-7B.
        "dream-coder-7b": DREAM_CODER,
        "diffucoder-7b": DREAM_CODER,
        # LLaDA-MoE-7B-A1B (inclusionAI): OLMoE layout, 64 experts, top 8 (its config.json says model_type
        # "llada").
        "llada-moe-7b": {
            "architectures": ["LLaDAMoEModelLM"],
            "model_type": "llada",
            "hidden_size": 2048,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "vocab_size": 157184,
            "max_position_embeddings": 8192,
            "rope_theta": 50000.0,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": False,
            "qk_layernorm": True,
            "num_experts": 64,
            "num_experts_per_tok": 8,
            "expert_intermediate_size": 1024,
            "dense_intermediate_size": 8192,
            "moe_layer_freq": [1] * 16,
            "moe_router_score_function": "softmax",
            "moe_router_enable_expert_bias": False,
            "partial_rotary_factor": 1.0,
            "torch_dtype": "bfloat16",
        },
    }
)
# Which generated tokenizer (models/generated_tokenizer.py) stands in for each shape's real one.
GENERATED_TOKENIZER = {
    "llada-8b": "llada",
    "mmada-8b": "llada",
    "llada-moe-7b": "llada",
    "dream-7b": "dream",
    "dream-coder-7b": "dream",
    "diffucoder-7b": "dream",
}
OFFICIAL.update(block_random.OFFICIAL)  # llada2-mini, llada2-flash, sdar-1.7b, sdar-8b, sdar-30b-a3b
GENERATED_TOKENIZER.update(block_random.FAMILY)
OFFICIAL["diffusiongemma-26b-a4b"] = RELEASED_26B_A4B  # its text config nested (diffusion_gemma_config.py)
GENERATED_TOKENIZER["diffusiongemma-26b-a4b"] = "diffusion_gemma"
TOKEN_FIELDS = ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id")


def is_random_name(name) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def random_raw_config(name: str) -> tuple[str, dict]:
    """The shape's generated-tokenizer kind ("llada" / "dream") and its config.json dict with the
    overrides of `name` applied."""
    shape, _, query = name[len(PREFIX) :].partition("?")
    if shape not in OFFICIAL:
        raise ModelLoadError(
            f"unknown random model shape {shape!r} in {name!r}; known: "
            + ", ".join(PREFIX + s for s in OFFICIAL)
        )
    raw = json.loads(json.dumps(OFFICIAL[shape]))  # a deep copy
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ModelLoadError(
            f"{name!r}: overrides must read field=value&field=value, got {query!r}"
        ) from None
    for key, text in pairs:
        if key in TOKEN_FIELDS:
            raise ModelLoadError(
                f"{name!r}: {key} is set by the generated tokenizer and cannot be overridden"
            )
        fields = {**raw, **raw.get("text_config", {})}  # a nested text config's fields too (DiffusionGemma)
        if key not in fields:  # a list or nested field is one (_typed refuses to override it)
            raise ModelLoadError(
                f"{name!r}: {key!r} is not a config.json field of {shape}; fields: "
                + ", ".join(sorted(k for k, v in fields.items() if not isinstance(v, (dict, list))))
            )
        if "text_config" in raw:
            with_overrides(raw, {key: _typed(name, key, text, fields[key])})
        else:
            raw[key] = _typed(name, key, text, raw[key])
    given = dict(pairs)
    if "embedding_size" in raw and "embedding_size" not in given and "vocab_size" in given:
        raw["embedding_size"] = raw["vocab_size"]  # the weights are sized by embedding_size
    if "moe_layer_freq" in raw and "num_hidden_layers" in given:
        raw["moe_layer_freq"] = [1] * raw["num_hidden_layers"]  # every layer MoE, as the official one
    return GENERATED_TOKENIZER[shape], raw


def _typed(name: str, key: str, text: str, official):
    """`text` read as the type of the official value (an int is fine for a float field)."""
    kind = type(official)
    try:
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if kind is int:
            return int(text)
        if kind is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        if kind is str:
            return text
    except ValueError:
        raise ModelLoadError(
            f"{name!r}: {key}={text!r} is not a valid {kind.__name__} (the official value is {official!r})"
        ) from None
    raise ModelLoadError(f"{name!r}: {key} (official value {official!r}) cannot be overridden")


def build_random(
    name: str,
    device: torch.device,
    dtype: torch.dtype | None,
    seed: int = 0,
    quantize: str | None = None,
    quantize_head: bool = False,
    pack: bool = True,
):
    """A DiffusionLM with random weights of the named shape, built on `device` in `dtype`;
    with `quantize`, each layer is quantized as soon as it is drawn (models/quantize.py; `pack`:
    repacked for the device's faster kernel)."""
    kind, raw = random_raw_config(name)
    make_tokenizer = (
        block_random.generated_tokenizer if kind in block_random.TOKENIZERS else generated_tokenizer
    )
    tokenizer, ids = make_tokenizer(kind, max_length=_max_length(raw))
    raw.update(ids)
    config = parse_config(raw, source=name)
    if config.vocab_size < len(tokenizer):
        raise ModelLoadError(
            f"{name!r}: vocab_size {config.vocab_size} is smaller than the generated "
            f"tokenizer ({len(tokenizer)} tokens)"
        )
    dtype = resolve_dtype(dtype if dtype is not None else config.torch_dtype)
    if device.type != "meta":
        check_device_dtype(device, dtype)
    plan = make_plan(quantize, device, dtype, quantize_head, pack) if quantize or quantize_head else None
    config = replace(config, eos_ids=tuple(dict.fromkeys([config.eos_id, *end_of_turn_ids(tokenizer)])))
    with torch.device("meta"):
        model = get_family(config.family).model_class(config)
    model = model.to(dtype)
    if device.type != "meta":
        materialise(model, device, torch.Generator(device=device).manual_seed(seed), plan)
    lm = DiffusionLM(
        model.eval(),
        config,
        tokenizer,
        device,
        dtype,
        path=None,
        quantization=quantize,
        quantized_head=quantize_head,
    )
    lm.name, lm.random_weights = name, True
    return lm


def _max_length(raw: dict) -> int:
    fields = {**raw, **raw.get("text_config", {})}
    return int(fields.get("max_sequence_length") or fields.get("max_position_embeddings"))


def materialise(model: nn.Module, device: torch.device, generator: torch.Generator, plan=None) -> None:
    """Allocate and draw the weights of a meta-device model on `device`, module by module in
    the order of model.modules() (so the same seed draws the same weights with or without a
    plan); with a quantization plan, each layer is quantized right after it is drawn."""
    layers = decoder_layers(model)[1] if plan is not None else ()
    if plan is not None:
        plan.check(model)
    inside = {id(m) for layer in layers for m in layer.modules() if m is not layer}
    starts = {id(layer) for layer in layers}
    for module in list(model.modules()):  # a list: quantizing a layer replaces its stacked experts
        if id(module) in inside:
            continue  # drawn with its layer
        if id(module) in starts:
            module.to_empty(device=device)
            initialise(module, generator)
            plan.layer(module)
        else:
            module.to_empty(device=device, recurse=False)
            _initialise_one(module, generator)
    if plan is not None:
        plan.finish(model)


@torch.no_grad()
def initialise(model: nn.Module, generator: torch.Generator) -> None:
    """In place, on the parameters' own device and dtype: embeddings N(0, 1), linear weights
    (stacked experts' too) and MoE gates N(0, 1/fan_in) (logits of order 1, like a trained
    model's), biases N(0, 0.02^2), norm weights N(1, 0.1^2)."""
    for module in model.modules():
        _initialise_one(module, generator)


@torch.no_grad()
def _initialise_one(module: nn.Module, generator: torch.Generator) -> None:
    if isinstance(module, nn.Embedding):
        module.weight.normal_(0.0, 1.0, generator=generator)
    elif isinstance(module, nn.Linear):
        module.weight.normal_(0.0, module.in_features**-0.5, generator=generator)
        if module.bias is not None:
            module.bias.normal_(0.0, 0.02, generator=generator)
    elif isinstance(module, RMSNorm):
        module.weight.normal_(1.0, 0.1, generator=generator)
    elif isinstance(module, Router):  # MoE gate: logits of order 1, a small score bias
        module.weight.normal_(0.0, module.weight.shape[1] ** -0.5, generator=generator)
        if module.expert_bias is not None:
            module.expert_bias.normal_(0.0, 0.01, generator=generator)
    elif hasattr(
        module, "draw_random"
    ):  # a family's own parameters and buffers (DiffusionGemma's norms, router)
        module.draw_random(generator)
    elif isinstance(module, StackedExperts):  # expert by expert, as separate Linear layers drew them
        for e in range(module.num_experts):
            for name in PROJECTIONS:
                weight = getattr(module, name)[e]
                weight.normal_(0.0, weight.shape[1] ** -0.5, generator=generator)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
