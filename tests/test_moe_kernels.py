"""The MoE kernels (models/moe_kernels.py) against the per-expert loop, the reference: the same
layer outputs and model logits to 1e-5 in fp32 and the same tokens, on random LLaDA2, LLaDA-MoE
and SDAR-MoE shapes; batch invariance; no value read on the host (they run on meta tensors);
the stacked experts' checkpoint names, loading (sharded too) and its errors; quantization."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import caidllm
from caidllm.errors import InputError, ModelLoadError
from caidllm.models import moe_kernels, moe_native
from caidllm.models.moe import MoEFeedForward, set_moe_kernel
from caidllm.models.moe_experts import ExpertList, StackedExperts
from caidllm.models.moe_kernels import (
    MOE_KERNELS,
    READS_COUNTS,
    combine,
    pick_kernel,
    run_experts,
    sort_pairs,
)
from helpers.checkpoint_files import write_checkpoint
from test_moe import LLADA2_LIKE, LLADA_MOE_LIKE, QWEN3_MOE_LIKE, random_moe

FIELDS = {"llada2": LLADA2_LIKE, "llada-moe": LLADA_MOE_LIKE, "sdar-moe": QWEN3_MOE_LIKE}
# The native kernel needs a C++ compiler and AVX-512 (models/moe_native.py): skipped, with the reason, without
# them.
NATIVE_MISSING = moe_native.why_unavailable(torch.float32)
FAST = [
    pytest.param(k, marks=pytest.mark.skipif(bool(NATIVE_MISSING), reason=f"native: {NATIVE_MISSING}"))
    if k == "native"
    else k
    for k in MOE_KERNELS
    if k != "loop"
]
RANDOM = {  # small random shapes of the three MoE families
    "llada2": "random:llada2-mini?num_hidden_layers=2&hidden_size=64&num_attention_heads=4"
    "&num_key_value_heads=2"
    "&head_dim=16&rotary_dim=8&intermediate_size=128&moe_intermediate_size=32&num_experts=16&vocab_size=512",
    "llada-moe": "random:llada-moe-7b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4"
    "&num_key_value_heads=4"
    "&expert_intermediate_size=32&dense_intermediate_size=128&num_experts=16&vocab_size=512",
    "sdar-moe": "random:sdar-30b-a3b?num_hidden_layers=2&hidden_size=64&num_attention_heads=4"
    "&num_key_value_heads=2"
    "&head_dim=16&intermediate_size=128&moe_intermediate_size=32&num_experts=16&vocab_size=512",
}


@pytest.mark.parametrize("kernel", FAST)
@pytest.mark.parametrize("family", FIELDS)
def test_each_kernel_equals_the_loop(family, kernel):
    moe = random_moe(**FIELDS[family])
    x = torch.randn(3, 11, 16)
    with torch.no_grad():
        moe.kernel = "loop"
        expected = moe(x)
        moe.kernel = kernel
        got = moe(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", FAST)
def test_each_kernel_in_bfloat16(kernel):
    if kernel == "native" and moe_native.why_unavailable(torch.bfloat16):
        pytest.skip(f"native in bf16: {moe_native.why_unavailable(torch.bfloat16)}")
    moe = random_moe(**LLADA2_LIKE).to(torch.bfloat16)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        moe.kernel = "loop"
        expected = moe(x)
        moe.kernel = kernel
        got = moe(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kernel", FAST)
def test_a_token_does_not_depend_on_its_batch(kernel):
    moe = random_moe(**LLADA_MOE_LIKE)
    moe.kernel = kernel
    x = torch.randn(9, 16)
    with torch.no_grad():
        together = moe(x)
        alone = torch.stack([moe(x[i : i + 1])[0] for i in range(len(x))])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-6)


def test_each_token_sums_its_choices_in_choice_order():
    """combine adds a token's k weighted outputs in the order they were chosen (the loop's fp32
    arithmetic, and one fixed order on every device), not in the experts' sorted order."""
    chosen = torch.tensor([[3, 0, 1]])  # sorted by expert: choices 1, 2, 0
    weights = torch.ones(1, 3)
    by_choice = torch.tensor([[1e8], [-1e8], [1.0]])  # (1e8 - 1e8) + 1 = 1; sorted, (-1e8 + 1) + 1e8 = 0
    pairs = sort_pairs(chosen, num_experts=4)
    got = combine(torch.zeros(1, 1), pairs, by_choice[pairs.order], weights)
    assert got.item() == 1.0


