"""The official shapes of the block-diffusion families for ``random:`` models
(random_init.py), and the small generated tokenizers that stand in for their real ones.

Shapes (config.json fields; sources in docs/block-diffusion-models.md):
- llada2-mini / llada2-flash: inclusionAI's LLaDA2.0-mini / -flash config.json
  (LLaDA2.1 has the same shapes);
- sdar-1.7b: JetLM/SDAR-1.7B-Chat's config.json; sdar-4b, sdar-8b and sdar-30b-a3b: the Qwen3-4B,
  Qwen3-8B and Qwen3-30B-A3B shapes SDAR-4B/8B-Chat and SDAR-30B-A3B-Chat were trained from, with
  SDAR's block_size, mask token and untied head (as SDAR-1.7B-Chat's config.json has it);
- fastdllm-v2-1.5b / -7b: Qwen2.5-1.5B / 7B-Instruct's config.json (the models Fast-dLLM v2
  fine-tunes) with the modeling file's bd_size;
- stable-diffcoder-8b: ByteDance-Seed/Stable-DiffCoder-8B-Base's and -Instruct's config.json (Seed-Coder's
  Llama layout); rnd1-30b-a3b: RND1's configuration_rnd.py CONFIG_DEFAULTS ("Qwen3-30B-A3B / checkpoint
  defaults", the full-sequence RND1-Base-0910). Sources and counts: docs/models-derived.md.
"""

from __future__ import annotations

from .generated_tokenizer import build_tokenizer
from .nemotron_config import NEMOTRON_OFFICIAL
from .tokenizer import fast_tokenizer

_LLADA2 = {
    "architectures": ["LLaDA2MoeModelLM"],
    "model_type": "llada2_moe",
    "hidden_act": "silu",
    "head_dim": 128,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 16384,
    "n_group": 8,
    "norm_head": False,
    "norm_topk_prob": True,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_key_value_heads": 4,
    "num_shared_experts": 1,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-6,
    "rope_scaling": None,
    "rope_theta": 600000.0,
    "rotary_dim": 64,
    "routed_scaling_factor": 2.5,
    "moe_router_enable_expert_bias": True,
    "router_dtype": "fp32",
    "score_function": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "torch_dtype": "bfloat16",
    "use_bias": False,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "use_sliding_window": False,
    "vocab_size": 157184,
}
_SDAR = {
    "architectures": ["SDARForCausalLM"],
    "model_type": "sdar",
    "attention_bias": False,
    "block_size": 4,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}

