"""random:diffusiongemma-26b-a4b, its known-checkpoint row, `caidllm models` / --plan, the quantized variants
refused by name, and the command line on the family."""

import json

import pytest
import torch

from caidllm.errors import InputError, ModelLoadError

SMALL = (
    "random:diffusiongemma-26b-a4b?num_hidden_layers=2&vocab_size=512&hidden_size=64&intermediate_size=64"
    "&moe_intermediate_size=32&num_experts=8&top_k_experts=2&head_dim=16&global_head_dim=32&num_attention_heads=4"
    "&num_key_value_heads=2&num_global_key_value_heads=1&canvas_length=16"
)


def test_parameter_counts_equal_transformers_class_from_the_released_config():
    """Total: every text parameter of transformers' DiffusionGemmaForBlockDiffusion on the meta device from
    the released config (the vision tower left out: caidllm builds none); active: without the routed experts a
    token does not use (the tied embedding is the head: counted)."""
    pytest.importorskip("transformers.models.diffusion_gemma")
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from caidllm.models import load
    from caidllm.models.diffusion_gemma_config import RELEASED_26B_A4B
    from caidllm.models.inventory import parameter_counts

    raw = {k: v for k, v in RELEASED_26B_A4B.items() if k not in ("architectures", "dtype", "model_type")}
    with torch.device("meta"):
        reference = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig(**raw))
    text = sum(p.numel() for name, p in reference.named_parameters() if "vision" not in name)
    t = RELEASED_26B_A4B["text_config"]
    unused = (
        t["num_hidden_layers"]
        * (t["num_experts"] - t["top_k_experts"])
        * 3
        * t["hidden_size"]
        * t["moe_intermediate_size"]
    )
    total, active = parameter_counts(load("random:diffusiongemma-26b-a4b", device="meta"))
    assert total == text == 25_250_986_752
    assert active == text - unused == 3_840_375_552


def test_a_reduced_shape_decodes_and_keeps_the_layer_pattern():
    from caidllm.models import load

    lm = load(SMALL, device="cpu", dtype="float32")
    assert lm.model.shape.layer_types == ("sliding_attention", "full_attention")
    assert lm.config.mask_id is None and lm.model.shape.canvas_length == 16
    result = lm.generate([[3, 4, 5, 6]], gen_length=32, max_denoising_steps=3, seed=0)[0]
    assert len(result.token_ids) <= 32 and result.nfe >= 3
    with pytest.raises(ModelLoadError, match="frobnicate"):
        load(SMALL + "&frobnicate=1", device="meta")


def test_models_table_plan_and_refused_variants(capsys):
    from caidllm.cli import main

    assert main(["models", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    [family] = [f for f in listing["families"] if f["family"] == "diffusion_gemma"]
    assert family["decoders"] == ["diffusiongemma", "greedy", "diffusiongemma-cai"] and family["uniform"]
    [row] = [c for c in listing["checkpoints"] if c["hub_id"] == "google/diffusiongemma-26B-A4B-it"]
    assert row["parameters_total"] == 25_250_986_752 and row["recommended"]["decoder"] == "diffusiongemma"
    assert main(["models", "--plan", "random:diffusiongemma-26b-a4b", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["sharded_parameters"] + plan["replicated_parameters"] == 25_250_986_752
    for variant in (
        "RedHatAI/diffusiongemma-26B-A4B-it-FP8-dynamic",
        "nvidia/diffusiongemma-26B-A4B-it-NVFP4",
    ):
        assert main(["generate", "--model", variant, "hi"]) == 2
        err = capsys.readouterr().err
        assert "google/diffusiongemma-26B-A4B-it" in err and variant in err


def test_command_line_generate_and_bad_input(capsys):
    from caidllm.cli import main

    assert main(["generate", "--model", SMALL, "--gen-length", "16", "--seed", "1", "--json", "hi"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["method"] == "diffusiongemma"
    for args, field in (
        (["--method", "cai"], "'cai'"),
        (["--threshold", "0.9"], "'threshold'"),
        (["--tp", "2"], "--tp 2"),
    ):
        assert main(["generate", "--model", SMALL, *args, "hi"]) == 2 and field in capsys.readouterr().err
    with pytest.raises(InputError, match="seed"):
        from caidllm.models import load

        load(SMALL, device="cpu", dtype="float32").generate([[3, 4]], gen_length=16, seed=True)


def test_the_server_refuses_mask_based_requests_with_a_400():
    """Serving this family is not wired yet: a request (a mask-based decoder, the server's) gets an OpenAI
    error body with HTTP 400 naming the decoder, and the server goes on."""
    import httpx

    from caidllm.models import load
    from caidllm.serve.app import ServerConfig, create_app
    from caidllm.serve.local import LocalServer
    from caidllm.serve.protocol import ServerDefaults

    lm = load(SMALL, device="cpu", dtype="float32")
    defaults = ServerDefaults(model_name="dg", gen_length=16, max_gen_length=64)
    with LocalServer(create_app(lm, ServerConfig(defaults=defaults, max_batch=2, max_queue=4))) as server:
        for _ in range(2):
            r = httpx.post(
                f"{server.url}/v1/completions",
                timeout=60,
                json={"model": "dg", "prompt": "hi", "max_tokens": 8, "method": "cai"},
            )
            error = r.json()["error"]
            assert r.status_code == 400 and error["param"] == "method" and "uniform-state" in error["message"]
