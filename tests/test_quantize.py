"""--quantize / caidllm.load(quantize=...): torchao quantized linear layers on the tiny and random
models: outputs decode, memory shrinks, the rest of the model stays in its dtype, layers are
quantized as they load, batch invariance, and clean errors. Tests that quantize skip only where
torchao is not installed; the error tests run everywhere."""

import json
import shutil

import pytest
import torch
from torch import nn

import caidllm
from caidllm.cli import main
from caidllm.errors import CaidllmError, InputError
from caidllm.models import quantize as quant
from caidllm.models.quantize import QuantizePlan, is_quantized, quantize_loaded, tensor_bytes, weights_mb

needs_torchao = pytest.mark.skipif(quant.torchao_version() is None, reason="torchao is not installed")
PROMPTS = ["not ( True ) and ( True ) is", "True or False and not True is", "( False ) or True is"]
DECODE = dict(method="fastdllm", gen_length=32, block_length=16)
# The CPU settings: int8 and int8-dynamic in the checkpoint's float32, int4 in bfloat16.
SETTINGS = {"int8": "float32", "int8-dynamic": "float32", "int4": "bfloat16"}
SMALL_RANDOM = (
    "random:llada-8b?n_layers=2&d_model=128&n_heads=2&n_kv_heads=2&mlp_hidden_size=256&vocab_size=1024"
)


@pytest.fixture(scope="module")
def quantized():
    if quant.torchao_version() is None:
        pytest.skip("torchao is not installed")
    return {q: caidllm.load("tiny", device="cpu", dtype=dtype, quantize=q) for q, dtype in SETTINGS.items()}


# ---- behaviour ---------------------------------------------------------------------


@needs_torchao
@pytest.mark.parametrize("kind", list(SETTINGS))
def test_quantized_tiny_decodes_text(quantized, kind):
    lm = quantized[kind]
    result = lm.generate(PROMPTS[:1], **DECODE)[0]
    assert lm.quantization == kind and result.nfe > 0
    assert result.text.strip() and result.text == lm.decode(result.token_ids[: result.answer_length])


@needs_torchao
def test_weights_shrink_and_only_the_layers_linear_layers_are_quantized(quantized):
    fp32 = caidllm.load("tiny", device="cpu", dtype="float32")
    bf16 = caidllm.load("tiny", device="cpu", dtype="bfloat16")
    sizes = {kind: weights_mb(lm) for kind, lm in quantized.items()}
    # 1 byte per weight instead of 4 (int8-dynamic's CPU kernel keeps no zero point per row)
    assert sizes["int8-dynamic"] <= sizes["int8"] < 0.35 * weights_mb(fp32)
    assert sizes["int4"] < 0.45 * weights_mb(bf16)  # half a byte instead of 2, plus the group scales
    t = quantized["int8"].model.model.transformer
    assert all(is_quantized(block) for block in t.blocks)
    assert all(type(block.attn_norm.weight) is nn.Parameter for block in t.blocks)  # norms stay
    for plain in (t.wte.weight, t.ln_f.weight, t.ff_out.weight):  # embedding and head stay
        assert type(plain) is nn.Parameter and plain.dtype == torch.float32
    head = caidllm.load("tiny", device="cpu", quantize="int8", quantize_head=True)
    assert is_quantized(head.model.model.transformer.ff_out) and weights_mb(head) < sizes["int8"]


@needs_torchao
def test_expected_weights_equal_the_loaded_ones_without_loading(quantized):
    from caidllm.models.quantize import expected_weights_bytes, weights_bytes

    meta = caidllm.load(SMALL_RANDOM, device="meta").model
    assert expected_weights_bytes(meta, torch.float32) == weights_bytes(
        caidllm.load(SMALL_RANDOM, device="cpu", dtype="float32").model
    )
    for kind, lm in quantized.items():
        assert expected_weights_bytes(lm.model, lm.dtype, kind) == weights_bytes(lm.model), kind
    head = caidllm.load("tiny", device="cpu", quantize="int8", quantize_head=True)
    assert expected_weights_bytes(head.model, torch.float32, "int8", head=True) == weights_bytes(head.model)


