"""Sparse upcycling: a LLaDA2 (``LLaDA2MoeModelLM``) checkpoint made from a dense model of the
LLaDA layout (``tiny`` / ``tiny-bd``), the start of ``tiny-moe``.

The new model computes what the source computes, up to two approximations (QK-norm and the
experts' noise), so fine-tuning starts from the source's skills:

* **attention**: LLaDA2 rotates only ``partial_rotary_factor`` of each head. Heads twice as
  wide (head_dim 2d) with factor 0.5 rotate exactly the source's d dimensions with the
  source's frequencies, so the source's q/k/v rows fill the rotary half; the new half starts
  as small noise (zero would be a saddle: its gradient is the other side's value). The
  attention scale 1/sqrt(2d) and QK-norm (LLaDA2 normalises each head of q and k) are
  absorbed into the norms' weights, set per layer from the source's mean |q| and |k| on
  synthetic-task text (exact for tokens of average norm, an approximation for the others).
* **feed-forward**: layer 0 stays dense (``first_k_dense_replace`` 1, the source's FFN). In
  each later layer the source's FFN neurons are ranked by importance (mean |activation| x
  |down column| on the same text); the most important ``num_shared_experts x
  moe_intermediate_size`` become the shared expert and the rest is copied into every routed
  expert with relative noise ``noise``, its down projection divided by
  ``routed_scaling_factor``: the routed top-k weights are normalised (sum 1), so shared +
  scale x sum_k w_k expert_k = the source FFN whatever the (fresh, small) router picks.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from caidllm.errors import InputError
from caidllm.models.loading import load, resolve_folder
from caidllm.tasks import TASK_NAMES, get_task


@dataclass(frozen=True)
class UpcycleSpec:
    """The MoE shape (official LLaDA2 config.json names) and the initialisation's noise."""

    num_experts: int = 8
    num_experts_per_tok: int = 2
    n_group: int = 4
    topk_group: int = 2
    moe_intermediate_size: int = 192
    num_shared_experts: int = 3
    routed_scaling_factor: float = 2.5
    noise: float = 0.01  # std of each expert's copy noise, relative to the weight's std
    new_dims_std: float = 0.02  # the new (non-rotary) head dimensions, relative to the source's q/k/v std
    constant: float = 10.0  # the q/k bias that steadies QK-norm, in units of the source's mean |q| / |k|
    calibration_examples: int = 8  # per synthetic task
    seed: int = 0


def llada2_config(source: dict, spec: UpcycleSpec, head_dim: int) -> dict:
    """The LLaDA2MoeModelLM config.json of the upcycled model (official field names)."""
    block_lengths = source.get("caidllm_block_lengths", [4, 8, 16, 32])
    return {
        "architectures": ["LLaDA2MoeModelLM"],
        "model_type": "llada2_moe",
        "hidden_act": "silu",
        "hidden_size": source["d_model"],
        "intermediate_size": source["mlp_hidden_size"],
        "num_hidden_layers": source["n_layers"],
        "num_attention_heads": source["n_heads"],
        "num_key_value_heads": source.get("n_kv_heads") or source["n_heads"],
        "head_dim": head_dim,
        "partial_rotary_factor": 0.5,
        "rotary_dim": head_dim // 2,
        "rope_theta": source.get("rope_theta", 10000.0),
        "rope_scaling": None,
        "rms_norm_eps": source.get("rms_norm_eps", 1e-5),
        "max_position_embeddings": source["max_sequence_length"],
        "vocab_size": source["embedding_size"],
        "first_k_dense_replace": 1,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "n_group": spec.n_group,
        "topk_group": spec.topk_group,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_shared_experts": spec.num_shared_experts,
        "routed_scaling_factor": spec.routed_scaling_factor,
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "norm_topk_prob": True,
        "router_dtype": "fp32",
        "use_qk_norm": True,
        "use_qkv_bias": True,
        "use_bias": False,
        "use_sliding_window": False,
        "norm_head": False,
        "tie_word_embeddings": False,
        "mask_token_id": source["mask_token_id"],
        "eos_token_id": source["eos_token_id"],
        "pad_token_id": source["pad_token_id"],
        "bos_token_id": source["bos_token_id"],
        "torch_dtype": "float32",
        "use_cache": False,
        "caidllm_block_lengths": list(block_lengths),
    }


