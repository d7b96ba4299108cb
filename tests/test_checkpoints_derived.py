"""The 2026 checkpoints that reuse known architectures (models/checkpoints_derived.py): `caidllm models`
lists each with its source; the two new random: shapes have their exact parameter counts on the meta
device; Stable-DiffCoder's and RND1's folders (random weights, official tensor names) load as those
checkpoints, match the forward their modeling files inherit from transformers (LlamaForCausalLM under
the block-causal mask, Qwen3MoeForCausalLM bidirectional and shifted) and decode; bad settings are
refused naming the field."""

import json

import pytest
import torch

import caidllm
from bd_reference import stable_diffcoder_generate
from block_checkpoints import SMALL, write_block_checkpoint
from caidllm.cli import main
from caidllm.errors import ModelLoadError
from caidllm.models.checkpoints import KNOWN, find_checkpoint, recommended_method, recommended_options
from caidllm.models.checkpoints_derived import DERIVED_ROWS
from caidllm.models.families import parse_config
from caidllm.models.inventory import shape_figures

DERIVED = [find_checkpoint(row[0]) for row in DERIVED_ROWS]
# (total, active) on the meta device: Stable-DiffCoder-8B = Seed-Coder-8B's Llama shape ("8.3B params" on its
# hub page), RND1 = Qwen3-30B-A3B's ("30B-parameter ... 3B active parameters per token", RND1's README).
COUNTS = {
    "stable-diffcoder-8b": (8_250_462_208, 7_615_025_152),
    "rnd1-30b-a3b": (30_532_122_624, 3_041_867_776),
}
CONTEXTS = {"stable-diffcoder-8b": 8192, "rnd1-30b-a3b": 40960}


def test_every_derived_row_is_known_once_with_its_base_shape():
    assert all(c is not None for c in DERIVED) and len({c.hub_id for c in KNOWN}) == len(KNOWN)
    shapes = {c.name: (c.family, c.shape) for c in DERIVED}
    assert shapes["LLaDA2.0-flash-CAP"] == ("llada2", "llada2-flash")
    assert shapes["TraDo-4B-Instruct"] == ("sdar", "sdar-4b") and shapes["TraDo-8B-Thinking"] == (
        "sdar",
        "sdar-8b",
    )
    assert shapes["d3LLM_Dream_Coder"] == ("dream", "dream-coder-7b")
    assert shapes["SDAR-4B-Chat-distill-webshop"] == ("sdar", "sdar-4b")
    assert shapes["dParallel-LLaDA-8B-instruct"] == ("llada", "llada-8b")
    assert shapes["Stable-DiffCoder-8B-Base"] == ("stable_diffcoder", "stable-diffcoder-8b")
    assert shapes["RND1-Base-0910"] == ("rnd1", "rnd1-30b-a3b")
    for (
        c
    ) in DERIVED:  # the official generate settings each names, greedy, the length a whole number of blocks
        r = c.recommended
        assert r.temperature == 0 and r.gen_length % r.block_length == 0 and r.steps == r.gen_length
        assert "generate" in r.source and (r.decoder is None) == (c.family in ("llada", "dream", "rnd1"))


def test_models_lists_every_derived_row_with_its_source(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert all(c.hub_id in out for c in DERIVED)
    assert "stable_diffcoder" in out and "rnd1" in out
    assert main(["models", "--json"]) == 0
    rows = {c["hub_id"]: c for c in json.loads(capsys.readouterr().out)["checkpoints"]}
    for c in DERIVED:
        assert rows[c.hub_id]["recommended"]["source"] == c.recommended.source
        assert rows[c.hub_id]["parameters_total"] == shape_figures(c.shape)["parameters_total"]


@pytest.mark.parametrize("shape", sorted(COUNTS))
def test_new_random_shapes_on_the_meta_device(shape):
    figures = shape_figures(shape)
    assert (figures["parameters_total"], figures["parameters_active"]) == COUNTS[shape]
    assert figures["context"] == CONTEXTS[shape]


def by_hand(shape):
    """(divided among --tp ranks, held by every rank) counted from the official configs."""
    if shape == "stable-diffcoder-8b":  # 32 layers: q, o 4096x4096; k, v 1024x4096; SwiGLU 3 x 4096x14336
        sharded = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336)
        return sharded, 2 * 155136 * 4096 + 32 * 2 * 4096 + 4096  # embedding, head; norms
    # 48 layers: q, o 2048x(32x128); k, v 2048x(4x128); 128 experts of 3 x 2048x768 (routers: replicated)
    sharded = 48 * (2 * 2048 * 4096 + 2 * 2048 * 512 + 128 * 3 * 2048 * 768)
    return sharded, 2 * 151936 * 2048 + 48 * (2 * 2048 + 2 * 128) + 2048 + 48 * 128 * 2048