@needs_torchao
@pytest.mark.parametrize("kind", list(SETTINGS))
def test_a_quantized_model_gives_a_request_the_same_tokens_alone_and_batched(quantized, kind):
    lm = quantized[kind]
    alone = [lm.generate([p], **DECODE)[0].token_ids for p in PROMPTS]
    batched = [r.token_ids for r in lm.generate(PROMPTS, batch_size=len(PROMPTS), **DECODE)]
    assert batched == alone


@needs_torchao
def test_layers_are_quantized_one_at_a_time_as_they_load(monkeypatch):
    """Loading never holds more than one layer's linear weights in full precision."""
    seen = []

    def counting(self, layer):
        model_layers = layer_list[0]
        loaded = [b for b in model_layers if b.q_proj.weight.device.type != "meta"]
        seen.append(sum(not is_quantized(b) for b in loaded))
        original(self, layer)

    layer_list = []
    original = QuantizePlan.layer
    real_decoder_layers = quant.decoder_layers

    def remember(model):
        found = real_decoder_layers(model)
        layer_list[:] = [found[1]]
        return found

    monkeypatch.setattr(QuantizePlan, "layer", counting)
    monkeypatch.setattr("caidllm.models.loading.decoder_layers", remember)
    lm = caidllm.load("tiny", device="cpu", quantize="int8")
    assert seen == [1] * lm.config.n_layers


@needs_torchao
def test_random_model_quantized_as_it_is_drawn_equals_quantizing_it_afterwards():
    drawn = caidllm.load(SMALL_RANDOM, device="cpu", dtype="bfloat16", quantize="int8")
    after = caidllm.load(SMALL_RANDOM, device="cpu", dtype="bfloat16")
    full_mb = weights_mb(after)
    quantize_loaded(after, "int8")
    assert after.quantization == "int8" and weights_mb(after) < full_mb
    for a, b in zip(drawn.model.state_dict().values(), after.model.state_dict().values()):
        assert tensor_bytes(a) == tensor_bytes(b)
        assert torch.equal(
            a.dequantize() if hasattr(a, "dequantize") else a,
            b.dequantize() if hasattr(b, "dequantize") else b,
        )
    ids = torch.tensor([drawn.tokenizer.encode("hello there", add_special_tokens=False)])
    assert torch.equal(drawn.logits(ids), after.logits(ids))


@needs_torchao
def test_bench_states_the_quantization_and_weights(tmp_path):
    from caidllm.bench import BenchConfig, run_bench

    report = run_bench(
        BenchConfig(
            model="tiny",
            tasks=["synthetic:arithmetic"],
            methods=["fastdllm"],
            limit=2,
            gen_length=32,
            block_length=16,
            batch_size=2,
            quantize="int8",
            device="cpu",
            out=str(tmp_path),
            progress=False,
        ),
        log=lambda m: None,
    )
    s, row = report["settings"], report["results"][0]
    assert (s["quantization"], s["quantized_head"]) == ("int8", False) and s["torchao"]
    assert row["weights_mb"] == pytest.approx(s["weights_mb"], abs=1e-3) and row["weights_mb"] < 10
    assert 0 <= row["high_first_confidence_share"] <= 1
    assert "int8 linear layers" in (tmp_path / "results.md").read_text()
    assert "Weights (MB)" in (tmp_path / "results.md").read_text()


@needs_torchao
def test_server_reports_the_quantization(quantized):
    from fastapi.testclient import TestClient

    from caidllm.serve.app import ServerConfig, create_app
    from caidllm.serve.protocol import ServerDefaults

    app = create_app(
        quantized["int8"], ServerConfig(defaults=ServerDefaults(model_name="tiny")), engine_thread=False
    )
    model = TestClient(app).get("/v1/models").json()["data"][0]
    assert (model["quantization"], model["dtype"]) == ("int8", "float32") and model["weights_mb"] < 10