@pytest.mark.parametrize("kernel", [k for k in MOE_KERNELS if k not in READS_COUNTS])
def test_no_value_is_read_on_the_host(kernel):
    """On meta tensors a .item() / .tolist() / .cpu() of the counts would raise: the kernels never read
    one."""
    cfg = LLADA2_LIKE
    with torch.device("meta"):  # bfloat16: grouped_mm's meta kernel checks dtypes as the CUDA one does
        experts = StackedExperts(
            cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
        ).bfloat16()
        x = torch.empty(7, cfg["hidden_size"], dtype=torch.bfloat16)
        chosen = torch.empty(7, cfg["num_experts_per_tok"], dtype=torch.long)
        weights = torch.empty(7, cfg["num_experts_per_tok"])
    out = run_experts(experts, kernel, x, chosen, weights)
    assert out.shape == (7, cfg["hidden_size"]) and out.is_meta
    with pytest.raises(Exception):
        run_experts(experts, "loop", x, chosen, weights)  # the reference reads the counts


@pytest.fixture
def without_native(monkeypatch):
    """auto as it chooses where the native kernel is not picked (more than one thread, say)."""
    monkeypatch.setattr(moe_kernels, "NATIVE_MAX_THREADS", 0)


def test_auto_picks_grouped_on_a_cpu_and_the_loop_for_quantized_experts(without_native):
    moe = random_moe(**LLADA2_LIKE)
    assert pick_kernel(moe.experts, torch.zeros(4, 16)) == "grouped"
    assert pick_kernel(ExpertList(), torch.zeros(4, 16)) == "loop"


@pytest.mark.skipif(moe_kernels._ONEDNN_LINEAR is None, reason="torch built without oneDNN")
def test_auto_picks_sized_on_a_cpu_in_bf16_and_in_fp32_once_each_expert_gets_8_rows(without_native):
    experts = random_moe(**LLADA2_LIKE).experts  # 16 experts, 4 choices per token: 32 tokens = 8 rows each
    assert pick_kernel(experts, torch.zeros(32, 16), choices=4) == "sized"
    assert pick_kernel(experts, torch.zeros(31, 16), choices=4) == "grouped"
    # bf16 runs sized at every count (measured no slower than grouped from 4 tokens, BENCHMARKS.md)
    assert pick_kernel(experts, torch.zeros(32, 16, dtype=torch.bfloat16), choices=4) == "sized"
    assert pick_kernel(experts, torch.zeros(1, 16, dtype=torch.bfloat16), choices=4) == "sized"


