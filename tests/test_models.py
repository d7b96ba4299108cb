"""Model layer: loading official-layout checkpoints, logits, KV cache modes,
batch invariance, Dream's shift."""

import json

import pytest
import torch

import caidllm
from caidllm.errors import InputError
from caidllm.models import DreamModel, KVCache, LLaDAModel
from caidllm.models.layers import Context, positions_from_mask
from caidllm.models.modes import FORWARD_MODES, Dual, Full, Prefix

FAMILIES = ["llada", "dream"]


@pytest.fixture(params=FAMILIES)
def lm(request):
    return request.getfixturevalue(f"{request.param}_lm")


def make_canvas(lm, prompt_lengths, gen=24, seed=0):
    """Left-padded batch: random prompts, then a generation region of a few
    committed tokens followed by mask tokens."""
    g = torch.Generator().manual_seed(seed)
    c = lm.config
    B, L = len(prompt_lengths), max(prompt_lengths) + gen
    ids = torch.full((B, L), c.pad_id)
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b, n in enumerate(prompt_lengths):
        ids[b, L - gen - n : L - gen] = torch.randint(10, 300, (n,), generator=g)
        mask[b, L - gen - n :] = True
    ids[:, L - gen :] = c.mask_id
    ids[:, L - gen : L - gen + 10] = torch.randint(10, 300, (B, 10), generator=g)
    return ids, mask


def block_of(ids, gen=24):
    """A block in the middle of the generation region: [start, end)."""
    start = ids.shape[1] - gen + 8
    return start, start + 8


def close(a, b, atol=1e-5):
    return torch.allclose(a, b, atol=atol, rtol=0)


# ---- loading ------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sharded", [False, True])
def test_load_official_layout(random_checkpoint, family, sharded):
    path = random_checkpoint(family, sharded=sharded)
    assert (path / "model.safetensors.index.json").exists() == sharded
    lm = caidllm.load(path, device="cpu")
    assert isinstance(lm.model, LLaDAModel if family == "llada" else DreamModel)
    assert lm.device == torch.device("cpu") and lm.dtype == torch.float32
    c = lm.config
    assert c.family == family and c.n_layers == 2 and c.hidden_size == 32
    assert len(lm.tokenizer) <= c.vocab_size
    ids, mask = make_canvas(lm, [5, 8])
    out = lm.logits(ids, mask)
    assert out.shape == (2, ids.shape[1], c.vocab_size) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_special_ids(llada_lm, dream_lm):
    tok = llada_lm.tokenizer
    c = llada_lm.config
    assert tok.convert_ids_to_tokens(c.mask_id) == "<|mdm_mask|>"
    assert tok.convert_ids_to_tokens(c.eos_id) == "<|endoftext|>" and c.pad_id == c.eos_id
    assert tok.convert_ids_to_tokens(c.bos_id) == "<|startoftext|>"
    assert c.eos_ids == (c.eos_id, tok.convert_tokens_to_ids("<|eot_id|>"))
    assert c.confidence_gating is True and c.cache_refresh_every == 16 and c.max_length == 1024

    tok = dream_lm.tokenizer
    c = dream_lm.config
    assert tok.convert_ids_to_tokens(c.mask_id) == "<|mask|>"
    assert tok.convert_ids_to_tokens(c.eos_id) == "<|endoftext|>"
    assert c.eos_ids == (c.eos_id, tok.convert_tokens_to_ids("<|im_end|>"))
    assert c.confidence_gating is False and c.cache_refresh_every == 8
    assert c.n_kv_heads < c.n_heads and c.qkv_bias


def test_config_overrides_and_model_type_detection(random_checkpoint):
    path = random_checkpoint(
        "dream",
        config_overrides={
            "architectures": None,
            "model_type": "dream",
            "caidllm_confidence_gating": True,
            "caidllm_cache_refresh_every": 4,
        },
    )
    c = caidllm.load(path).config
    assert c.family == "dream" and c.confidence_gating is True and c.cache_refresh_every == 4
    assert c.raw["model_type"] == "dream"


