"""Quantized models copy and save like any torch module. oneDNN's packed int8 weight
(models/cpu_int8.py) is opaque, without storage: deepcopy and torch.save copy its int8 values and
scales instead and repack as they rebuild. deepcopy, torch.save of the module and a state_dict
round trip into a freshly quantized model give the same logits and batch-invariant tokens, for
int8-dynamic (packed), int4 (torchao's tensors, its head int8-dynamic) and quantized experts;
the model holds the packed form only, before and after."""

import copy
import io

import pytest
import torch
from torch import nn

import caidllm
from caidllm.models import quantize as quant
from caidllm.models.random_init import build_random

pytestmark = pytest.mark.skipif(quant.torchao_version() is None, reason="torchao is not installed")
PROMPTS = ["not ( True ) and ( True ) is", "True or False and not True is"]
DECODE = dict(method="fastdllm", gen_length=16, block_length=8)
LOADED = {  # (name, dtype, quantize, quantize_head)
    "int8-dynamic": ("tiny", "float32", "int8-dynamic", True),
    "int4": ("tiny", "bfloat16", "int4", True),
    "moe-int8-dynamic": ("tiny-moe", "float32", "int8-dynamic", False),
    "int8": ("tiny", "float32", "int8", False),  # torchao's tensors only
    "moe-int4": ("tiny-moe", "bfloat16", "int4", False),
}
DENSE = "random:llada-8b?n_layers=2&d_model=64&n_heads=2&n_kv_heads=2&mlp_hidden_size=128&vocab_size=512"
MOE = (
    "random:llada2-mini?num_hidden_layers=2&hidden_size=64&num_attention_heads=4&num_key_value_heads=2"
    "&head_dim=16&rotary_dim=8&intermediate_size=128&moe_intermediate_size=32&num_experts=16&vocab_size=512"
)
RANDOM = {  # (shape, dtype, quantize, quantize_head, block length): one draw's state loads into another's
    "int8-dynamic": (DENSE, torch.float32, "int8-dynamic", True, 8),
    "int4": (DENSE, torch.bfloat16, "int4", True, 8),
    "moe-int8-dynamic": (MOE, torch.float32, "int8-dynamic", False, 32),
}


def kernels():
    from caidllm.models import cpu_int8

    if not cpu_int8.available():
        pytest.skip("this torch has no oneDNN")
    return cpu_int8


def packed_weights(model: nn.Module) -> list:
    return [p for p in model.parameters() if isinstance(p, kernels().OnednnInt8Weight)]


@pytest.fixture(scope="module", params=list(LOADED))
def loaded(request):
    kernels()
    name, dtype, quantize, head = LOADED[request.param]
    return caidllm.load(name, device="cpu", dtype=dtype, quantize=quantize, quantize_head=head)


def ids_of(lm) -> torch.Tensor:
    return torch.tensor([lm.tokenizer.encode(p, add_special_tokens=False)[:6] for p in PROMPTS])


def saved_and_loaded(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def with_model(lm, model: nn.Module):
    twin = copy.copy(lm)
    twin.model = model
    return twin


def test_a_packed_weight_saves_its_int8_values_and_scales_and_repacks():
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=True)
    quant.quantize_module(linear, quant.QUANTIZATIONS["int8-dynamic"], torch.device("cpu"), pack=False)
    qdata, scale = linear.weight.qdata.clone(), linear.weight.scale.clone()
    kernels().pack_int8_dynamic(linear)
    assert torch.equal(linear.weight.int8_data(), qdata)  # unpacked exactly
    unit = torch.ones(40)
    assert torch.equal(kernels()._identity_product(linear.weight.packed, unit, (40, 96), torch.int8), qdata)
    x = torch.randn(5, 96)
    expected = linear(x)
    for twin in (copy.deepcopy(linear), saved_and_loaded(linear, weights_only=False)):
        w = twin.weight
        assert (
            isinstance(w, kernels().OnednnInt8Weight) and isinstance(w, nn.Parameter) and not w.requires_grad
        )
        assert torch.equal(w.int8_data(), qdata) and torch.equal(w.scale, scale.reshape(-1).float())
        assert w.packed is not linear.weight.packed and torch.equal(twin(x), expected)
        assert w.scale.data_ptr() != linear.weight.scale.data_ptr()  # the copy's own scales
        assert dict(twin.named_parameters()).keys() == dict(linear.named_parameters()).keys()