@pytest.mark.skipif(moe_kernels._ONEDNN_LINEAR is None, reason="torch built without oneDNN")
def test_sized_runs_fp32_experts_of_3_rows_or_more_through_onednn(monkeypatch):
    """Experts with 1-2 rows take F.linear, the others oneDNN; the output is the loop's either way."""
    moe = random_moe(**LLADA2_LIKE)
    rows = []
    real = moe_kernels._ONEDNN_LINEAR
    monkeypatch.setattr(moe_kernels, "_ONEDNN_LINEAR", lambda x, *a: rows.append(x.shape[0]) or real(x, *a))
    x = torch.randn(40, 16)
    with torch.no_grad():
        moe.kernel = "loop"
        expected = moe(x)
        moe.kernel = "sized"
        got = moe(x)
    counts = torch.bincount(moe.gate(x)[0].flatten(), minlength=16)
    assert sorted(rows) == sorted(3 * [int(c) for c in counts if c >= 3])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "dtype, widths, kernel",
    [
        (torch.float32, dict(hidden_size=16, moe_intermediate_size=5), "loop"),
        (torch.bfloat16, dict(hidden_size=12, moe_intermediate_size=8), "sized"),
    ],
)
def test_auto_runs_widths_grouped_mm_cannot(dtype, widths, kernel, without_native):
    """grouped_mm needs each width a whole multiple of 16 bytes: auto runs another kernel on the others
    (it raised): the loop in fp32 below 8 rows per expert, sized in bf16 (no rule on widths)."""
    moe = random_moe(**{**QWEN3_MOE_LIKE, **widths}).to(dtype)
    x = torch.randn(5, widths["hidden_size"], dtype=dtype)
    assert pick_kernel(moe.experts, x, choices=4) == kernel
    with torch.no_grad():
        got = moe(x)
        moe.kernel = "loop"
        # sized's bf16 matmuls round as torch.mm does, not F.linear
        tolerance = 0 if kernel == "loop" else 2e-2
        torch.testing.assert_close(got, moe(x), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", RANDOM)
def test_models_give_the_loops_logits_and_tokens(family, dtype):
    """fp32: every kernel, logits to 1e-5. bf16: native (its roundings the loop's, its sums in another
    order), logits within bf16's rounding, and the same tokens."""
    if dtype == "float32":
        kernels = [k for k in MOE_KERNELS if k != "loop" and not (k == "native" and NATIVE_MISSING)]
        tolerance = (1e-5, 1e-5)
    elif moe_native.why_unavailable(torch.bfloat16):
        pytest.skip(f"native in bf16: {moe_native.why_unavailable(torch.bfloat16)}")
    else:
        kernels, tolerance = ["native"], (0.1, 0.05)
    lm = caidllm.load(RANDOM[family], device="cpu", dtype=dtype, moe_kernel="loop")
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    block = {"llada2": 32, "llada-moe": 16, "sdar-moe": 4}[family]
    options = dict(method="fastdllm", gen_length=32, block_length=block)
    with torch.no_grad():
        expected = lm.logits(ids)
        tokens = [r.token_ids for r in lm.generate(["hello", "two plus two"], **options)]
        for kernel in kernels:
            set_moe_kernel(lm.model, kernel)
            torch.testing.assert_close(lm.logits(ids), expected, atol=tolerance[0], rtol=tolerance[1])
            assert [r.token_ids for r in lm.generate(["hello", "two plus two"], **options)] == tokens
            alone = [lm.generate([p], **options)[0].token_ids for p in ("hello", "two plus two")]
            assert alone == tokens  # batch invariance


def test_state_dict_has_the_official_names_and_loads_back():
    moe = random_moe(**LLADA2_LIKE)
    state = moe.state_dict()
    assert state["experts.3.up_proj.weight"].shape == (8, 16) and "experts.gate_proj" not in state
    torch.testing.assert_close(state["experts.3.up_proj.weight"], moe.experts.up_proj[3])
    other = random_moe(seed=5, **LLADA2_LIKE)
    other.load_state_dict(state)
    assert torch.equal(other.experts.down_proj, moe.experts.down_proj)
    state.pop("experts.2.down_proj.weight")
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*experts.2.down_proj.weight"):
        other.load_state_dict(state)
    state["experts.2.down_proj.weight"] = torch.zeros(16, 9)
    with pytest.raises(RuntimeError, match=r"size mismatch for experts.2.down_proj.weight"):
        other.load_state_dict(state)
    state["experts.2.down_proj.weight"] = torch.zeros(16, 8)
    state["experts.16.down_proj.weight"] = torch.zeros(16, 8)
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*experts.16.down_proj.weight"):
        other.load_state_dict(state)


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("moe"), "inclusionAI/LLaDA-MoE-7B-A1B-Base", sharded=True)


