"""int8-dynamic on a CPU through oneDNN (models/cpu_int8.py): torchao's quantized values repacked at
load, the same numbers as torchao's kernel, batch invariance exact, close to float32 on tiny, the
head too, and torchao's kernel kept where oneDNN is missing."""

import pytest
import torch
from torch import nn

import caidllm
from caidllm.models import quantize as quant

pytestmark = pytest.mark.skipif(quant.torchao_version() is None, reason="torchao is not installed")
PROMPTS = ["not ( True ) and ( True ) is", "True or False and not True is", "( False ) or True is"]
DECODE = dict(method="fastdllm", gen_length=32, block_length=16)


def cpu_int8():
    from caidllm.models import cpu_int8

    if not cpu_int8.available():
        pytest.skip("this torch has no oneDNN")
    return cpu_int8


def torchao_int8_dynamic(linear: nn.Linear) -> nn.Linear:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(linear, Int8DynamicActivationInt8WeightConfig())
    return linear


def packed_int8_linear(in_features: int, out_features: int, bias: bool, seed: int) -> nn.Linear:
    """A torchao int8-dynamic linear of seeded random weights, repacked for oneDNN."""
    kernels = cpu_int8()
    torch.manual_seed(seed)
    linear = torchao_int8_dynamic(nn.Linear(in_features, out_features, bias=bias))
    kernels.pack_int8_dynamic(linear)
    return linear


@pytest.fixture(scope="module")
def tiny():
    cpu_int8()
    models = {
        "fp32": caidllm.load("tiny", device="cpu", dtype="float32"),
        "packed": caidllm.load(
            "tiny", device="cpu", dtype="float32", quantize="int8-dynamic", quantize_head=True
        ),
    }
    with without_packing():
        models["torchao"] = caidllm.load(
            "tiny", device="cpu", dtype="float32", quantize="int8-dynamic", quantize_head=True
        )
    return models


