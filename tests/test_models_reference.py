"""Numerics against an independent implementation: transformers' Llama (for
LLaDA) and Qwen2 (for Dream) run with a bidirectional attention mask and
positions cumsum(mask)-1 must give the same logits (Dream: shifted by one)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

LLADA_TO_LLAMA = {
    "model.transformer.wte.": "model.embed_tokens.",
    "model.transformer.ln_f.": "model.norm.",
    "model.transformer.ff_out.": "lm_head.",
    "attn_norm.": "input_layernorm.",
    "q_proj.": "self_attn.q_proj.",
    "k_proj.": "self_attn.k_proj.",
    "v_proj.": "self_attn.v_proj.",
    "attn_out.": "self_attn.o_proj.",
    "ff_norm.": "post_attention_layernorm.",
    "ff_proj.": "mlp.gate_proj.",
    "up_proj.": "mlp.up_proj.",
    "ff_out.": "mlp.down_proj.",
}


def _llama_name(name):
    if name.startswith("model.transformer.blocks."):
        i, rest = name.removeprefix("model.transformer.blocks.").split(".", 1)
        prefix = f"model.layers.{i}."
    else:
        prefix, rest = "", name
    for old, new in LLADA_TO_LLAMA.items():
        if rest.startswith(old):
            return prefix + new + rest.removeprefix(old)
    raise KeyError(name)


def _reference_model(lm):
    c = lm.config
    common = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_length,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    state = lm.model.state_dict()
    if c.family == "llada":
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
        )
        state = {_llama_name(k): v for k, v in state.items()}
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_matches_transformers_reference(family, request):
    lm = request.getfixturevalue(f"{family}_lm")
    ref = _reference_model(lm)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 300, (2, 20), generator=g)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :6] = False  # left padding
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    bias = torch.zeros(2, 1, 20, 20)
    bias.masked_fill_(~mask[:, None, None, :], torch.finfo(torch.float32).min)  # hide padding keys only
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=bias, position_ids=positions).logits.float()
    if family == "dream":  # position i is predicted by i-1; the first real token keeps its own
        shifted = torch.cat([expected[:, :1], expected[:, :-1]], dim=1)
        shifted[1, 6] = expected[1, 6]
        expected = shifted
    out = lm.logits(ids, mask)
    assert torch.allclose(out[mask], expected[mask], atol=1e-5, rtol=0)