def test_deepcopy_gives_the_same_logits_and_tokens(loaded):
    twin = copy.deepcopy(loaded)
    assert twin.model is not loaded.model and quant.is_quantized(twin.model)
    assert len(packed_weights(twin.model)) == len(packed_weights(loaded.model))
    assert not {id(w.packed) for w in packed_weights(twin.model)} & {
        id(w.packed) for w in packed_weights(loaded.model)
    }
    ids = ids_of(loaded)
    assert torch.equal(twin.logits(ids), loaded.logits(ids))
    alone = [twin.generate([p], **DECODE)[0].token_ids for p in PROMPTS]
    batched = [r.token_ids for r in loaded.generate(PROMPTS, batch_size=2, **DECODE)]
    assert alone == batched  # the copy alone = the original batched


def test_torch_save_of_the_module_gives_the_same_logits(loaded):
    twin = with_model(loaded, saved_and_loaded(loaded.model, weights_only=False))
    assert quant.is_quantized(twin.model) and len(packed_weights(twin.model)) == len(
        packed_weights(loaded.model)
    )
    ids = ids_of(loaded)
    assert torch.equal(twin.logits(ids), loaded.logits(ids))
    assert quant.weights_bytes(twin.model) == quant.weights_bytes(loaded.model)


@pytest.mark.parametrize("kind", list(RANDOM))
def test_a_state_dict_loads_into_a_freshly_quantized_model(kind):
    kernels()
    shape, dtype, quantize, head, block = RANDOM[kind]
    source, target = (
        build_random(shape, torch.device("cpu"), dtype, seed=seed, quantize=quantize, quantize_head=head)
        for seed in (0, 1)
    )
    ids = torch.arange(3, 19).reshape(2, 8)
    assert not torch.equal(target.logits(ids), source.logits(ids))
    state = saved_and_loaded(source.model.state_dict())  # torch.load's default: weights_only=True
    before = quant.weights_bytes(target.model)
    result = target.model.load_state_dict(state)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(target.logits(ids), source.logits(ids))
    assert quant.weights_bytes(target.model) == before  # still the packed form only
    options = dict(method="fastdllm", gen_length=32, block_length=block)
    batched = [r.token_ids for r in target.generate(["hello", "two plus two"], **options)]
    assert batched == [source.generate([p], **options)[0].token_ids for p in ["hello", "two plus two"]]


def test_the_model_holds_one_form_of_each_weight(loaded):
    """No plain int8 copy beside the packed one: a packed weight's bytes are its packed data and scales."""
    for w in packed_weights(loaded.model):
        names, _ = w.__tensor_flatten__()
        assert names == ["packed", "scale"] and quant.tensor_bytes(w) == w.numel() + 4 * w.shape[0]
    assert not any(
        isinstance(v, torch.Tensor)
        for w in packed_weights(loaded.model)
        for v in w.__dict__.values()
        if v is not w.packed and v is not w.scale
    )


def test_torchaos_int8_dynamic_state_loads_into_a_packed_model_and_other_forms_are_refused():
    """A state saved from torchao's tensors (a --compile load keeps them) is repacked as it loads;
    a packed state into a full-precision model, or a full-precision one into a packed model, is
    refused naming both forms (load_state_dict's one RuntimeError)."""
    kernels()
    cpu = torch.device("cpu")
    shape, dtype, quantize, head, _ = RANDOM["int8-dynamic"]
    torchao = build_random(shape, cpu, dtype, seed=0, quantize=quantize, quantize_head=head, pack=False)
    packed = build_random(shape, cpu, dtype, seed=1, quantize=quantize, quantize_head=head)
    ids = torch.arange(3, 19).reshape(2, 8)
    expected = build_random(shape, cpu, dtype, seed=0, quantize=quantize, quantize_head=head).logits(ids)
    packed.model.load_state_dict(torchao.model.state_dict())
    assert len(packed_weights(packed.model)) > 0 and torch.equal(packed.logits(ids), expected)
    full = build_random(shape, cpu, dtype, seed=0)
    with pytest.raises(
        RuntimeError,
        match=r"cannot copy a packed int8-dynamic weight \[64, 64\] into a "
        r"Parameter of torch.float32 \[64, 64\]",
    ):
        full.model.load_state_dict(packed.model.state_dict())
    with pytest.raises(RuntimeError, match=r"cannot copy a Tensor of torch.float32 \[64, 64\] into a packed"):
        packed.model.load_state_dict(build_random(shape, cpu, dtype, seed=2).model.state_dict())


