"""Every bad input to loading or to a forward pass gets a clear
ModelLoadError / InputError that names the problem."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import caidllm
from caidllm.errors import InputError, ModelLoadError
from caidllm.models import loading
from caidllm.models.modes import Dual, Full, Prefix


@pytest.fixture
def copy_of(tmp_path):
    """copy_of(folder) -> a scratch copy to break."""

    def make(folder):
        return shutil.copytree(folder, tmp_path / "ckpt")

    return make


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# ---- folders and files ----------------------------------------------------------


def test_missing_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        caidllm.load(tmp_path / "nowhere")


def test_file_instead_of_folder(llada_dir):
    with pytest.raises(ModelLoadError, match="is a file"):
        caidllm.load(llada_dir / "config.json")


def test_embedded_tiny(monkeypatch, tmp_path, llada_dir):
    monkeypatch.setitem(loading.EMBEDDED, "tiny", tmp_path / "absent")
    with pytest.raises(ModelLoadError, match="embedded model 'tiny' is not installed"):
        caidllm.load("tiny")
    monkeypatch.setitem(loading.EMBEDDED, "tiny", llada_dir)
    assert caidllm.load("tiny").config.family == "llada"


@pytest.mark.parametrize(
    "name, message",
    [
        ("config.json", "missing config file .*config.json"),
        ("tokenizer.json", "missing tokenizer file .*tokenizer.json"),
        ("model.safetensors", "expected model.safetensors or model.safetensors.index.json"),
    ],
)
def test_missing_file(copy_of, llada_dir, name, message):
    path = copy_of(llada_dir)
    (path / name).unlink()
    with pytest.raises(ModelLoadError, match=message):
        caidllm.load(path)


def test_unknown_architecture(copy_of, llada_dir):
    path = copy_of(llada_dir)
    edit_json(path / "config.json", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ModelLoadError, match="unknown model architecture.*GPT2LMHeadModel.*gpt2.*supported"):
        caidllm.load(path)


def test_unsupported_llada_setting(copy_of, llada_dir):
    path = copy_of(llada_dir)
    edit_json(path / "config.json", attention_layer_norm=True)
    with pytest.raises(ModelLoadError, match="attention_layer_norm=True"):
        caidllm.load(path)


def test_missing_config_field(copy_of, dream_dir):
    path = copy_of(dream_dir)
    edit_json(path / "config.json", num_attention_heads=None)
    with pytest.raises(ModelLoadError, match="missing required field 'num_attention_heads'"):
        caidllm.load(path)


def test_mask_id_from_the_tokenizer_when_config_has_none(copy_of, dream_dir, llada_dir):
    path = copy_of(dream_dir)
    official = caidllm.load(dream_dir, device="cpu", dtype="float32").config.mask_id
    edit_json(path / "config.json", mask_token_id=None)  # tokenizer_config.json still names <|mask|>
    assert caidllm.load(path, device="cpu", dtype="float32").config.mask_id == official
    shutil.rmtree(path)
    path = shutil.copytree(llada_dir, path)  # LLaDA's tokenizer_config.json names no mask token
    edit_json(path / "config.json", mask_token_id=None)
    with pytest.raises(ModelLoadError, match="no mask token: config.json has no mask_token_id"):
        caidllm.load(path)


def test_mask_ids_that_disagree_are_refused(copy_of, dream_dir):
    path = copy_of(dream_dir)
    edit_json(path / "tokenizer_config.json", mask_token="<|im_end|>")
    with pytest.raises(
        ModelLoadError,
        match="mask token ids disagree: config.json mask_token_id = 3, tokenizer_config.json mask_token = 2",
    ):
        caidllm.load(path)


def test_missing_shard(random_checkpoint, copy_of):
    path = copy_of(random_checkpoint("dream", sharded=True))
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="missing .*model-00002-of-00002.safetensors"):
        caidllm.load(path)


# ---- tensors ----------------------------------------------------------------------


def _rewrite_weights(path, change):
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    change(tensors)
    save_file(tensors, str(file))


def test_unexpected_tensor(copy_of, llada_dir):
    path = copy_of(llada_dir)
    _rewrite_weights(path, lambda t: t.update({"model.transformer.blocks.0.q_norm.weight": torch.ones(32)}))
    with pytest.raises(ModelLoadError, match="unexpected tensors.*blocks.0.q_norm.weight"):
        caidllm.load(path)


def test_missing_tensor(copy_of, dream_dir):
    path = copy_of(dream_dir)
    _rewrite_weights(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(
        ModelLoadError, match="missing from the checkpoint: model.layers.1.self_attn.k_proj.bias"
    ):
        caidllm.load(path)


def test_shape_mismatch(copy_of, llada_dir):
    path = copy_of(llada_dir)
    edit_json(path / "config.json", mlp_hidden_size=48)
    with pytest.raises(
        ModelLoadError, match=r"blocks.0.ff_out.weight.*shape \[32, 64\], expected \[32, 48\]"
    ):
        caidllm.load(path)


# ---- tokenizer ---------------------------------------------------------------------


def test_mask_id_not_a_mask_token(copy_of, llada_dir):
    path = copy_of(llada_dir)
    edit_json(path / "config.json", mask_token_id=100)
    with pytest.raises(ModelLoadError, match="at mask_token_id 100 is not a mask token"):
        caidllm.load(path)


def test_mask_id_not_in_tokenizer(copy_of, dream_dir):
    path = copy_of(dream_dir)
    edit_json(path / "config.json", mask_token_id=440)  # inside the padded embedding, past the tokenizer
    with pytest.raises(ModelLoadError, match="mask_token_id 440 is not a token of .*tokenizer.json"):
        caidllm.load(path)


# ---- device and dtype -----------------------------------------------------------------


def test_unknown_dtype(llada_dir):
    with pytest.raises(ModelLoadError, match="unknown dtype 'float8'"):
        caidllm.load(llada_dir, dtype="float8")
    with pytest.raises(ModelLoadError, match="unsupported dtype torch.int32"):
        caidllm.load(llada_dir, dtype=torch.int32)


def test_unknown_device(llada_dir):
    with pytest.raises(ModelLoadError, match="unknown device 'toaster'"):
        caidllm.load(llada_dir, device="toaster")


def test_dtype_the_device_cannot_run(monkeypatch, llada_dir):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this dtype")

    monkeypatch.setattr(loading.F, "scaled_dot_product_attention", broken)
    with pytest.raises(ModelLoadError, match="device cpu cannot run dtype torch.float16.*no kernel"):
        caidllm.load(llada_dir, dtype="float16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device(llada_dir):
    with pytest.raises(ModelLoadError, match="device cuda cannot run"):
        caidllm.load(llada_dir, device="cuda")


# ---- forward inputs -----------------------------------------------------------------


@pytest.fixture
def canvas(llada_lm):
    ids = torch.randint(10, 300, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0
    return ids, mask


def test_id_out_of_vocabulary(llada_lm, canvas):
    ids, mask = canvas
    V = llada_lm.config.vocab_size
    ids[1, 5] = V
    with pytest.raises(InputError, match=f"token id {V} is outside the vocabulary \\(size {V}"):
        llada_lm.logits(ids, mask)
    ids[1, 5] = -3
    with pytest.raises(InputError, match="token id -3 is outside"):
        llada_lm.forward(ids, mask)


def test_sequence_too_long(random_checkpoint):
    lm = caidllm.load(random_checkpoint("dream", max_length=16))
    assert lm.logits(torch.ones(1, 16, dtype=torch.long)).shape[1] == 16
    with pytest.raises(InputError, match="length 17 exceeds the model's max_length 16"):
        lm.logits(torch.ones(1, 17, dtype=torch.long))
    with pytest.raises(InputError, match="length 17 exceeds"):
        lm.new_cache(1, 17)


def test_bad_input_ids(llada_lm):
    with pytest.raises(InputError, match="integer tensor"):
        llada_lm.logits(torch.ones(2, 3))
    with pytest.raises(InputError, match=r"shape \(5,\)"):
        llada_lm.logits(torch.ones(5, dtype=torch.long))


def test_bad_attention_mask(llada_lm, canvas):
    ids, mask = canvas
    with pytest.raises(
        InputError, match=r"attention_mask shape \(2, 11\) does not match input_ids shape \(2, 12\)"
    ):
        llada_lm.logits(ids, mask[:, 1:])
    mask[1] = 0
    with pytest.raises(InputError, match="row 1 has no real token"):
        llada_lm.logits(ids, mask)


def test_bad_mode_and_cache(llada_lm, canvas):
    ids, mask = canvas
    with pytest.raises(
        InputError,
        match=r"mode must be a forward-mode object from caidllm.models.modes \(Full \('full'\), "
        r"Prefix \('prefix'\), .*got 'half'",
    ):
        llada_lm.forward(ids, mask, mode="half")
    with pytest.raises(TypeError, match="Prefix.__init__.. got an unexpected keyword argument 'columns'"):
        Prefix(start=4, end=8, columns=torch.tensor([[4]]))
    with pytest.raises(InputError, match="mode 'prefix' needs a cache"):
        llada_lm.forward(ids, mask, mode=Prefix(start=4, end=8))
    cache = llada_lm.new_cache(2, 12)
    with pytest.raises(InputError, match="mode 'dual'.*never filled"):
        llada_lm.forward(ids, mask, cache=cache, mode=Dual(start=4, end=8))
    with pytest.raises(InputError, match=r"cache was made for a \[2, 10\] canvas"):
        llada_lm.forward(ids, mask, cache=llada_lm.new_cache(2, 10))
    with pytest.raises(InputError, match="cache must be a KVCache"):
        llada_lm.forward(ids, mask, cache={"keys": []})
    llada_lm.forward(ids, mask, cache=cache)
    with pytest.raises(InputError, match="attention_mask differs"):
        llada_lm.forward(ids, None, cache=cache, mode=Prefix(start=4, end=8))


@pytest.mark.parametrize("start, end", [(8, 8), (-1, 4), (4, 13), (12, None)])
def test_start_end_out_of_range(llada_lm, canvas, start, end):
    ids, mask = canvas
    with pytest.raises(InputError, match=f"start={start}, end=.* out of range for canvas length 12"):
        llada_lm.forward(ids, mask, mode=Full(start=start, end=end))


def test_bad_rows(llada_lm, canvas):
    ids, mask = canvas
    with pytest.raises(InputError, match=r"rows \[0, 2\] out of range for batch size 2"):
        llada_lm.forward(ids, mask, mode=Full(rows=torch.tensor([0, 2])))
    with pytest.raises(InputError, match="duplicates"):
        llada_lm.forward(ids, mask, mode=Full(rows=torch.tensor([1, 1])))
    with pytest.raises(InputError, match="1-D integer"):
        llada_lm.forward(ids, mask, mode=Full(rows=torch.tensor([[0]])))


def test_bad_new_cache_and_chat_args(llada_lm):
    with pytest.raises(InputError, match="batch_size must be a positive int"):
        llada_lm.new_cache(0, 8)
    with pytest.raises(InputError, match="expects a str prompt"):
        llada_lm.encode_chat(["hi"])


def test_errors_are_value_errors():
    assert issubclass(ModelLoadError, ValueError) and issubclass(InputError, ValueError)


# ---- caidllm's own config.json fields -----------------------------------------------


@pytest.mark.parametrize("value", ["false", "False", 0, 1, "yes"])
def test_confidence_gating_must_be_a_json_boolean(copy_of, llada_dir, value):
    path = copy_of(llada_dir)
    edit_json(path / "config.json", caidllm_confidence_gating=value)
    with pytest.raises(ModelLoadError, match="caidllm_confidence_gating.*must be true or false"):
        caidllm.load(path)


def test_confidence_gating_false_is_read_as_false(copy_of, llada_dir):
    path = copy_of(llada_dir)
    edit_json(path / "config.json", caidllm_confidence_gating=False)
    assert caidllm.load(path).config.confidence_gating is False


def test_dream_context_is_its_usable_2048_not_max_position_embeddings(copy_of, dream_dir):
    from caidllm.models.families import load_config

    path = copy_of(dream_dir)
    edit_json(path / "config.json", max_position_embeddings=131072)  # what the real Dream config.json says
    assert load_config(path / "config.json").max_length == 2048
    edit_json(path / "config.json", caidllm_max_length=4096)  # a user who knows better says so
    assert load_config(path / "config.json").max_length == 4096
    edit_json(path / "config.json", caidllm_max_length=None, max_position_embeddings=512)
    assert load_config(path / "config.json").max_length == 512  # a smaller model keeps its own limit