@torch.no_grad()
def calibrate(lm, examples_per_task: int) -> list[dict]:
    """Per source layer: mean |q| and |k| per head vector and each FFN neuron's mean |activation|,
    on synthetic-task prompts with their worked answers (train split)."""
    blocks = lm.model.model.transformer.blocks
    stats = [{"q": [], "k": [], "act": []} for _ in blocks]
    hooks = []
    for i, block in enumerate(blocks):
        hd = block.head_dim
        hooks.append(
            block.q_proj.register_forward_hook(
                lambda m, a, out, i=i, hd=hd: stats[i]["q"].append(out.view(-1, hd).norm(dim=-1))
            )
        )
        hooks.append(
            block.k_proj.register_forward_hook(
                lambda m, a, out, i=i, hd=hd: stats[i]["k"].append(out.view(-1, hd).norm(dim=-1))
            )
        )
        hooks.append(
            block.ff_norm.register_forward_hook(
                lambda m, a, out, i=i, b=block: stats[i]["act"].append(
                    (torch.nn.functional.silu(b.ff_proj(out)) * b.up_proj(out)).abs().flatten(0, -2)
                )
            )
        )
    try:
        for name in TASK_NAMES:
            for example in get_task(name).examples("train", examples_per_task, seed=0):
                ids = lm.encode_chat(example.prompt) + lm.tokenizer.encode(
                    example.answer, add_special_tokens=False
                )
                lm.model(torch.tensor([ids]))
    finally:
        for hook in hooks:
            hook.remove()
    return [
        {
            "q": torch.cat(s["q"]).mean().item(),
            "k": torch.cat(s["k"]).mean().item(),
            "act": torch.cat(s["act"]).mean(0),
        }
        for s in stats
    ]


def _widen_heads(weight: torch.Tensor, heads: int, hd: int, std: float, generator) -> torch.Tensor:
    """[heads*hd, in] rows -> [heads*2hd, in]: each head's rows, then hd rows of small noise."""
    rows = weight.view(heads, hd, -1)
    fresh = torch.randn(rows.shape, generator=generator) * std
    return torch.cat([rows, fresh], dim=1).reshape(heads * 2 * hd, -1)


def _noisy(weight: torch.Tensor, relative: float, generator) -> torch.Tensor:
    return weight + torch.randn(weight.shape, generator=generator) * weight.std() * relative


def attention_weights(block, prefix: str, calibration: dict, spec: UpcycleSpec, generator) -> dict:
    """The fused query_key_value, dense and QK-norm weights of one layer (module docstring)."""
    hd, heads = block.head_dim, block.q_proj.weight.shape[0] // block.head_dim
    kv_heads = block.k_proj.weight.shape[0] // hd
    q, k, v, out = (m.weight.float() for m in (block.q_proj, block.k_proj, block.v_proj, block.attn_out))
    std = spec.new_dims_std * torch.cat([q, k, v]).std().item()
    fused = torch.cat(
        [
            _widen_heads(q, heads, hd, std, generator),
            _widen_heads(k, kv_heads, hd, std, generator),
            _widen_heads(v, kv_heads, hd, std, generator),
        ]
    )
    dense = _widen_heads(out.t().contiguous(), heads, hd, out.std().item() * spec.new_dims_std, generator).t()
    # QK-norm divides each head by its norm. A constant component, far larger than the source's
    # |q| (|k|), in one new dimension of every head (q and k in different ones: their product
    # stays 0) makes that norm almost constant, so the norm is almost a fixed scale, folded
    # into its weights: qn.kn / sqrt(2hd) = q.k / sqrt(hd) needs w_q w_k = c_q c_k / (sqrt(hd) sqrt(2hd)).
    c_q, c_k = spec.constant * calibration["q"], spec.constant * calibration["k"]
    for first in (0, heads * 2 * hd):  # no noise in those two dimensions: c_q x noisy k would move logits
        fused[first : first + (heads if first == 0 else kv_heads) * 2 * hd].view(-1, 2 * hd, fused.shape[1])[
            :, hd : hd + 2
        ] = 0
    bias = torch.zeros(fused.shape[0])
    bias[torch.arange(heads) * 2 * hd + hd] = c_q
    bias[heads * 2 * hd + torch.arange(kv_heads) * 2 * hd + hd + 1] = c_k
    w = math.sqrt(c_q * c_k / (math.sqrt(hd) * math.sqrt(2 * hd)))
    return {
        f"{prefix}.attention.query_key_value.weight": fused,
        f"{prefix}.attention.dense.weight": dense.contiguous(),
        f"{prefix}.attention.query_key_value.bias": bias,
        f"{prefix}.attention.query_layernorm.weight": torch.full((2 * hd,), w),
        f"{prefix}.attention.key_layernorm.weight": torch.full((2 * hd,), w),
    }


