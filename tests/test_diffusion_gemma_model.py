"""DiffusionGemma's model against transformers' own (fp32 logits to a float tolerance): the causal
encoder writing the cache (prompt, then a finished canvas), the bidirectional decoder reading it,
with and without self-conditioning; both attention kinds, the window active, soft-capping active."""

import pytest
import torch

pytest.importorskip("transformers.models.diffusion_gemma")

from caidllm.models.diffusion_gemma_cache import DecoderView, DGCache
from helpers.dg_reference import ours_from, reference


def _reference_decode(model, cache, canvas, sc_logits, start):
    positions = torch.arange(start, start + canvas.shape[1])[None]
    return model(
        decoder_input_ids=canvas,
        cache=cache,
        self_conditioning_logits=sc_logits,
        decoder_position_ids=positions,
    ).logits


@pytest.mark.parametrize("prompt_len", [3, 11])
def test_encoder_and_decoder_logits_match_transformers(prompt_len):
    from transformers import DynamicCache

    model = reference(seed=prompt_len)
    ours = ours_from(model)
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 96, (1, prompt_len), generator=g)
    canvas = torch.randint(0, 96, (1, 8), generator=g)

    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    with torch.no_grad():
        encoded = model.model.encoder(
            input_ids=prompt, cache=cache, position_ids=torch.arange(prompt_len)[None]
        ).last_hidden_state
        first = _reference_decode(model, cache, canvas, None, prompt_len)
        second = _reference_decode(model, cache, canvas, first / 0.7, prompt_len)
    mine = DGCache.empty(4)
    torch.testing.assert_close(ours.encode(prompt, mine), encoded, rtol=1e-4, atol=1e-4)
    # the encoder's logits (its states through the tied head, soft-capped) as transformers' head gives them
    head = torch.tanh(model.lm_head(encoded) / 3.0) * 3.0
    torch.testing.assert_close(ours.logits(encoded), head)
    view = DecoderView.batch([mine])
    my_first = ours.denoise(canvas, view)
    torch.testing.assert_close(my_first, first, rtol=1e-4, atol=1e-4)
    assert first.abs().max() > 1.5  # the cap of 3 bites (tanh(0.5) is 8% under 0.5)
    my_second = ours.denoise(canvas, view, ours.soft_embeddings(first / 0.7))
    torch.testing.assert_close(my_second, second, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(first, second, atol=1e-2)  # self-conditioning changes the logits

    # a finished canvas encoded after the prompt, then the next canvas decoded over both
    with torch.no_grad():
        model.model.encoder(
            input_ids=canvas, cache=cache, position_ids=torch.arange(prompt_len, prompt_len + 8)[None]
        )
        nxt = _reference_decode(model, cache, canvas.flip(1), None, prompt_len + 8)
    ours.encode(canvas, mine)
    torch.testing.assert_close(
        ours.denoise(canvas.flip(1), DecoderView.batch([mine])), nxt, rtol=1e-4, atol=1e-4
    )


def test_batched_decoder_rows_equal_their_own():
    """Two requests with prefixes of different lengths decoded in one forward: each row's logits are its
    own (the padding of the shorter cache is masked)."""
    ours = ours_from(reference(seed=3))
    g = torch.Generator().manual_seed(1)
    caches, canvases = [], []
    for n in (5, 12):
        cache = DGCache.empty(4)
        ours.encode(torch.randint(0, 96, (1, n), generator=g), cache)
        caches.append(cache)
        canvases.append(torch.randint(0, 96, (1, 8), generator=g))
    together = ours.denoise(torch.cat(canvases), DecoderView.batch(caches))
    for row, (cache, canvas) in enumerate(zip(caches, canvases)):
        torch.testing.assert_close(
            together[row : row + 1], ours.denoise(canvas, DecoderView.batch([cache])), rtol=1e-5, atol=1e-5
        )


def test_checkpoint_folder_loads_with_official_names(tmp_path):
    """A folder written by transformers' save_pretrained (official tensor names, the vision tower's
    tensors, the encoder's layer scalars) loads through caidllm.models.load; no mask token needed."""
    from caidllm.models import load
    from helpers.checkpoints import write_tokenizer

    model = reference(seed=5, vocab_size=448)
    model.save_pretrained(tmp_path)
    write_tokenizer(tmp_path, "llada", 512)
    lm = load(tmp_path, device="cpu", dtype="float32")
    assert lm.config.family == "diffusion_gemma" and lm.config.mask_id is None
    ids = torch.tensor([[5, 9, 200, 3, 17, 4]])
    canvas = torch.arange(8)[None] * 3
    cache = DGCache.empty(4)
    lm.model.encode(ids, cache)
    expected = ours_from(model)
    ref_cache = DGCache.empty(4)
    expected.encode(ids, ref_cache)
    torch.testing.assert_close(
        lm.model.denoise(canvas, DecoderView.batch([cache])),
        expected.denoise(canvas, DecoderView.batch([ref_cache])),
    )


@pytest.mark.parametrize("kernel", ["loop", "grouped", "sized", "padded"])
def test_moe_kernels_agree(kernel):
    """The routed experts (GELU-tanh gates) on each of caidllm's MoE kernels; native (SwiGLU only)
    says why it cannot run them."""
    from caidllm.models.moe import set_moe_kernel
    from caidllm.models.moe_kernels import native_unavailable

    ours = ours_from(reference(seed=2))
    cache = DGCache.empty(4)
    ours.encode(torch.arange(6)[None], cache)
    canvas = torch.arange(8)[None] + 40
    set_moe_kernel(ours, "loop")
    expected = ours.denoise(canvas, DecoderView.batch([cache]))
    set_moe_kernel(ours, kernel)
    torch.testing.assert_close(
        ours.denoise(canvas, DecoderView.batch([cache])), expected, rtol=1e-5, atol=1e-5
    )
    assert "silu" in native_unavailable(ours.backbone.layers[0].experts)


def test_the_uniform_state_objective_trains_a_few_steps():
    """A few optimiser steps of the uniform-state objective (random-token corruption, self-conditioning mixed
    in) lower the loss on a fixed batch; gradients reach the encoder's and the decoder's shared weights."""
    from caidllm.models.moe import set_moe_kernel
    from caidllm.train.uniform_objective import corrupt, uniform_state_loss

    torch.manual_seed(0)
    ours = ours_from(reference(seed=9, scale=0.5))
    set_moe_kernel(ours, "loop")
    ours.train()
    g = torch.Generator().manual_seed(0)
    canvas = torch.randint(0, 96, (2, 8), generator=g)
    noisy, t = corrupt(canvas, 96, torch.Generator().manual_seed(1))
    assert ((noisy != canvas).float().mean(dim=1) <= 1).all() and ((t > 0) & (t <= 1)).all()
    prompts = [torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8, 9, 10, 11])]
    optimiser = torch.optim.Adam(ours.parameters(), lr=3e-3)
    losses = []
    for step in range(12):
        loss = uniform_state_loss(ours, prompts, canvas, torch.Generator().manual_seed(step % 2))
        optimiser.zero_grad()
        loss.backward()
        if step == 0:
            layer = ours.backbone.layers[0]
            assert layer.self_attn.q_proj.weight.grad.abs().sum() > 0
            assert ours.backbone.self_conditioning.gate_proj.weight.grad is not None
        optimiser.step()
        losses.append(loss.item())
    assert sum(losses[-2:]) < sum(losses[:2])