OFFICIAL = {
    "llada2-mini": {
        **_LLADA2,
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "moe_intermediate_size": 512,
        "num_attention_heads": 16,
        "num_hidden_layers": 20,
    },
    "llada2-flash": {
        **_LLADA2,
        "hidden_size": 4096,
        "intermediate_size": 9216,
        "moe_intermediate_size": 1024,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
    },
    # LLaDA2.1: LLaDA2.0's shapes with a 32768 context (SGLang's LLaDA2.1 cookbook).
    "llada2.1-mini": {
        **_LLADA2,
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "moe_intermediate_size": 512,
        "num_attention_heads": 16,
        "num_hidden_layers": 20,
        "max_position_embeddings": 32768,
    },
    "llada2.1-flash": {
        **_LLADA2,
        "hidden_size": 4096,
        "intermediate_size": 9216,
        "moe_intermediate_size": 1024,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "max_position_embeddings": 32768,
    },
    # LLaDA2.2-flash: LLaDA2.x-flash's shapes with block routing (block_size 32, expert_capacity 48), a
    # 131072 context and rope_theta 3e6, as its config.json names them (a public port's key-by-key diff
    # against LLaDA2.0-flash; the technical report's C = 48 of 256). Sources: docs/llada2.2.md.
    "llada2.2-flash": {
        **_LLADA2,
        "hidden_size": 4096,
        "intermediate_size": 9216,
        "moe_intermediate_size": 1024,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "max_position_embeddings": 131072,
        "rope_theta": 3000000.0,
        "block_size": 32,
        "expert_capacity": 48,
        "delete_token_id": 156930,
        "split_token_id": 156931,
    },
    "sdar-1.7b": {
        **_SDAR,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
    },
    "sdar-4b": {
        **_SDAR,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
    },
    "sdar-8b": {
        **_SDAR,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
    },
    "sdar-30b-a3b": {
        **_SDAR,
        "architectures": ["SDARMoeForCausalLM"],
        "model_type": "sdar_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}
# Fast-dLLM v2 1.5B / 7B: Qwen2.5-1.5B-Instruct's and Qwen2.5-7B-Instruct's config.json (the models they
# fine-tune, same shapes) with the modeling file's bd_size 32; the 1.5B ties its head to the embedding.
_FASTDLLM_V2 = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"],
    "model_type": "Fast_dLLM_Qwen",
    "bd_size": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
}
OFFICIAL.update(
    {
        "fastdllm-v2-1.5b": {
            **_FASTDLLM_V2,
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_attention_heads": 12,
            "num_hidden_layers": 28,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "vocab_size": 151936,
        },
        "fastdllm-v2-7b": {
            **_FASTDLLM_V2,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_attention_heads": 28,
            "num_hidden_layers": 28,
            "num_key_value_heads": 4,
            "tie_word_embeddings": False,
            "vocab_size": 152064,
        },
    }
)
OFFICIAL.update(
    {
        # config.json of ByteDance-Seed/Stable-DiffCoder-8B-Base / -Instruct (head_dim: hidden / heads, 128).
        "stable-diffcoder-8b": {
            "architectures": ["StableDiffcoderForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "max_position_embeddings": 8192,
            "mlp_bias": False,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-6,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "vocab_size": 155136,
        },
        # RND1's CONFIG_DEFAULTS (Qwen3-30B-A3B's shape); architectures: the class that saves it, RND1LM.
        "rnd1-30b-a3b": {
            "architectures": ["RND1LM"],
            "model_type": "rnd1",
            "attention_bias": False,
            "decoder_sparse_step": 1,
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "max_position_embeddings": 40960,
            "mlp_only_layers": [],
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
            "num_attention_heads": 32,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 48,
            "num_key_value_heads": 4,
            "rms_norm_eps": 1e-6,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "use_sliding_window": False,
            "vocab_size": 151936,
        },
    }
)
OFFICIAL.update(NEMOTRON_OFFICIAL)  # nemotron-labs-diffusion-3b / -8b / -14b (models/nemotron_config.py)
_FAMILY_OF = {
    "llada2.1": "llada2",
    "llada2.2": "llada2",
    "fastdllm": "fastdllm_v2",
    "stable": "stable_diffcoder",
    "nemotron": "nemotron_labs_diffusion",
}
FAMILY = {name: _FAMILY_OF.get(name.split("-")[0], name.split("-")[0]) for name in OFFICIAL}

# The generated tokenizers: the families' special tokens (their official spellings) and a chat
# template of the same layout as the official one (the real template comes with a checkpoint).
LLADA2_TEMPLATE = (
    "{% for message in messages %}{% set role = 'HUMAN' if message['role'] == 'user' else message['role'] | "
    "upper %}"
    "<role>{{ role }}</role>{{ message['content'] }}<|role_end|>{% endfor %}"
    "{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% "
    "endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% "
    "endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
SEED_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}\n{{ message['content'] }}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}assistant\n{% endif %}"
)
TOKENIZERS = {
    "llada2": dict(
        specials=["<|endoftext|>", "<|mask|>", "<role>", "</role>", "<|role_end|>"],
        template=LLADA2_TEMPLATE,
        eos="<|endoftext|>",
        mask="<|mask|>",
        bos=None,
    ),
    "sdar": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"],
        template=CHATML_TEMPLATE,
        eos="<|endoftext|>",
        mask="<|MASK|>",
        bos="<|endoftext|>",
    ),
    # Qwen2.5-Instruct's specials, the end of a turn its eos; the mask token Fast-dLLM v2 added.
    "fastdllm_v2": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "|<MASK>|"],
        template=CHATML_TEMPLATE,
        eos="<|im_end|>",
        mask="|<MASK>|",
        bos=None,
    ),
    # Gemma's ids for pad / eos / bos (0 / 1 / 2); no mask token (uniform-state diffusion); Gemma's turn
    # markers.
    "diffusion_gemma": dict(
        specials=["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        template=GEMMA_TEMPLATE,
        eos="<eos>",
        mask=None,
        bos="<bos>",
        pad="<pad>",
    ),
    # Seed-Coder's bos / pad / eos / sep spellings (its special_tokens_map.json), at its ids 0 and 2; the
    # spelling of the mask token (id 5) and the chat template are not in the stored copies: stand-ins. RND1
    # is a base model on Qwen3's tokenizer (eos <|im_end|>, pad <|endoftext|>).
    "stable_diffcoder": dict(
        specials=[
            "<[begin▁of▁sentence]>",
            "<[PAD▁TOKEN]>",
            "<[end▁of▁sentence]>",
            "<[SEP▁TOKEN]>",
            "<[MASK▁TOKEN]>",
        ],
        template=SEED_TEMPLATE,
        eos="<[end▁of▁sentence]>",
        mask="<[MASK▁TOKEN]>",
        bos="<[begin▁of▁sentence]>",
    ),
    # Nemotron-Labs-Diffusion (Tekken tokenizer): Mistral's <unk> <s> </s>, a ChatML-like stand-in for
    # the chat template (the real one comes with the checkpoint), think markers, a mask token
    "nemotron_labs_diffusion": dict(
        specials=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|mask|>"],
        template=CHATML_TEMPLATE,
        eos="<|im_end|>",
        mask="<|mask|>",
        bos="<s>",
    ),
    "rnd1": dict(
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"],
        template=None,
        eos="<|im_end|>",
        mask="<|mask|>",
        bos=None,
    ),
}


def tokenizer_files(family: str, max_length: int) -> tuple[dict, dict]:
    """(tokenizer_config.json dict, config.json token-id fields) of `family`'s generated
    tokenizer, whose special tokens take ids 0, 1, ... in the order of TOKENIZERS."""
    spec = TOKENIZERS[family]
    ids = {t: i for i, t in enumerate(spec["specials"])}
    pad = spec.get("pad", spec["eos"])
    tok_config = {
        "bos_token": spec["bos"],
        "eos_token": spec["eos"],
        "pad_token": pad,
        "mask_token": spec["mask"],
        "additional_special_tokens": [
            t for t in spec["specials"] if t not in (spec["eos"], spec["mask"], pad)
        ],
        "chat_template": spec["template"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    fields = {"eos_token_id": ids[spec["eos"]], "pad_token_id": ids[pad]}
    if spec["mask"] is not None:  # a uniform-state family has none
        fields["mask_token_id"] = ids[spec["mask"]]
    if spec["bos"] is not None:
        fields["bos_token_id"] = ids[spec["bos"]]
    return tok_config, fields


def generated_tokenizer(family: str, max_length: int):
    """A PreTrainedTokenizerFast for a random `family` model, and its config.json token-id fields."""
    tok_config, fields = tokenizer_files(family, max_length)
    tokenizer = fast_tokenizer(
        tok_config,
        tok_config["chat_template"],
        tokenizer_object=build_tokenizer(TOKENIZERS[family]["specials"]),
    )
    return tokenizer, fields