def test_a_checkpoint_loads_into_the_stacks(moe_folder):
    lm = caidllm.load(moe_folder, device="cpu", dtype="float32")
    tensors = {}
    for file in moe_folder.glob("*.safetensors"):
        tensors.update(load_file(str(file)))
    experts = lm.model.model.layers[1].mlp.experts
    assert isinstance(experts, StackedExperts)
    for e in range(experts.num_experts):
        assert torch.equal(experts.gate_proj[e], tensors[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"])
        assert torch.equal(experts.down_proj[e], tensors[f"model.layers.1.mlp.experts.{e}.down_proj.weight"])


def test_experts_scattered_over_shards_in_any_order_load_the_same(moe_folder, tmp_path):
    """Each layer's experts spread over three shards, every shard in a shuffled order: the stacks
    (and the int8 experts unstacked from them) hold what the two-shard folder gives."""
    import random
    import shutil

    tensors = {}
    for file in moe_folder.glob("*.safetensors"):
        tensors.update(load_file(str(file)))
    names = sorted(tensors)
    random.Random(0).shuffle(names)
    scattered = shutil.copytree(moe_folder, tmp_path / moe_folder.name)
    weight_map = {}
    for file in scattered.glob("*.safetensors"):
        file.unlink()
    for i in range(3):
        file = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({n: tensors[n] for n in names[i::3]}, str(scattered / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in reversed(names[i::3])})
    (scattered / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    ids = torch.randint(0, 30, (1, 12), generator=torch.Generator().manual_seed(0))
    for quantize in (None, "int8") if _has_torchao() else (None,):
        with torch.no_grad():
            expected = caidllm.load(moe_folder, device="cpu", dtype="float32", quantize=quantize).logits(ids)
            got = caidllm.load(scattered, device="cpu", dtype="float32", quantize=quantize).logits(ids)
        assert torch.equal(got, expected), quantize


def _has_torchao() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


def _edit_shard(folder, name, change):
    for file in folder.glob("*.safetensors"):
        tensors = load_file(str(file))
        if name in tensors:
            change(tensors)
            save_file(tensors, str(file))
            return
    raise AssertionError(name)


def test_a_missing_or_misshaped_expert_tensor_is_named(moe_folder, tmp_path):
    import shutil

    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    broken = shutil.copytree(moe_folder, tmp_path / moe_folder.name)
    _edit_shard(broken, name, lambda t: t.update({name: t[name][:, :-1].contiguous()}))
    with pytest.raises(
        ModelLoadError, match=rf"tensor {name} in .* has shape \[16, 31\], expected \[16, 32\]"
    ):
        caidllm.load(broken, device="cpu")
    _edit_shard(broken, name, lambda t: t.pop(name))
    index = json.loads((broken / "model.safetensors.index.json").read_text())
    del index["weight_map"][name]
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=rf"missing from the checkpoint: {name}"):
        caidllm.load(broken, device="cpu")


def test_an_unknown_kernel_or_a_stacked_kernel_on_quantized_experts_is_refused():
    with pytest.raises(
        InputError,
        match="unknown moe_kernel 'fast'; expected one of auto, loop, grouped, sized, padded, native",
    ):
        caidllm.load(RANDOM["llada2"], device="cpu", moe_kernel="fast")
    with pytest.raises(InputError, match="moe_kernel 'grouped' runs stacked full-precision experts"):
        caidllm.load(RANDOM["llada2"], device="cpu", quantize="int8", moe_kernel="grouped")


def test_quantized_experts_run_one_at_a_time():
    pytest.importorskip("torchao")
    lm = caidllm.load(RANDOM["sdar-moe"], device="cpu", dtype="float32", quantize="int8")
    layer = next(m for m in lm.model.modules() if isinstance(m, MoEFeedForward))
    assert isinstance(layer.experts, ExpertList) and len(layer.experts) == 16
    assert {n for n, _ in layer.named_parameters()} >= {
        "experts.15.gate_proj.weight",
        "experts.0.down_proj.weight",
    }
    with pytest.raises(InputError, match="moe_kernel 'padded' runs stacked full-precision experts"):
        set_moe_kernel(lm.model, "padded")
    assert lm.generate(["hello"], method="fastdllm", gen_length=8, block_length=4)[0].nfe > 0


def test_quantized_experts_weigh_what_models_predicts():
    pytest.importorskip("torchao")
    from caidllm.models.quantize import expected_weights_bytes, weights_bytes

    meta = caidllm.load(RANDOM["llada2"], device="meta")
    loaded = caidllm.load(RANDOM["llada2"], device="cpu", dtype="float32", quantize="int8")
    assert expected_weights_bytes(meta.model, torch.float32, "int8") == weights_bytes(loaded.model)


def test_a_checkpoint_loads_quantized_layer_by_layer(moe_folder):
    pytest.importorskip("torchao")
    from caidllm.models.quantize import is_quantized

    full = caidllm.load(moe_folder, device="cpu", dtype="float32")
    lm = caidllm.load(moe_folder, device="cpu", dtype="float32", quantize="int8")
    layer = lm.model.model.layers[1].mlp
    assert isinstance(layer.experts, ExpertList) and all(is_quantized(e) for e in layer.experts)
    ids = torch.randint(0, 30, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # int8 weights: close to the full-precision logits, not equal
        torch.testing.assert_close(lm.logits(ids), full.logits(ids), atol=0.15, rtol=0.1)


def test_the_command_line_flag(capsys):
    from caidllm.cli import main

    argv = [
        "generate",
        "hi",
        "--model",
        RANDOM["llada2"],
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--gen-length",
        "32",
        "--block-length",
        "32",
        "--json",
    ]
    outputs = []
    for kernel in ("loop", "grouped"):
        assert main([*argv, "--moe-kernel", kernel]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outputs[0] == outputs[1]
    pytest.importorskip("torchao")
    assert main([*argv, "--moe-kernel", "grouped", "--quantize", "int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "caidllm: error: moe_kernel 'grouped' runs stacked full-precision"
    )


def test_tiny_moe_gives_the_loops_logits_and_tokens_by_every_cpu_kernel(without_native):
    """The shipped, trained tiny-moe (8 experts, top-2: a 40-token forward gives each expert 10
    rows on average, so auto runs sized, oneDNN, where it does not pick native): logits to 1e-5 of
    their largest magnitude (a trained model's reach about 17; oneDNN's fp32 sums differ from MKL's in the
    last bits, 2e-5 measured) and the llada2 decoder's exact tokens."""
    lm = caidllm.load("tiny-moe", device="cpu", moe_kernel="loop")
    ids = torch.tensor(
        [
            lm.encode_chat(
                "Question: Sherrie tells the truth. Vernell says Sherrie tells the truth. "
                "Alexis says Vernell lies. Michaela says Alexis tells the truth. "
                "Does Michaela tell the truth?"
            )[:40]
        ]
    )
    experts = lm.model.model.layers[1].mlp.experts
    assert (
        ids.shape[1] == 40
        and pick_kernel(experts, torch.zeros(40, lm.config.hidden_size), choices=2) == "sized"
    )
    options = dict(method="llada2", gen_length=16, block_length=8)
    with torch.no_grad():
        expected = lm.logits(ids)
        scale = max(1.0, expected.abs().max().item())
        tokens = lm.generate(["True and not not ( not False ) is"], **options)[0].token_ids
        for kernel in ("grouped", "sized", "auto", *(() if NATIVE_MISSING else ("native",))):
            set_moe_kernel(lm.model, kernel)
            torch.testing.assert_close(lm.logits(ids), expected, atol=1e-5 * scale, rtol=1e-5)
            assert lm.generate(["True and not not ( not False ) is"], **options)[0].token_ids == tokens


@pytest.mark.parametrize("kernel", ["sized", "auto"])
def test_training_gets_the_loops_gradients(kernel):
    """A training step (train/trainer.py builds MoE models with auto) at 8+ rows per expert runs
    sized on a CPU: oneDNN's linear has no autograd formula, so the experts got no gradient."""
    moe = random_moe(**LLADA2_LIKE)
    x = torch.randn(40, 16)
    grads = {}
    for name in ("loop", kernel):
        moe.kernel = name
        moe.zero_grad(set_to_none=True)
        inputs = x.clone().requires_grad_()
        moe(inputs).square().sum().backward()
        grads[name] = [inputs.grad, *(p.grad for p in moe.experts.parameters())]
    for got, expected in zip(grads[kernel], grads["loop"]):
        assert got is not None
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel", ["sized", "grouped"])
def test_quantizing_a_loaded_model_run_by_a_stacked_kernel_is_refused_first(kernel):
    """quantize_loaded unstacked the experts under a stacked-only kernel: the next forward died with
    AttributeError ('ExpertList' object has no attribute 'gate_proj'); now refused before any change."""
    pytest.importorskip("torchao")
    from caidllm.models.quantize import quantize_loaded

    lm = caidllm.load(RANDOM["llada2"], device="cpu", moe_kernel=kernel)
    with pytest.raises(InputError, match=f"moe_kernel '{kernel}' runs stacked full-precision experts"):
        quantize_loaded(lm, "int8")
    layer = next(m for m in lm.model.modules() if isinstance(m, MoEFeedForward))
    assert lm.quantization is None and isinstance(layer.experts, StackedExperts)
    set_moe_kernel(lm.model, "auto")
    quantize_loaded(lm, "int8")
    assert torch.isfinite(lm.logits(torch.tensor([[1, 2, 3]]))).all()  # the loop runs the quantized experts
