"""Nemotron-Labs-Diffusion: the family (its forward against transformers' Ministral3, the official
backbone), its config reader and random shapes, and its three decoders token-exact against a
re-statement of the official loops (tests/nemotron_reference.py) on small random weights; linear-spec's
lossless claim (its tokens are ar's); refusals; batch invariance."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import caidllm
import caidllm.models.lm
import caidllm.models.nemotron
from caidllm.errors import InputError, ModelLoadError
from caidllm.models.families import parse_config
from caidllm.models.nemotron_config import NEMOTRON_OFFICIAL
from caidllm.models.random_init import parameter_count
from nemotron_reference import Reference, ar_generate, generate, linear_spec_generate

TINY = (
    "random:nemotron-labs-diffusion-8b?num_hidden_layers=2&hidden_size=64&intermediate_size=128"
    "&num_attention_heads=4&num_key_value_heads=2&head_dim=16&vocab_size=512"
)
PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 300, 7], [100, 200, 300, 400, 401, 402, 403, 9]]


@pytest.fixture(scope="module")
def lm():
    return caidllm.load(TINY, device="cpu", dtype="float32")


def with_eos(lm, eos: int):
    """The same model with `eos` its one end id (the chat scripts pass the tokenizer's eos)."""
    clone = dataclasses.replace(lm.config, eos_ids=(eos,))
    other = caidllm.models.lm.DiffusionLM(lm.model, clone, lm.tokenizer, lm.device, lm.dtype)
    return other


def test_forward_matches_transformers_ministral3_causal_and_bidirectional(lm):
    ref = Reference(lm)
    ids = torch.randint(0, 512, (1, 14), generator=torch.Generator().manual_seed(0))
    causal = ref.encoder_call(ids, diffusion_lm=False, use_cache=False)
    ref.cache = ids[0, :9].tolist()
    bidirectional_tail = ref.encoder_call(ids[:, 9:], diffusion_lm=True, use_cache=False)
    cache = lm.model.new_cache()
    head = lm.model.run(ids[:, :9], cache, causal=True, write=True)
    tail = lm.model.run(ids[:, 9:], cache, causal=False, write=False)
    assert cache.length == 9  # the bidirectional forward kept nothing
    torch.testing.assert_close(head, causal[:, :9], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(tail, bidirectional_tail, atol=1e-4, rtol=1e-4)
    assert (tail - causal[:, 9:]).abs().max() > 1e-2  # the two attention patterns differ


def test_yarn_and_llama4_query_scale_past_the_original_window(lm):
    """Positions past original_max_position_embeddings (the query scale grows): set it to 4 here."""
    model = caidllm.load(TINY, device="cpu", dtype="float32")
    model.config.raw["rope_parameters"] = {
        **model.config.raw["rope_parameters"],
        "original_max_position_embeddings": 4,
    }
    model.model.rope["original_max_position_embeddings"] = 4
    model.model._frequencies.clear()
    ids = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(1))
    expected = Reference(model).encoder_call(ids, diffusion_lm=False, use_cache=False)
    torch.testing.assert_close(
        model.model.run(ids, model.model.new_cache(), True, True), expected, atol=1e-4, rtol=1e-4
    )


def test_official_shapes_and_exact_parameter_counts():
    counts = {}
    for name, raw in NEMOTRON_OFFICIAL.items():
        config = parse_config({**raw, "eos_token_id": 11, "mask_token_id": 100}, name)
        with torch.device("meta"):
            counts[name] = parameter_count(caidllm.models.nemotron.NemotronLabsDiffusionModel(config))
    assert counts == {
        "nemotron-labs-diffusion-3b": 3_831_659_520,
        "nemotron-labs-diffusion-8b": 8_489_553_920,
        "nemotron-labs-diffusion-14b": 13_506_073_600,
    }


@pytest.mark.parametrize(
    "field, value",
    [("sliding_window", 4096), ("attention_bias", True), ("rope_parameters", {"rope_type": "longrope"})],
)
def test_config_reader_refuses_what_the_forward_does_not_model(field, value):
    raw = {**NEMOTRON_OFFICIAL["nemotron-labs-diffusion-8b"], "eos_token_id": 11, field: value}
    with pytest.raises(ModelLoadError, match=field.split("_")[0]):
        parse_config(raw, "config.json")


def test_ar_matches_the_official_ar_generate(lm):
    for prompt in PROMPTS:
        ref = Reference(lm)
        expected, nfe = ar_generate(ref, torch.tensor([prompt]), 24)
        (r,) = lm.generate([prompt], method="ar", gen_length=24, early_stop=False)
        assert r.token_ids == expected[0, len(prompt) :].tolist()
        assert r.nfe == ref.calls == nfe  # the official count skips the prefill but not the unused last step


@pytest.mark.parametrize("threshold", [0.9, 0.03, 0.002, "none"])
def test_nemotron_dlm_matches_the_official_generate(lm, threshold):
    for prompt in PROMPTS:
        ref = Reference(lm)
        official = None if threshold == "none" else threshold
        expected, nfe = generate(ref, torch.tensor([prompt]), 24, 8, threshold=official)
        (r,) = lm.generate(
            [prompt],
            method="nemotron-dlm",
            gen_length=24,
            block_length=8,
            threshold=threshold,
            early_stop=False,
        )
        assert r.token_ids == expected[0, len(prompt) :].tolist()
        assert r.nfe == ref.calls == nfe + 1  # + the prefill, which the official count leaves out


@pytest.mark.parametrize("threshold", [0.0, 0.05])  # 0.05: several drafts a block
def test_linear_spec_matches_the_official_linear_spec_generate(lm, threshold):
    for prompt in PROMPTS:
        ref = Reference(lm)
        expected, nfe = linear_spec_generate(ref, torch.tensor([prompt]), 20, 4, threshold=threshold)
        (r,) = lm.generate(
            [prompt],
            method="linear-spec",
            gen_length=20,
            block_length=4,
            threshold=threshold,
            early_stop=False,
        )
        assert r.token_ids == expected[0, len(prompt) :].tolist()[:20]  # cut at gen_length (deviation)
        assert r.nfe == ref.calls == nfe
        assert sum(r.accepted_lengths) + 1 >= len(r.token_ids)


def test_end_token_stops_each_decoder_as_the_official_loops_do(lm):
    prompt = PROMPTS[0]
    (plain,) = lm.generate([prompt], method="ar", gen_length=24, early_stop=False)
    eos = plain.token_ids[9]
    model = with_eos(lm, eos)
    cases = [
        ("ar", lambda ref: ar_generate(ref, torch.tensor([prompt]), 24, eos_token_id=eos), {}),
        (
            "nemotron-dlm",
            lambda ref: generate(ref, torch.tensor([prompt]), 24, 8, 0.002, eos),
            {"threshold": 0.002},
        ),
        (
            "linear-spec",
            lambda ref: linear_spec_generate(ref, torch.tensor([prompt]), 24, 4, eos),
            {"block_length": 4},
        ),
    ]
    for method, official, options in cases:
        expected, _ = official(Reference(lm))
        kwargs = {"block_length": 8, **options} if method == "nemotron-dlm" else options
        (r,) = model.generate([prompt], method=method, gen_length=24, **kwargs)
        assert r.token_ids == expected[0, len(prompt) :].tolist(), method
    (r,) = model.generate([prompt], method="ar", gen_length=24)
    assert r.token_ids[-1] == eos and r.answer_length == len(r.token_ids) - 1 and r.early_stopped


@pytest.mark.parametrize("block_length", [2, 4, 8])
def test_linear_spec_is_lossless_against_ar(lm, block_length):
    ar = lm.generate(PROMPTS, method="ar", gen_length=40, early_stop=False)
    spec = lm.generate(
        PROMPTS, method="linear-spec", gen_length=40, block_length=block_length, early_stop=False
    )
    assert [r.token_ids for r in spec] == [r.token_ids for r in ar]
    assert all(len(r.token_ids) == 40 for r in spec)


def test_a_request_does_not_depend_on_its_batch(lm):
    for method in ("ar", "nemotron-dlm", "linear-spec"):
        together = lm.generate(PROMPTS, method=method, gen_length=16, block_length=8, batch_size=3)
        alone = [lm.generate([p], method=method, gen_length=16, block_length=8)[0] for p in PROMPTS]
        assert [(r.token_ids, r.nfe) for r in together] == [(r.token_ids, r.nfe) for r in alone], method


def test_refusals_name_the_field(lm):
    with pytest.raises(InputError, match="own decoders"):
        lm.generate([[5, 6]], method="fastdllm", gen_length=8)
    with pytest.raises(InputError, match="temperature"):
        lm.generate([[5, 6]], method="ar", gen_length=8, temperature=0.7)
    with pytest.raises(InputError, match="multiple of block_length"):
        lm.generate([[5, 6]], method="nemotron-dlm", gen_length=12, block_length=8)
    with pytest.raises(InputError, match="threshold"):
        lm.generate([[5, 6]], method="linear-spec", gen_length=8, threshold=2.0)
    with pytest.raises(InputError, match="'cache'"):
        lm.generate([[5, 6]], method="ar", gen_length=8, cache="dual")


def test_linear_spec_on_a_model_not_trained_for_it_is_refused_unless_forced():
    tiny = caidllm.load("tiny", device="cpu", dtype="float32")
    with pytest.raises(InputError, match="trained both as a causal language model.*force=True"):
        tiny.generate([[5, 6, 7]], method="linear-spec", gen_length=8, block_length=4)
    spec = tiny.generate(
        [[5, 6, 7]], method="linear-spec", gen_length=12, block_length=4, force=True, early_stop=False
    )
    ar = tiny.generate([[5, 6, 7]], method="ar", gen_length=12, force=True, early_stop=False)
    assert spec[0].token_ids == ar[0].token_ids  # lossless against its own (untrained) causal decoding


def test_a_written_folder_loads_with_the_official_names_and_config_mask_id(tmp_path):
    import json

    from helpers.random_model import write_random_model

    folder = write_random_model(tmp_path / "nld", TINY)
    config = json.loads((folder / "config.json").read_text())
    config["mask_token_id"] = 5  # a reserved slot whose spelling says nothing of a mask (Tekken's 100)
    (folder / "config.json").write_text(json.dumps(config))
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok.pop("mask_token")
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    lm = caidllm.load(str(folder), device="cpu", dtype="float32")
    assert lm.config.family == "nemotron_labs_diffusion" and lm.config.mask_id == 5
    names = set(lm.model.state_dict())
    per_layer = {n.split(".", 3)[3] for n in names if n.startswith("encoder.layers.")}
    assert per_layer == {
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    }
    assert len(names) == 9 * 2 + 3 and {"encoder.embed_tokens.weight", "diffusion_head.weight"} <= names
    (r,) = lm.generate([[5, 6, 7]], method="ar", gen_length=4, early_stop=False)
    assert len(r.token_ids) == 4


def test_the_step_engine_refuses_the_family_with_the_reason(lm):
    from caidllm.decode import build_config
    from caidllm.decode.engine import Engine

    with pytest.raises(InputError, match="own sequential decoders"):
        Engine(lm).submit([5, 6, 7], build_config("cai", gen_length=8, block_length=8))


def test_bench_takes_the_sequential_lengths():
    from caidllm.options import lengths_for_run

    methods = [("ar", {}), ("nemotron-dlm", {}), ("linear-spec", {})]
    assert lengths_for_run(TINY, None, methods, 32, 8) == {"gen_length": 32, "block_length": 8}
    assert lengths_for_run(TINY, None, methods) == {"gen_length": 256, "block_length": 32}


def test_served_answers_equal_generate_and_bad_methods_are_400(lm):
    from fastapi.testclient import TestClient

    from caidllm.serve.app import ServerConfig, create_app
    from caidllm.serve.protocol import ServerDefaults

    defaults = ServerDefaults(model_name="nld", method="nemotron-dlm", gen_length=32, block_length=8)
    with TestClient(create_app(lm, ServerConfig(defaults=defaults))) as client:
        for method, extra in (("ar", {}), ("linear-spec", {"block_length": 4}), ("nemotron-dlm", {})):
            body = {"model": "nld", "prompt": PROMPTS[0], "max_tokens": 16, "method": method, **extra}
            answer = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
            options = {"block_length": extra.get("block_length", 8)}
            (r,) = lm.generate([PROMPTS[0]], method=method, gen_length=16, early_stop=False, **options)
            assert answer == r.text, method
        streamed = client.post("/v1/completions", json={**body, "stream": True})
        assert streamed.status_code == 200 and streamed.text.count("data:") > 2
        for bad, param in (
            ({"method": "cai"}, "method"),
            ({"method": "ar", "temperature": 0.5}, "temperature"),
        ):
            r = client.post("/v1/completions", json={"model": "nld", "prompt": [5, 6], **bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_memory_figures_and_quantized_weights(lm):
    from caidllm.models.inventory import cache_bytes
    from caidllm.models.quantize import decoder_layers

    c = lm.config
    assert cache_bytes(c, 100, torch.float32) == {"kv": 2 * c.n_layers * c.n_kv_heads * c.head_dim * 100 * 4}
    assert decoder_layers(lm.model)[0] == "encoder.layers"
    quantized = caidllm.load(TINY, device="cpu", dtype="float32", quantize="int8")
    (r,) = quantized.generate(
        [[5, 6, 7]], method="linear-spec", gen_length=8, block_length=4, early_stop=False
    )
    (a,) = quantized.generate([[5, 6, 7]], method="ar", gen_length=8, early_stop=False)
    assert r.token_ids == a.token_ids


def test_a_known_checkpoint_decodes_with_its_row_unless_told(tmp_path):
    from helpers.random_model import write_random_model

    folder = write_random_model(tmp_path / "Nemotron-Labs-Diffusion-8B", TINY)
    lm = caidllm.load(str(folder), device="cpu", dtype="float32")
    assert lm.checkpoint.hub_id == "nvidia/Nemotron-Labs-Diffusion-8B" and lm.chat_default
    (r,) = lm.generate([[5, 6, 7]], gen_length=64, early_stop=False)
    assert r.method == "nemotron-dlm" and len(r.steps_per_block) == 2  # blocks of 32
    (ar,) = lm.generate([[5, 6, 7]], method="ar", gen_length=64, early_stop=False)
    assert ar.method == "ar" and r.token_ids[0] == ar.token_ids[0]  # each block opens with the causal token


def test_a_mask_model_served_refuses_the_sequential_decoders():
    from fastapi.testclient import TestClient

    from caidllm.serve.app import ServerConfig, create_app
    from caidllm.serve.protocol import ServerDefaults

    tiny = caidllm.load("tiny", device="cpu", dtype="float32")
    app = create_app(tiny, ServerConfig(defaults=ServerDefaults(model_name="tiny")), engine_thread=False)
    r = TestClient(app).post(
        "/v1/completions", json={"model": "tiny", "prompt": "x", "method": "linear-spec"}
    )
    assert r.status_code == 400 and "trained both as a causal" in r.json()["error"]["message"]