@pytest.mark.parametrize("shape", sorted(COUNTS))
def test_the_plan_divides_the_parameters_counted_by_hand(shape):
    from caidllm.models.inventory import describe
    from caidllm.models.plan import split_parameters

    sharded, replicated = split_parameters(describe(f"random:{shape}").model)
    assert (sharded, replicated) == by_hand(shape) and sharded + replicated == COUNTS[shape][0]


def test_models_memory_of_stable_diffcoder_without_a_threshold(capsys):
    assert (
        main(
            ["models", "--model", "ByteDance-Seed/Stable-DiffCoder-8B-Instruct", "--length", "512", "--json"]
        )
        == 0
    )
    m = json.loads(capsys.readouterr().out)
    # K, V; 32 layers; 8 heads of 128
    assert m["cache_bytes_per_request"]["block"] == 2 * 32 * 8 * 128 * 512 * 2
    assert m["recommended"].startswith("method sdar-static, gen_length 512, block_length 4")


def _canvas(lm, n=11):
    ids = torch.randint(3, 100, (1, n), generator=torch.Generator().manual_seed(0))
    ids[0, 7:] = lm.config.mask_id
    return ids


def test_stable_diffcoder_is_llama_under_the_block_causal_mask(tmp_path):
    from transformers import LlamaForCausalLM

    folder = write_block_checkpoint(tmp_path / "Stable-DiffCoder-8B-Instruct", "stable_diffcoder")
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    ids = _canvas(lm)
    block = torch.arange(ids.shape[1]) // 4  # the modeling file's mask: blocks of 4 from position 0
    mask = torch.where(block[None, :] <= block[:, None], 0.0, float("-inf"))[None, None]
    reference = LlamaForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        want = reference(ids, attention_mask=mask).logits
    torch.testing.assert_close(lm.logits(ids), want, atol=1e-4, rtol=1e-4)