def test_chat_formats(llada_lm, dream_lm):
    text = llada_lm.tokenizer.decode(llada_lm.encode_chat("  What is 2+3?  "))
    assert text == (
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    text = dream_lm.tokenizer.decode(dream_lm.encode_chat("What is 2+3?"))
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    c = llada_lm.config
    ids = llada_lm.tokenizer.encode("The answer is 42.", add_special_tokens=False)
    assert llada_lm.decode(ids + [c.eos_id, c.mask_id, *c.eos_ids]) == "The answer is 42."
    assert llada_lm.decode(torch.tensor(ids + [c.vocab_size - 1])) == "The answer is 42."


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", torch.float32])
def test_dtypes_load_and_run(family, dtype, request):
    reference = request.getfixturevalue(f"{family}_lm")
    lm = caidllm.load(reference.path, device="cpu", dtype=dtype)
    expected = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    assert lm.dtype == expected
    assert all(p.dtype == expected for p in lm.model.parameters())
    ids, mask = make_canvas(lm, [4, 7])
    out = lm.logits(ids, mask)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert close(out, reference.logits(ids, mask), atol=0.25)  # same model, lower precision
    start, end = block_of(ids)
    cache = lm.new_cache(*ids.shape)
    assert cache.keys[0].dtype == expected
    lm.forward(ids, mask, cache=cache)
    for mode in ("prefix", "dual"):
        out = lm.forward(ids, mask, cache=cache, mode=FORWARD_MODES[mode](start=start, end=end))
        assert torch.isfinite(out).all()


def test_dtype_default_is_checkpoint_dtype(random_checkpoint):
    path = random_checkpoint("llada", dtype="bfloat16")
    assert json.loads((path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    lm = caidllm.load(path)
    assert lm.dtype == torch.bfloat16 and lm.model.model.transformer.wte.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("family", FAMILIES)
def test_tied_embeddings(random_checkpoint, family):
    lm = caidllm.load(random_checkpoint(family, tie_embeddings=True))
    assert lm.config.tie_embeddings
    names = dict(lm.model.named_parameters())
    assert "lm_head.weight" not in names and "model.transformer.ff_out.weight" not in names
    ids, mask = make_canvas(lm, [3, 6])
    assert torch.isfinite(lm.logits(ids, mask)).all()


def test_write_random_checkpoint_is_deterministic(random_checkpoint):
    a, b = random_checkpoint("dream", seed=3), random_checkpoint("dream", seed=3)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    c = random_checkpoint("dream", seed=4)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_module_callable_without_context(lm):
    ids, _ = make_canvas(lm, [6])
    with torch.no_grad():
        assert close(lm.model(ids), lm.logits(ids), atol=0)


# ---- full forward and KV cache ------------------------------------------------------


def test_full_mode_start_end(lm):
    ids, mask = make_canvas(lm, [5, 9, 3])
    start, end = block_of(ids)
    full = lm.logits(ids, mask)
    assert close(lm.forward(ids, mask, mode=Full(start=start, end=end)), full[:, start:end])
    assert close(lm.forward(ids, mask, mode=Full(start=0, end=1)), full[:, :1])


@pytest.mark.parametrize("rows", [None, [2, 0]])
def test_cache_modes_match_full_after_refresh(lm, rows):
    ids, mask = make_canvas(lm, [5, 9, 3])
    B, L = ids.shape
    start, end = block_of(ids)
    full = lm.logits(ids, mask)
    sel = slice(None) if rows is None else torch.tensor(rows)
    rows_t = None if rows is None else torch.tensor(rows)

    cache = lm.new_cache(B, L)
    refresh = lm.forward(ids, mask, cache=cache, mode=Full(rows=rows_t))
    assert close(refresh, full[sel])
    prefix = lm.forward(ids, mask, cache=cache, mode=Prefix(start=start, end=end, rows=rows_t))
    assert prefix.shape == (len(full[sel]), end - start, lm.config.vocab_size)
    assert close(prefix, full[sel, start:end])
    dual = lm.forward(ids, mask, cache=cache, mode=Dual(start=start, end=end, rows=rows_t))
    assert close(dual, full[sel, start:end])
    # Also right at the start of the generation region and for a single row.
    first = L - 24
    for mode in ("prefix", "dual"):
        out = lm.forward(
            ids,
            mask,
            cache=cache,
            mode=FORWARD_MODES[mode](start=first, end=first + 8, rows=torch.tensor([0])),
        )
        assert close(out, full[:1, first : first + 8])


def test_rows_fill_only_their_cache_rows(lm):
    ids, mask = make_canvas(lm, [5, 9, 3])
    cache = lm.new_cache(*ids.shape)
    lm.forward(ids, mask, cache=cache, mode=Full(rows=torch.tensor([1])))
    assert cache.filled.tolist() == [False, True, False]
    assert cache.keys[0][0].abs().sum() == 0 and cache.keys[0][1].abs().sum() > 0
    with pytest.raises(InputError, match="never filled"):
        lm.forward(ids, mask, cache=cache, mode=Prefix(start=30, end=33))


def test_prefix_mode_leaves_cache_unchanged(lm):
    ids, mask = make_canvas(lm, [5, 9])
    start, end = block_of(ids)
    cache = lm.new_cache(*ids.shape)
    lm.forward(ids, mask, cache=cache)
    before = [k.clone() for k in cache.keys + cache.values]
    ids2 = ids.clone()
    ids2[:, start : start + 2] = 42  # a block token committed since the refresh
    lm.forward(ids2, mask, cache=cache, mode=Prefix(start=start, end=end))
    assert all(torch.equal(a, b) for a, b in zip(before, cache.keys + cache.values))


def test_dual_cache_staleness_as_documented(lm):
    """KVCache docstring: a dual pass rewrites only the block's entries (Dream:
    from start-1); every other entry stays as the last refresh wrote it."""
    ids, mask = make_canvas(lm, [5, 9, 3])
    B, L = ids.shape
    start, end = block_of(ids)
    lo = start - lm.model.extra_left
    full_old = lm.logits(ids, mask)
    cache = lm.new_cache(B, L)
    lm.forward(ids, mask, cache=cache)
    refreshed = [k.clone() for k in cache.keys]

    # Tokens of the suffix change (committed elsewhere): dual still sees the
    # refresh's suffix K/V, so it equals the full forward of the OLD canvas ...
    ids2 = ids.clone()
    ids2[:, end:] = torch.randint(10, 300, (B, L - end), generator=torch.Generator().manual_seed(1))
    dual = lm.forward(ids2, mask, cache=cache, mode=Dual(start=start, end=end))
    assert close(dual, full_old[:, start:end])
    # ... and not the full forward of the new one.
    assert not close(dual, lm.logits(ids2, mask)[:, start:end], atol=1e-3)

    # A token changing inside the block rewrites the block's entries only.
    ids3 = ids2.clone()
    ids3[:, start + 1] = 77
    lm.forward(ids3, mask, cache=cache, mode=Dual(start=start, end=end))
    for new, old in zip(cache.keys, refreshed):
        assert torch.equal(new[:, :, :lo], old[:, :, :lo])
        assert torch.equal(new[:, :, end:], old[:, :, end:])
        assert not torch.equal(new[:, :, start + 1], old[:, :, start + 1])

    # After the next refresh everything is current again.
    lm.forward(ids3, mask, cache=cache)
    dual = lm.forward(ids3, mask, cache=cache, mode=Dual(start=start, end=end))
    assert close(dual, lm.logits(ids3, mask)[:, start:end])


# ---- batch invariance and Dream's shift ---------------------------------------


def test_batch_invariance(lm):
    ids, mask = make_canvas(lm, [4, 11, 7])
    batch = lm.logits(ids, mask)
    start, end = block_of(ids)
    cache = lm.new_cache(*ids.shape)
    lm.forward(ids, mask, cache=cache)
    dual = lm.forward(ids, mask, cache=cache, mode=Dual(start=start, end=end))
    for b in range(len(ids)):
        alone_ids = ids[b : b + 1, mask[b]]
        alone = lm.logits(alone_ids)
        assert close(batch[b, mask[b]], alone[0])
        # Same through the cache path, with the row at a different offset.
        n = alone_ids.shape[1]
        s, e = start - (ids.shape[1] - n), end - (ids.shape[1] - n)
        c1 = lm.new_cache(1, n)
        lm.forward(alone_ids, cache=c1)
        assert close(dual[b], lm.forward(alone_ids, cache=c1, mode=Dual(start=s, end=e))[0])


def _unshifted(lm, ids, mask):
    """Head applied to each position's own hidden state, by hand."""
    with torch.no_grad():
        ctx = Context.build(mask, positions_from_mask(mask), lm.config.head_dim, lm.config.rope_theta)
        if lm.config.family == "dream":
            m = lm.model.model
            x = m.embed_tokens(ids)
            for i, layer in enumerate(m.layers):
                x = layer(x, ctx, i)
            return lm.model.lm_head(m.norm(x)).float()
        t = lm.model.model.transformer
        x = t.wte(ids)
        for i, block in enumerate(t.blocks):
            x = block(x, ctx, i)
        return t.ff_out(t.ln_f(x)).float()


def test_dream_logits_are_shifted_once(dream_lm):
    ids, mask = make_canvas(dream_lm, [4, 9])
    own = _unshifted(dream_lm, ids, mask)
    out = dream_lm.logits(ids, mask)
    first = [int(m.nonzero()[0]) for m in mask]  # first real position of each row
    for b in range(len(ids)):
        f = first[b]
        assert close(out[b, f], own[b, f])  # the first real token reuses its own
        assert close(out[b, f + 1 :], own[b, f:-1])  # position i reads hidden state i-1
        assert not close(out[b, f + 1 :], own[b, f + 1 :], atol=1e-2)  # shift missing
        assert not close(out[b, f + 2 :], own[b, f:-2], atol=1e-2)  # shift doubled
    assert first[1] == 0 and close(out[1, 0], own[1, 0])  # position 0 (of the unpadded row) reuses its own
    # (Padding positions have no defined logits: attention runs over each row's real keys only.)


def test_llada_logits_are_not_shifted(llada_lm):
    ids, mask = make_canvas(llada_lm, [4, 9])
    assert close(llada_lm.logits(ids, mask)[mask], _unshifted(llada_lm, ids, mask)[mask])


def test_kvcache_shapes(lm):
    cache = lm.new_cache(3, 40)
    c = lm.config
    assert isinstance(cache, KVCache) and cache.batch_size == 3 and cache.length == 40
    assert len(cache.keys) == len(cache.values) == c.n_layers
    assert cache.keys[0].shape == (3, c.n_kv_heads, 40, c.head_dim)
    assert cache.attention_mask.shape == cache.positions.shape == (3, 40)
