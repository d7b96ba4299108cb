"""LLaDA2 / SDAR config.json parsing: the official shapes' exact parameter counts on the meta
device against the published figures, and clear errors for bad or contradicting fields and
missing shards."""

import json

import pytest

import caidllm
from block_checkpoints import SMALL, write_block_checkpoint
from caidllm.errors import ModelLoadError
from caidllm.models.families import parse_config
from caidllm.models.random_init import parameter_count


def expected_count(c: dict) -> tuple[int, int]:
    """(total, active per token) from the config fields, counted by hand: embeddings and head,
    per layer attention (q, k, v, o; QK-norm weights), two norms and the feed-forward."""
    d, hd, L = c["hidden_size"], c["head_dim"], c["num_hidden_layers"]
    h, kv = c["num_attention_heads"], c["num_key_value_heads"]
    attention = d * hd * (2 * h + 2 * kv) + 2 * hd + 2 * d
    swiglu = 3 * d
    dense_layers = c.get("first_k_dense_replace", 0) if c.get("num_experts") else L
    experts = c.get("num_experts", 0)
    router = experts * d
    routed = swiglu * c.get("moe_intermediate_size", 0)
    shared = routed * c.get("num_shared_experts", 0)
    moe_layers = L - dense_layers
    total = (
        2 * c["vocab_size"] * d
        + d
        + L * attention
        + dense_layers * swiglu * c["intermediate_size"]
        + moe_layers * (router + experts * routed + shared)
    )
    active = total - moe_layers * (experts - c.get("num_experts_per_tok", 0)) * routed
    return total, active


# Published sizes (billions): LLaDA2.0-mini 16B total / 1.4B active and LLaDA2.0-flash 100B /
# 6.1B (inclusionAI's model cards: "16BA1B", "100BA6B"); SDAR-30B-A3B as Qwen3-30B-A3B,
# 30.5B / 3.3B; SDAR-8B as Qwen3-8B, 8.2B; SDAR-1.7B as Qwen3-1.7B, 1.4B without embeddings
# (SDAR's head is untied, so it adds a second 151936 x 2048 matrix to Qwen3's 1.7B).
PUBLISHED = {
    "llada2-mini": (16.26, 1.43, 16, 1.4),
    "llada2-flash": (102.89, 6.15, 100, 6.1),
    "sdar-1.7b": (2.03, 2.03, 2.0, 2.0),
    "sdar-8b": (8.19, 8.19, 8.2, 8.2),
    "sdar-30b-a3b": (30.53, 3.35, 30.5, 3.3),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_official_shapes_have_the_published_parameter_counts(name):
    # Thousands of experts take seconds to build even on the meta device: LLaDA2.0-mini is built
    # whole; flash and SDAR-30B-A3B with 3 layers, which checks the count formula on their
    # shapes, and the figures use all their layers.
    layers = {"llada2-flash": 32, "sdar-30b-a3b": 48}.get(name)
    lm = caidllm.load(f"random:{name}" + ("?num_hidden_layers=3" if layers else ""), device="meta")
    assert parameter_count(lm.model) == expected_count(lm.config.raw)[0]  # exact, from the fields
    total, active = expected_count(
        {**lm.config.raw, "num_hidden_layers": layers} if layers else lm.config.raw
    )
    ours_total, ours_active, published_total, published_active = PUBLISHED[name]
    assert round(total / 1e9, 2) == ours_total and round(active / 1e9, 2) == ours_active
    assert abs(total / 1e9 - published_total) / published_total < 0.04
    assert abs(active / 1e9 - published_active) / published_active < 0.04
    if name == "sdar-1.7b":  # Qwen3-1.7B's published non-embedding size
        assert round((total - 2 * 151936 * 2048) / 1e9, 1) == 1.4


def test_small_shapes_on_the_cpu():
    lm = caidllm.load(
        "random:llada2-mini?num_hidden_layers=3&hidden_size=64&num_attention_heads=4"
        "&num_key_value_heads=2&head_dim=16&rotary_dim=8&intermediate_size=96"
        "&moe_intermediate_size=16&num_experts=16&vocab_size=512",
        device="cpu",
        dtype="float32",
    )
    assert lm.forward([[5, 6, 7, 8]]).shape == (1, 4, 512) and lm.config.moe.num_experts == 16


def raw(kind, **changes):
    config = {**SMALL[kind], "vocab_size": 320, "mask_token_id": 1, "eos_token_id": 0}
    config.update(changes)
    return config


@pytest.mark.parametrize(
    "kind, changes, needle",
    [
        ("llada2", {"score_function": "softplus"}, "unknown score_function='softplus'"),
        ("llada2", {"score_function": "softmax"}, "score_function='softmax' contradicts LLaDA2"),
        ("llada2", {"norm_topk_prob": False}, "norm_topk_prob=false contradicts LLaDA2"),
        ("llada2", {"use_bias": True}, "use_bias"),
        ("llada2", {"rotary_dim": 6}, "rotary_dim=6 contradicts partial_rotary_factor"),
        ("llada2", {"partial_rotary_factor": 0.0}, "partial_rotary_factor"),
        ("llada2", {"n_group": 3}, "n_group=3"),
        ("llada2", {"topk_group": 5}, "topk_group=5"),
        ("llada2", {"first_k_dense_replace": 9}, "first_k_dense_replace=9"),
        ("llada2", {"rope_scaling": {"type": "yarn"}}, "rope_scaling"),
        ("llada2", {"num_key_value_heads": 3}, "key/value heads"),
        ("llada2", {"block_size": 0}, "block lengths"),
        ("sdar", {"num_experts": 8}, "num_experts=8 contradicts"),
        ("sdar-moe", {"num_experts": None}, "num_experts=None contradicts"),
        ("sdar-moe", {"mlp_only_layers": [0]}, "mlp_only_layers"),
        ("sdar-moe", {"num_experts_per_tok": 9}, "num_experts_per_tok=9"),
        ("sdar", {"hidden_act": "gelu"}, "hidden_act"),
        ("sdar", {"intermediate_size": None}, "missing required field 'intermediate_size'"),
    ],
)
def test_bad_fields_are_clear_errors(kind, changes, needle):
    with pytest.raises(
        ModelLoadError, match="config.json: .*" + needle.replace("(", r"\(").replace("[", r"\[")
    ):
        parse_config(raw(kind, **changes), source="config.json")


def test_a_missing_shard_is_named(tmp_path):
    folder = write_block_checkpoint(tmp_path / "m", "sdar")
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors"):
        caidllm.load(folder, device="cpu", dtype="float32")


def test_a_bad_routing_function_names_the_file(tmp_path):
    folder = write_block_checkpoint(tmp_path / "m", "llada2", config_overrides={"score_function": "relu"})
    with pytest.raises(ModelLoadError, match=r"config.json: unknown score_function='relu'"):
        caidllm.load(folder, device="cpu", dtype="float32")


def test_a_missing_expert_tensor_is_named(tmp_path):
    folder = write_block_checkpoint(tmp_path / "m", "llada2")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.2.mlp.gate.expert_bias"]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="model.layers.2.mlp.gate.expert_bias"):
        caidllm.load(folder, device="cpu", dtype="float32")