def test_rnd1_is_bidirectional_qwen3_moe_shifted(tmp_path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    folder = write_block_checkpoint(tmp_path / "RND1-Base-0910", "rnd1")
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    raw = {
        k: v
        for k, v in json.loads((folder / "config.json").read_text()).items()
        if k not in ("architectures", "model_type")
    }
    reference = Qwen3MoeForCausalLM.from_pretrained(
        folder, config=Qwen3MoeConfig(**raw), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = _canvas(lm)
    with torch.no_grad():  # an all-zero additive mask: every position sees every other (is_causal False)
        want = reference(ids, attention_mask=torch.zeros(1, 1, ids.shape[1], ids.shape[1])).logits
    got = lm.logits(ids)
    torch.testing.assert_close(got[:, 1:], want[:, :-1], atol=1e-4, rtol=1e-4)  # "pos i predicts token i+1"


def test_a_stable_diffcoder_folder_decodes_with_its_own_decoder(tmp_path):
    checkpoint = find_checkpoint("ByteDance-Seed/Stable-DiffCoder-8B-Instruct")
    lm = caidllm.load(
        write_block_checkpoint(tmp_path / checkpoint.name, "stable_diffcoder"), device="cpu", dtype="float32"
    )
    assert lm.checkpoint is checkpoint and lm.chat_default and lm.config.block_lengths == (4,)
    assert recommended_method(lm.checkpoint, None) == "sdar-static"
    result = lm.generate(["what is 2 + 3 ?"], gen_length=8)[0]
    assert result.method == "sdar-static" and len(result.steps_per_block) >= 2
    options, taken = recommended_options(
        lm.checkpoint,
        "sdar-static",
        gen_length=None,
        block_length=None,
        steps=None,
        temperature=None,
        threshold=None,
    )
    assert taken == ["gen_length", "block_length", "steps", "temperature"] and options["threshold"] is None
    base = caidllm.load(
        write_block_checkpoint(tmp_path / "Stable-DiffCoder-8B-Base", "stable_diffcoder"),
        device="cpu",
        dtype="float32",
    )
    assert base.checkpoint.name == "Stable-DiffCoder-8B-Base" and base.chat_default is False


def test_stable_diffcoder_tokens_equal_its_generate_block(tmp_path):
    """sdar-static against a re-statement of the modeling file's generate_block (tests/bd_reference.py), one
    token a step: equal where the prompt fills whole blocks; where it does not, the official canvas ends at
    prompt + gen_length (its last block cut to prompt length % 4 positions) while caidllm's last block is
    whole, so only those last positions may differ (docs/models-derived.md)."""
    folder = write_block_checkpoint(
        tmp_path / "Stable-DiffCoder-8B-Instruct", "stable_diffcoder", head_scale=4.0
    )
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    stop = set(lm.config.eos_ids)
    prompts = [[40, 41, 42, 43], [50, 51, 52, 53, 54, 55, 56, 57], [61, 62, 63], [40, 41, 42, 43, 44]]
    results = lm.generate(prompts, method="sdar-static", gen_length=16, block_length=4, steps=16)
    for prompt, result in zip(prompts, results):
        got = result.token_ids[: result.answer_length + 1] if result.answer_length < 16 else result.token_ids
        want = stable_diffcoder_generate(lm, prompt, gen_length=16, block_length=4, steps=16, stop_ids=stop)
        cut = len(prompt) % 4
        assert got[: 16 - cut] == want[: 16 - cut]
        if cut == 0:
            assert got == want


@pytest.mark.parametrize("method", ["cai", "es-dllm"])
def test_rnd1_decodes_and_its_answers_do_not_depend_on_the_batch(tmp_path, method):
    lm = caidllm.load(
        write_block_checkpoint(tmp_path / "RND1-Base-0910", "rnd1"), device="cpu", dtype="float32"
    )
    assert lm.checkpoint.name == "RND1-Base-0910" and lm.chat_default is False
    assert lm.config.moe.norm_topk_prob and lm.config.mask_id == lm.tokenizer.convert_tokens_to_ids(
        "<|mask|>"
    )
    prompts = ["Question: what is 2 + 3 ?\nAnswer:", "the answer", "how many"]
    alone = [lm.generate([p], method=method, gen_length=16, block_length=8)[0].token_ids for p in prompts]
    together = lm.generate(prompts, method=method, gen_length=16, block_length=8, batch_size=3)
    assert [r.token_ids for r in together] == alone


@pytest.mark.parametrize(
    "kind, field, value, message",
    [
        (
            "stable_diffcoder",
            "attention_bias",
            True,
            "unsupported Stable-DiffCoder setting attention_bias=True",
        ),
        (
            "stable_diffcoder",
            "rope_scaling",
            {"type": "linear"},
            "unsupported Stable-DiffCoder setting rope_scaling",
        ),
        ("rnd1", "mlp_only_layers", [0], "unsupported RND1 setting mlp_only_layers=[0]"),
        ("rnd1", "norm_topk_prob", "yes", "field 'norm_topk_prob' = 'yes' must be true or false"),
    ],
)
def test_settings_the_official_forward_does_not_have_are_refused(kind, field, value, message):
    raw = {**SMALL[kind], "mask_token_id": 3, "eos_token_id": 2, field: value}
    with pytest.raises(ModelLoadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_config(raw, source="config.json")


def test_a_bad_rnd1_folder_exits_2_with_one_line(tmp_path, capsys):
    folder = write_block_checkpoint(
        tmp_path / "RND1-Base-0910", "rnd1", config_overrides={"decoder_sparse_step": 2}
    )
    assert main(["generate", "hi", "--model", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decoder_sparse_step=2" in err[0]


# The derived rows on the block-diffusion families (the full-sequence ones, d3LLM and dParallel, load from
# their layouts in tests/test_checkpoints.py): the turn markers their chat template writes and the
# end-of-turn token that closes an answer, per family.
TURNS = {"llada2": ("<role>HUMAN</role>", "<|role_end|>"), "sdar": ("<|im_start|>user\n", "<|im_end|>")}


@pytest.mark.parametrize("checkpoint", [c for c in DERIVED if c.family in TURNS], ids=lambda c: c.name)
def test_a_block_derived_folder_loads_with_its_chat_template_and_end_tokens(tmp_path, checkpoint):
    folder = write_block_checkpoint(tmp_path / checkpoint.name, checkpoint.family)
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    assert lm.checkpoint is checkpoint and lm.config.family == checkpoint.family and lm.chat_default
    opener, end = TURNS[checkpoint.family]
    text = lm.tokenizer.decode(lm.encode_chat("what is 2 + 3 ?"))
    assert text.startswith(opener) and text.count(end) == 1
    tok = lm.tokenizer
    ends = {tok.convert_ids_to_tokens(i) for i in lm.config.eos_ids}
    assert {"<|endoftext|>", end} <= ends and tok.convert_ids_to_tokens(lm.config.mask_id) not in ends


@pytest.mark.parametrize("hub_id", ["d3LLM/d3LLM_LLaDA", "Zigeng/dParallel_Dream_7B_Instruct"])
def test_a_full_sequence_derived_folder_stops_at_its_end_of_turn(tmp_path, hub_id):
    from helpers.checkpoint_files import write_checkpoint

    lm = caidllm.load(write_checkpoint(tmp_path, hub_id), device="cpu", dtype="float32")
    end = "<|eot_id|>" if lm.config.family == "llada" else "<|im_end|>"
    assert lm.checkpoint is find_checkpoint(hub_id) and lm.chat_default
    assert lm.tokenizer.decode(lm.encode_chat("what is 2 + 3 ?")).count(end) == 1
    assert end in {lm.tokenizer.convert_ids_to_tokens(i) for i in lm.config.eos_ids}


def test_a_distill_folder_decodes_with_its_own_block_size(tmp_path):
    """SDAR-4B-Chat-distill's config.json is not stored: the row's block of 4 is SDAR's default, and a
    folder whose config.json says otherwise decodes with its own (whole-block prompt: 16 = 2 blocks of 8)."""
    folder = write_block_checkpoint(
        tmp_path / "SDAR-4B-Chat-distill-search", "sdar", config_overrides={"block_size": 8}
    )
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    assert lm.checkpoint.recommended.block_length == 4 and lm.config.block_lengths == (8,)
    result = lm.generate([list(range(10, 18))], gen_length=16)[0]
    assert result.method == "sdar" and len(result.steps_per_block) == 2


# Stable-DiffCoder's first revisions (Base and Instruct): "LlamaForCausalLM" in architectures, their class
# SeedDiffcoderForCausalLM (a LlamaForCausalLM with generate_block) only in auto_map.
FIRST_REVISION = {
    "architectures": ["LlamaForCausalLM"],
    "auto_map": {"AutoModelForCausalLM": "modeling_seed_diffcoder.SeedDiffcoderForCausalLM"},
}


def test_a_first_revision_stable_diffcoder_folder_loads_by_its_auto_map(tmp_path):
    name = "Stable-DiffCoder-8B-Instruct"
    new_folder = write_block_checkpoint(tmp_path / "new" / name, "stable_diffcoder")
    new = caidllm.load(new_folder, device="cpu", dtype="float32")
    folder = write_block_checkpoint(tmp_path / name, "stable_diffcoder", config_overrides=FIRST_REVISION)
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    assert lm.config.family == "stable_diffcoder" and lm.checkpoint is new.checkpoint
    ids = _canvas(lm)
    torch.testing.assert_close(lm.logits(ids), new.logits(ids))  # the same weights, the same forward
    assert lm.generate(["what is 2 + 3 ?"], gen_length=8)[0].method == "sdar-static"


def test_a_plain_llama_folder_is_still_refused(tmp_path):
    overrides = {**FIRST_REVISION, "auto_map": {"AutoModelForCausalLM": "modeling_llama.LlamaForCausalLM"}}
    raw = {**SMALL["stable_diffcoder"], "mask_token_id": 3, "eos_token_id": 2, **overrides}
    with pytest.raises(
        ModelLoadError, match=r"unknown model architecture \(architectures=\['LlamaForCausalLM'\]"
    ):
        parse_config(raw, source="config.json")


def test_a_trado_folder_with_its_template_in_chat_template_jinja(tmp_path):
    """TraDo's hub folders ship the chat template as chat_template.jinja (tokenizer_config.json has none)."""
    folder = write_block_checkpoint(tmp_path / "TraDo-8B-Thinking", "sdar")
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "chat_template.jinja").write_text(tok_config.pop("chat_template"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    lm = caidllm.load(folder, device="cpu", dtype="float32")
    assert lm.checkpoint.name == "TraDo-8B-Thinking" and lm.chat_default
    assert lm.tokenizer.decode(lm.encode_chat("hi")).endswith("<|im_start|>assistant\n")