@needs_torchao
def test_cli_generate_with_quantize(capsys):
    assert (
        main(
            [
                "generate",
                PROMPTS[0],
                "--device",
                "cpu",
                "--quantize",
                "int8",
                "--gen-length",
                "32",
                "--block-length",
                "16",
                "--method",
                "fastdllm",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out.splitlines()[0])["text"].strip()


# ---- bad input -------------------------------------------------------------------------


def _no_model_load(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the model was loaded before the error")

    monkeypatch.setattr("caidllm.models.loading.load_model", fail)
    monkeypatch.setattr("caidllm.models.random_init.materialise", fail)


@pytest.mark.parametrize(
    "kind, dtype, match",
    [
        ("int3", None, "unknown quantization 'int3'; expected one of int8, int8-dynamic, int4, fp8"),
        ("fp8", "bfloat16", "quantization 'fp8' cannot run on cpu: caidllm runs it on cuda devices only"),
        (
            "int4",
            "float32",
            "quantization 'int4' runs its kernels in bfloat16; the model would load as float32",
        ),
    ],
)
def test_a_quantization_the_device_cannot_run_fails_before_the_model_loads(
    monkeypatch, capsys, kind, dtype, match
):
    _no_model_load(monkeypatch)
    with pytest.raises(InputError, match=match):
        caidllm.load("tiny", device="cpu", dtype=dtype, quantize=kind)
    with pytest.raises(InputError, match=match):
        caidllm.load(SMALL_RANDOM, device="cpu", dtype=dtype, quantize=kind)
    argv = ["generate", "hi", "--device", "cpu", "--quantize", kind] + (["--dtype", dtype] if dtype else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err


def test_without_torchao_the_error_says_how_to_install_it(monkeypatch):
    _no_model_load(monkeypatch)
    monkeypatch.setattr(quant, "torchao_version", lambda: None)
    with pytest.raises(InputError, match=r"needs torchao: pip install 'caidllm\[quant\]'"):
        caidllm.load("tiny", device="cpu", quantize="int8")


def test_quantize_head_alone_is_an_error():
    with pytest.raises(InputError, match="quantize_head needs a quantization"):
        caidllm.load("tiny", device="cpu", quantize_head=True)


@needs_torchao
def test_quantize_head_of_a_tied_head_is_an_error_before_any_weight(monkeypatch):
    drawn = []
    monkeypatch.setattr("caidllm.models.random_init.initialise", lambda *a: drawn.append(a))
    with pytest.raises(InputError, match="output head is tied to its input embedding"):
        caidllm.load(SMALL_RANDOM + "&weight_tying=true", device="cpu", quantize="int8", quantize_head=True)
    assert not drawn


@needs_torchao
def test_quantizing_an_already_quantized_model_is_an_error(quantized, tmp_path, capsys):
    with pytest.raises(InputError, match=r"already quantized \(int8\)"):
        quantize_loaded(quantized["int8"], "int4")
    folder = tmp_path / "gptq"
    shutil.copytree(caidllm.models.loading.EMBEDDED["tiny"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "quantization_config": {"quant_method": "gptq"}})
    )
    with pytest.raises(CaidllmError, match="already quantized checkpoint .*gptq"):
        caidllm.load(str(folder), device="cpu", quantize="int8")
    assert main(["generate", "hi", "--model", str(folder), "--device", "cpu", "--quantize", "int8"]) == 2
    assert "already quantized checkpoint" in capsys.readouterr().err


@needs_torchao
def test_compile_with_a_quantization_torch_cannot_compile_fails_before_the_model_loads(monkeypatch, capsys):
    from caidllm.models import compiled

    def no_subclasses(fn, **kwargs):  # a torch.compile that runs plain tensors eagerly and fails on torchao's
        def run(*args):
            if any(hasattr(a, "__tensor_flatten__") for a in args):
                raise RuntimeError("cannot trace this tensor subclass")
            return fn(*args)

        return run

    compiled.compiled_kernels.cache_clear()
    compiled.check_quantized_compile.cache_clear()
    monkeypatch.setattr(torch, "compile", no_subclasses)
    _no_model_load(monkeypatch)
    with pytest.raises(
        InputError, match="--compile with --quantize int8: torch .* cannot compile torchao's int8"
    ):
        caidllm.load("tiny", device="cpu", quantize="int8", compile=True)
    assert main(["generate", "hi", "--device", "cpu", "--quantize", "int8", "--compile"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    compiled.compiled_kernels.cache_clear()
    compiled.check_quantized_compile.cache_clear()


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "hi"],
        ["bench", "--task", "synthetic:arithmetic", "--limit", "2"],
        ["calibrate", "--task", "synthetic:arithmetic", "--limit", "2", "--out", "{tmp}/settings.json"],
        ["serve", "--port", "0"],
    ],
)
def test_every_command_takes_quantize_and_names_a_bad_value(monkeypatch, capsys, tmp_path, argv):
    _no_model_load(monkeypatch)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv + ["--device", "cpu", "--quantize", "int3"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        "caidllm: error: unknown quantization 'int3'; expected one of int8, int8-dynamic, int4, fp8"
    ]


@needs_torchao
def test_lm_eval_adapter_takes_quantize_in_its_model_args():
    pytest.importorskip("lm_eval")
    from caidllm.evaluation.lm_eval_adapter import CaidllmLM

    adapter = CaidllmLM(pretrained="tiny", device="cpu", quantize="int8")
    assert adapter.lm.quantization == "int8" and is_quantized(adapter.lm.model)


@needs_torchao
def test_a_torchao_without_the_config_is_a_clear_error(monkeypatch):
    _no_model_load(monkeypatch)

    def missing():
        raise ImportError("cannot import name 'PrototypeInt4WeightOnlyConfig'")

    monkeypatch.setitem(quant.QUANTIZATIONS["int4"].configs, "cpu", missing)
    with pytest.raises(InputError, match="quantization 'int4': torchao .* cannot make its config on cpu"):
        caidllm.load("tiny", device="cpu", dtype="bfloat16", quantize="int4")


@needs_torchao
def test_mixture_of_experts_quantizes_its_experts_and_keeps_its_router():
    from caidllm.models.moe import Router

    name = (
        "random:llada2-mini?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=2"
        "&head_dim=16&rotary_dim=8&intermediate_size=128&moe_intermediate_size=32&num_experts=16&vocab_size=512"
    )
    lm = caidllm.load(name, device="cpu", dtype="float32", quantize="int8")
    layers = list(lm.model.model.layers)
    linears = [m for layer in layers for m in layer.modules() if isinstance(m, nn.Linear)]
    routers = [m for layer in layers for m in layer.modules() if isinstance(m, Router)]
    assert routers and len(linears) > 16 * 3  # the experts' projections are Linear layers
    assert all(is_quantized(m) for m in linears) and not any(is_quantized(r) for r in routers)
    assert lm.generate(["hello"], method="fastdllm", gen_length=32, block_length=32)[0].nfe > 0


@needs_torchao
def test_caidllm_models_gives_the_quantized_weights_a_load_would_hold(capsys):
    from caidllm.models.quantize import weights_bytes

    assert (
        main(["models", "--model", SMALL_RANDOM, "--dtype", "float32", "--quantize", "int8", "--json"]) == 0
    )
    memory = json.loads(capsys.readouterr().out)
    loaded = caidllm.load(SMALL_RANDOM, device="cpu", dtype="float32", quantize="int8")
    assert memory["quantization"] == "int8" and memory["weights_bytes"] == weights_bytes(loaded.model)
    assert main(["models", "--model", SMALL_RANDOM, "--quantize", "int4", "--dtype", "float32"]) == 2
    assert "runs its kernels in bfloat16" in capsys.readouterr().err