class without_packing:
    """torchao's own kernel for int8-dynamic while inside (the state before cpu_int8)."""

    def __enter__(self):
        self.saved = dict(quant.QUANTIZATIONS["int8-dynamic"].packings)
        quant.QUANTIZATIONS["int8-dynamic"].packings.clear()

    def __exit__(self, *exc):
        quant.QUANTIZATIONS["int8-dynamic"].packings.update(self.saved)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_packed_linear_computes_torchaos_numbers(dtype):
    kernels = cpu_int8()
    torch.manual_seed(0)
    linear = torchao_int8_dynamic(nn.Linear(96, 160, bias=True).to(dtype))
    x = torch.randn(2, 7, 96, dtype=dtype)
    expected = linear(x).float()
    kernels.pack_int8_dynamic(linear)
    assert isinstance(linear.weight, kernels.OnednnInt8Weight) and linear.weight.shape == (160, 96)
    got = linear(x)
    assert got.dtype == dtype and got.shape == (2, 7, 160)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16: the output rounded once more
    assert torch.allclose(got.float(), expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


def test_a_row_gets_the_same_bits_alone_as_in_any_batch():
    linear = packed_int8_linear(128, 256, bias=False, seed=1)
    x = torch.randn(9, 128)
    together = linear(x)
    for rows in (slice(3, 4), slice(0, 5), slice(2, 9)):
        assert torch.equal(linear(x[rows]), together[rows])
    assert linear(x[:0]).shape == (0, 256)  # no rows: no kernel call, the right shape


def test_dequantize_gives_torchaos_weight_and_bytes_count_the_packed_data():
    kernels = cpu_int8()
    linear = torchao_int8_dynamic(nn.Linear(64, 32, bias=False))
    before = linear.weight.dequantize()
    kernels.pack_int8_dynamic(linear)
    assert torch.equal(linear.weight.dequantize(), before)
    assert quant.tensor_bytes(linear.weight) == 32 * 64 + 32 * 4  # int8 data, a float32 scale per row


def test_loading_packs_the_layers_and_the_head_on_a_cpu(tiny):
    kernels = cpu_int8()
    t = tiny["packed"].model.model.transformer
    weights = [m.weight for m in t.modules() if isinstance(m, nn.Linear)]
    assert weights and all(isinstance(w, kernels.OnednnInt8Weight) for w in weights)  # head included
    assert type(t.wte.weight) is nn.Parameter  # the embedding stays
    info = quant.quantization_info(tiny["packed"])
    assert info["quantization_kernel"].startswith("onednn") and info["quantized_head"]
    assert quant.quantization_info(tiny["torchao"])["quantization_kernel"] == "torchao"
    assert quant.expected_weights_bytes(
        tiny["packed"].model, torch.float32, "int8-dynamic", head=True
    ) == quant.weights_bytes(tiny["packed"].model)


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / sum(len(r) for r in a)


def test_packed_tiny_stays_as_close_to_float32_as_torchaos_kernel(tiny):
    """Both kernels quantize to the same integers; a one-ulp difference in a layer's input can round
    one activation to its other int8 neighbour, so their tokens may differ where fp32's were a near
    tie: measured on the real BBH questions (BENCHMARKS.md), here on three prompts and the logits."""
    tokens = {
        k: [r.token_ids for r in lm.generate(PROMPTS, batch_size=3, **DECODE)] for k, lm in tiny.items()
    }
    assert agreement(tokens["packed"], tokens["fp32"]) >= 0.9
    assert agreement(tokens["packed"], tokens["fp32"]) >= agreement(tokens["torchao"], tokens["fp32"]) - 0.05
    ids = torch.tensor([tiny["fp32"].tokenizer.encode(p, add_special_tokens=False)[:5] for p in PROMPTS])
    full, packed, torchao = (tiny[k].logits(ids) for k in ("fp32", "packed", "torchao"))
    assert (full.argmax(-1) == packed.argmax(-1)).float().mean() >= 0.9
    assert (packed - full).abs().max() <= max(0.05 * full.abs().max(), 1.5 * (torchao - full).abs().max())


def test_a_batch_of_requests_gets_the_tokens_each_gets_alone(tiny):
    lm = tiny["packed"]
    alone = [lm.generate([p], **DECODE)[0].token_ids for p in PROMPTS]
    assert [r.token_ids for r in lm.generate(PROMPTS, batch_size=3, **DECODE)] == alone


def test_without_onednn_torchaos_kernel_runs(monkeypatch):
    from torchao.quantization import Int8Tensor

    monkeypatch.setattr("caidllm.models.cpu_int8.available", lambda: False)
    lm = caidllm.load("tiny", device="cpu", dtype="float32", quantize="int8-dynamic")
    assert isinstance(lm.model.model.transformer.blocks[0].q_proj.weight, Int8Tensor)
    assert quant.quantization_info(lm)["quantization_kernel"] == "torchao"
    assert quant.expected_weights_bytes(lm.model, torch.float32, "int8-dynamic") == quant.weights_bytes(
        lm.model
    )


def test_cuda_sizes_keep_torchaos_layout():
    meta = caidllm.load(
        "random:llada-8b?n_layers=2&d_model=128&n_heads=2&n_kv_heads=2&mlp_hidden_size=256&vocab_size=1024",
        device="meta",
    ).model
    cpu = quant.expected_weights_bytes(meta, torch.float32, "int8-dynamic", device_type="cpu")
    cuda = quant.expected_weights_bytes(meta, torch.float32, "int8-dynamic", device_type="cuda")
    assert cuda > cpu or not cpu_int8().available()  # torchao's zero point per row on CUDA


def test_compile_keeps_torchaos_kernel():
    """Inductor cannot lower oneDNN's packed weight: a plan for --compile leaves torchao's tensors."""
    from torchao.quantization import Int8Tensor

    cpu_int8()
    for pack, kind in ((False, Int8Tensor), (True, cpu_int8().OnednnInt8Weight)):
        linear = nn.Linear(64, 32, bias=False)
        quant.quantize_module(linear, quant.QUANTIZATIONS["int8-dynamic"], torch.device("cpu"), pack=pack)
        assert isinstance(linear.weight, kind)


@pytest.mark.parametrize("family", ["llada2", "llada-moe", "sdar-moe"])
def test_mixture_of_experts_packs_each_expert_and_predicts_its_bytes(family):
    from test_moe_kernels import RANDOM

    kernels = cpu_int8()
    lm = caidllm.load(RANDOM[family], device="cpu", dtype="float32", quantize="int8-dynamic")
    experts = [m.weight for n, m in lm.model.named_modules() if ".experts." in n and isinstance(m, nn.Linear)]
    assert experts and all(isinstance(w, kernels.OnednnInt8Weight) for w in experts)
    meta = caidllm.load(RANDOM[family], device="meta")
    assert quant.expected_weights_bytes(meta.model, torch.float32, "int8-dynamic") == quant.weights_bytes(
        lm.model
    )
    with without_packing():
        reference = caidllm.load(RANDOM[family], device="cpu", dtype="float32", quantize="int8-dynamic")
    ids = torch.arange(3, 19)[None]
    full = caidllm.load(RANDOM[family], device="cpu", dtype="float32").logits(ids)
    packed, torchao = lm.logits(ids), reference.logits(ids)
    assert (packed - full).abs().max() <= max(0.05 * full.abs().max(), 1.5 * (torchao - full).abs().max())


def test_int4_with_its_head_on_a_cpu_quantizes_the_head_int8_dynamic():
    """torch's CPU int4 kernel runs a 126k-row head 7x slower than bfloat16: the head is int8-dynamic."""
    kernels = cpu_int8()
    lm = caidllm.load("tiny", device="cpu", dtype="bfloat16", quantize="int4", quantize_head=True)
    t = lm.model.model.transformer
    assert isinstance(t.ff_out.weight, kernels.OnednnInt8Weight)
    assert not isinstance(t.blocks[0].q_proj.weight, kernels.OnednnInt8Weight)  # the layers stay int4
    info = quant.quantization_info(lm)
    assert info["quantization"] == "int4" and info["head_quantization"] == "int8-dynamic"
    assert quant.expected_weights_bytes(lm.model, torch.bfloat16, "int4", head=True) == quant.weights_bytes(
        lm.model
    )
    assert quant.QUANTIZATIONS["int4"].for_head("cuda").name == "int4"  # tinygemm's head on CUDA
    bf16 = caidllm.load("tiny", device="cpu", dtype="bfloat16")
    ids = torch.tensor([bf16.tokenizer.encode(p, add_special_tokens=False)[:5] for p in PROMPTS])
    full, quantized = bf16.logits(ids), lm.logits(ids)
    assert (full.argmax(-1) == quantized.argmax(-1)).float().mean() >= 0.9
    assert lm.generate(PROMPTS[:1], **DECODE)[0].text.strip()


def test_caidllm_models_names_the_heads_scheme_and_its_bytes(capsys, monkeypatch):
    import json

    from caidllm.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # load's default device: this CPU
    small = (
        "random:llada-8b?n_layers=2&d_model=128&n_heads=2&n_kv_heads=2&mlp_hidden_size=256&vocab_size=1024"
    )
    assert main(["models", "--model", small, "--quantize", "int4", "--quantize-head"]) == 0
    assert "int4 linear layers and int8-dynamic head" in capsys.readouterr().out
    assert main(["models", "--model", small, "--quantize", "int4", "--quantize-head", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)
    loaded = caidllm.load(small, device="cpu", dtype="bfloat16", quantize="int4", quantize_head=True)
    assert memory["head_quantization"] == "int8-dynamic" and memory["weights_bytes"] == quant.weights_bytes(
        loaded.model
    )


def test_weights_this_kernel_does_not_compute_the_same_way_stay_torchaos():
    from torchao.quantization import Int8Tensor, Int8WeightOnlyConfig, quantize_

    kernels = cpu_int8()
    weight_only = nn.Linear(64, 32, bias=False)
    quantize_(weight_only, Int8WeightOnlyConfig())  # activations stay float: not this kernel's numbers
    plain = nn.Linear(64, 32, bias=False)
    kernels.pack_int8_dynamic(nn.Sequential(weight_only, plain))
    assert isinstance(weight_only.weight, Int8Tensor) and type(plain.weight) is nn.Parameter


def test_a_load_with_compile_keeps_torchaos_tensors(monkeypatch):
    from torchao.quantization import Int8Tensor

    cpu_int8()
    # no compiling here:
    monkeypatch.setattr("caidllm.models.compiled.check_quantized_compile", lambda *a: None)
    monkeypatch.setattr("caidllm.models.compiled.enable_compile", lambda lm: None)  # only what load() packs
    lm = caidllm.load("tiny", device="cpu", dtype="float32", quantize="int8-dynamic", compile=True)
    assert isinstance(lm.model.model.transformer.blocks[0].q_proj.weight, Int8Tensor)
    assert quant.quantization_info(lm)["quantization_kernel"] == "torchao"


def test_compile_later_on_a_packed_model_is_refused_with_one_line(monkeypatch):
    """generate(compile=True) on a model loaded packed: Inductor cannot lower oneDNN's packed
    weight (it crashed mid-decode with an InductorError and left the model compiled); refused
    before anything changes, naming the way that works (load(..., compile=True))."""
    from caidllm.errors import InputError

    cpu_int8()
    # no compiling here
    monkeypatch.setattr("caidllm.models.compiled.check_quantized_compile", lambda *a: None)
    lm = caidllm.load("tiny", device="cpu", dtype="float32", quantize="int8-dynamic")
    with pytest.raises(InputError, match=r"packed.*load\(\.\.\., compile=True\)"):
        lm.generate(PROMPTS[:1], compile=True, **DECODE)
    assert not lm.compiled


def test_a_bias_passed_by_keyword_is_added():
    """F.linear(x, w, bias=b) on a packed weight: the bias came in kwargs and was dropped silently."""
    linear = packed_int8_linear(64, 32, bias=True, seed=2)
    x = torch.randn(3, 64)
    positional = torch.nn.functional.linear(x, linear.weight, linear.bias)
    assert torch.equal(torch.nn.functional.linear(x, linear.weight, bias=linear.bias), positional)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_activations_quantize_to_torchaos_integers_and_scales(dtype):
    """torchao divides the row's max by 127.5 in the model dtype (bf16: a scale rounded to bf16),
    then quantizes in float32; computing the scale in float32 instead gave other integers for
    about 6% of a bf16 activation's values, not torchao's as the docs claim."""
    from torchao.quantization import Int8Tensor

    kernels = cpu_int8()
    linear = torchao_int8_dynamic(nn.Linear(256, 64).to(dtype))
    kwargs = linear.weight.act_quant_kwargs
    torch.manual_seed(3)
    x = torch.randn(50, 256, dtype=dtype) * torch.rand(50, 1, dtype=dtype) * 10
    x[0] *= 1e-6  # a scale under float32's eps: clamped as torchao clamps it
    expected = Int8Tensor.from_hp(x, kwargs.granularity, mapping_type=kwargs.mapping_type)
    values, scale = kernels.quantize_per_token(x)
    assert torch.equal(values, expected.qdata)
    assert torch.equal(scale.reshape(-1), expected.scale.float().reshape(-1))


def test_int4_with_its_head_reports_the_heads_packed_kernel():
    """int4 + --quantize-head on a CPU: the head runs oneDNN's int8 matmul, the layers torchao's int4;
    quantization_kernel said only "torchao"."""
    cpu_int8()
    lm = caidllm.load("tiny", device="cpu", dtype="bfloat16", quantize="int4", quantize_head=True)
    assert quant.quantization_info(lm)["quantization_kernel"] == "torchao; head: onednn int8 (packed at load)"
    lm = caidllm.load("tiny", device="cpu", dtype="bfloat16", quantize="int4")
    assert quant.quantization_info(lm)["quantization_kernel"] == "torchao"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llada2", "llada-moe", "sdar-moe"])
def test_packed_experts_run_together_with_the_per_expert_loops_numbers(family, dtype):
    """OnednnInt8Experts: the per-token work once over all rows, the same numbers as each expert
    run alone (ExpertList over the same packed weights), with experts that get no row too."""
    from caidllm.models.moe import MoEFeedForward
    from caidllm.models.moe_experts import ExpertList
    from test_moe_kernels import RANDOM

    kernels = cpu_int8()
    lm = caidllm.load(RANDOM[family], device="cpu", dtype=dtype, quantize="int8-dynamic")
    layers = [m for m in lm.model.modules() if isinstance(m, MoEFeedForward)]
    assert layers and all(isinstance(m.experts, kernels.OnednnInt8Experts) for m in layers)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in lm.model.state_dict()
    canvases = [
        torch.randint(3, 500, (2, 40), generator=torch.Generator().manual_seed(0)),
        torch.tensor([[7]]),
    ]
    together = [lm.logits(ids) for ids in canvases]
    block = {"sdar-moe": 4}.get(family, 32)  # LLaDA2 decodes in blocks of 32, SDAR in blocks of 4
    options = dict(gen_length=32, block_length=block, steps=8)
    tokens = [r.token_ids for r in lm.generate(["hello", "two plus two"], **options)]
    alone = [lm.generate([p], **options)[0].token_ids for p in ("hello", "two plus two")]
    assert alone == tokens  # batch invariance
    nothing = layers[0].experts.run_rows(torch.zeros(0, 64, dtype=lm.dtype), [0] * 16)
    assert nothing.shape == (0, 64) and nothing.dtype == lm.dtype
    for m in layers:
        m.experts = ExpertList(list(m.experts))
    for ids, expected in zip(canvases, together):
        assert torch.equal(lm.logits(ids), expected)
    assert [r.token_ids for r in lm.generate(["hello", "two plus two"], **options)] == tokens


def test_tensor_parallel_refuses_packed_experts_before_touching_them():
    """--tp's expert sharding slices stacked experts only: a packed MoE model (OnednnInt8Experts) is
    refused by name, through the API as through the CLI, and left whole and running."""
    from caidllm.errors import InputError
    from caidllm.models.moe import MoEFeedForward
    from caidllm.parallel.mesh import TPGroup
    from caidllm.parallel.sharding import shard_model
    from test_moe_kernels import RANDOM

    kernels = cpu_int8()
    lm = caidllm.load(RANDOM["sdar-moe"], device="cpu", dtype="float32", quantize="int8-dynamic")
    ids = torch.arange(3, 19)[None]
    before = lm.logits(ids)
    with pytest.raises(
        InputError, match="--tp with --quantize int8-dynamic: sharding quantized weights is not supported"
    ):
        shard_model(lm, TPGroup(rank=0, size=2))
    layers = [m for m in lm.model.modules() if isinstance(m, MoEFeedForward)]
    assert all(
        isinstance(m.experts, kernels.OnednnInt8Experts) and m.experts.num_experts == 16 for m in layers
    )
    assert torch.equal(lm.logits(ids), before)