class Crafted:
    """A file's object that torch.load(weights_only=True) rebuilds with cpu_int8.repacked and `args`."""

    def __init__(self, *args):
        self.args = args

    def __reduce_ex__(self, protocol):
        return kernels().repacked, self.args


QDATA = torch.randint(-128, 128, (40, 96), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
CRAFTED = {  # what a file gives repacked -> the refusal naming its problem
    "short scales": (
        (QDATA, torch.ones(3), torch.float32, {}),
        r"its scales are a Tensor of torch.float32 \[3\], not 40 floats",
    ),
    "integer dtype": (
        (QDATA, torch.ones(40), torch.int64, {}),
        "its activation dtype torch.int64 is not a floating",
    ),
    "a tensor over its packing": (
        (QDATA, torch.ones(40), torch.float32, {"packed": torch.zeros(2, 2)}),
        r"its other attributes \['packed'\] are not plain marks",
    ),
    "float weight": (
        (QDATA.float(), torch.ones(40), torch.float32, {}),
        r"its weight is a Tensor of torch.float32 \[40, 96\], not a 2-D int8 tensor",
    ),
}


@pytest.mark.parametrize("kind", list(CRAFTED))
def test_a_file_loaded_with_weights_only_builds_only_a_well_formed_packed_weight(kind):
    """oneDNN reads as many scales as the weight has rows, unchecked: a file giving fewer must not
    load (its forwards read past their end), nor one that overwrites the packed data or is not int8."""
    args, problem = CRAFTED[kind]
    with pytest.raises(ValueError, match="cannot rebuild a saved packed int8-dynamic weight: " + problem):
        saved_and_loaded({"w": Crafted(*args)})
    good = saved_and_loaded({"w": Crafted(QDATA, torch.rand(40) + 0.1, torch.float32, {"_is_param": True})})[
        "w"
    ]
    assert isinstance(good, nn.Parameter) and torch.equal(good.int8_data(), QDATA)


@pytest.mark.parametrize("kind", ["int8-dynamic", "int4"])
def test_a_packed_state_loads_into_torchaos_tensors(kind):
    """The other way: a state saved from a packed model loads into one that keeps torchao's tensors (what
    load(..., compile=True) quantizes), unpacked as it loads: the logits of the source's draw quantized
    that way; into another
    quantization (torchao's weight-only int8) it is refused naming both forms."""
    kernels()
    cpu = torch.device("cpu")
    shape, dtype, quantize, head, _ = RANDOM[kind]
    source = build_random(shape, cpu, dtype, seed=0, quantize=quantize, quantize_head=head)
    target = build_random(shape, cpu, dtype, seed=1, quantize=quantize, quantize_head=head, pack=False)
    assert packed_weights(source.model) and not packed_weights(target.model)
    ids = torch.arange(3, 19).reshape(2, 8)
    before = quant.weights_bytes(target.model)
    result = target.model.load_state_dict(saved_and_loaded(source.model.state_dict()))
    assert not result.missing_keys and not result.unexpected_keys and not packed_weights(target.model)
    unpacked_source = build_random(
        shape, cpu, dtype, seed=0, quantize=quantize, quantize_head=head, pack=False
    )
    # torchao's kernel, the source's weights
    assert torch.equal(target.logits(ids), unpacked_source.logits(ids))
    assert quant.weights_bytes(target.model) == before
    weight_only = build_random(shape, cpu, dtype, seed=1, quantize="int8", quantize_head=head)
    with pytest.raises(
        RuntimeError, match=r"cannot copy a packed int8-dynamic weight \[\d+, \d+\] into a Int8Tensor"
    ):
        weight_only.model.load_state_dict(source.model.state_dict())