def moe_weights(block, prefix: str, importance: torch.Tensor, spec: UpcycleSpec, generator) -> dict:
    """Shared expert = the most important neurons; every routed expert = a noisy copy of the rest."""
    gate, up, down = (m.weight.float() for m in (block.ff_proj, block.up_proj, block.ff_out))
    shared_size = spec.num_shared_experts * spec.moe_intermediate_size
    if gate.shape[0] - shared_size != spec.moe_intermediate_size:
        raise InputError(
            f"upcycle: the source FFN has {gate.shape[0]} neurons; num_shared_experts x "
            f"moe_intermediate_size ({shared_size}) + moe_intermediate_size must equal it"
        )
    order = (importance * down.norm(dim=0)).argsort(descending=True)
    shared, rest = order[:shared_size], order[shared_size:]
    out = {
        f"{prefix}.mlp.shared_experts.gate_proj.weight": gate[shared],
        f"{prefix}.mlp.shared_experts.up_proj.weight": up[shared],
        f"{prefix}.mlp.shared_experts.down_proj.weight": down[:, shared].contiguous(),
        f"{prefix}.mlp.gate.weight": torch.randn(spec.num_experts, gate.shape[1], generator=generator) * 0.02,
        f"{prefix}.mlp.gate.expert_bias": torch.zeros(spec.num_experts),
    }
    for e in range(spec.num_experts):
        name = f"{prefix}.mlp.experts.{e}"
        out[f"{name}.gate_proj.weight"] = _noisy(gate[rest], spec.noise, generator)
        out[f"{name}.up_proj.weight"] = _noisy(up[rest], spec.noise, generator)
        out[f"{name}.down_proj.weight"] = _noisy(
            down[:, rest] / spec.routed_scaling_factor, spec.noise, generator
        )
    return out


def upcycle(source: str, out: str | Path, spec: UpcycleSpec = UpcycleSpec()) -> Path:
    """Write the upcycled LLaDA2 model of the dense LLaDA-layout model `source` to `out`
    (config.json, fp32 model.safetensors, the source's tokenizer files)."""
    folder, _ = resolve_folder(source)
    raw = json.loads((folder / "config.json").read_text())
    if raw.get("model_type") != "llada":
        raise InputError(
            f"upcycle: {source!r} is a {raw.get('model_type')!r} model; expected a dense LLaDA-layout one"
        )
    lm = load(source, device="cpu", dtype=torch.float32)
    calibration = calibrate(lm, spec.calibration_examples)
    generator = torch.Generator().manual_seed(spec.seed)
    t = lm.model.model.transformer
    tensors = {
        "model.word_embeddings.weight": t.wte.weight.float(),
        "model.norm.weight": t.ln_f.weight.float(),
        "lm_head.weight": t.ff_out.weight.float(),
    }
    for i, block in enumerate(t.blocks):
        prefix = f"model.layers.{i}"
        tensors[f"{prefix}.input_layernorm.weight"] = block.attn_norm.weight.float()
        tensors[f"{prefix}.post_attention_layernorm.weight"] = block.ff_norm.weight.float()
        tensors.update(attention_weights(block, prefix, calibration[i], spec, generator))
        if i == 0:  # first_k_dense_replace = 1
            for new, old in (
                ("gate_proj", block.ff_proj),
                ("up_proj", block.up_proj),
                ("down_proj", block.ff_out),
            ):
                tensors[f"{prefix}.mlp.{new}.weight"] = old.weight.float()
        else:
            tensors.update(moe_weights(block, prefix, calibration[i]["act"], spec, generator))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: value.detach().contiguous() for name, value in tensors.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config = llada2_config(raw, spec, 2 * lm.config.head_dim)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).exists():
            shutil.copy(folder / name, out / name)
    return out
