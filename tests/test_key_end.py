"""models/layers.Context.key_end (SlowFast's official shortened fast-phase forwards): a row whose keys end
at column e reads, for its positions before e, what a forward over the canvas cut at e reads; the other
rows of the batch are untouched; on a block-causal model too (the key end and the block mask combine)."""

import pytest
import torch

from caidllm.models.modes import Full


def _logits(lm, ids, start, end, key_end=None, attention_block=None):
    mask = torch.ones_like(ids, dtype=torch.bool)
    rows = ids.shape[0]
    return lm.forward(
        ids,
        mask,
        mode=Full(
            start=[start] * rows,
            end=[end] * rows,
            real_from=[0] * rows,
            key_end=key_end,
            attention_block=attention_block,
        ),
    )


@pytest.mark.parametrize("kind", ["bidirectional", "llada2"])
def test_key_end_is_a_cut_canvas_and_stays_in_its_row(kind, llada_lm, block_family):
    lm = llada_lm if kind == "bidirectional" else block_family("llada2")
    block = 8 if kind == "llada2" else None
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 24))
    ids[:, 18:] = lm.config.mask_id
    cut = 20  # inside the last block of 8 (16 .. 24)
    got = _logits(lm, ids, 16, 24, key_end=torch.tensor([cut, 24]), attention_block=block)
    short = _logits(lm, ids[:1, :cut], 16, cut, attention_block=block)
    whole = _logits(lm, ids, 16, 24, attention_block=block)
    assert torch.allclose(got[0, : cut - 16], short[0], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(whole[0, : cut - 16], short[0], atol=1e-4, rtol=1e-4)  # the cut matters here
    assert torch.allclose(got[1], whole[1], atol=1e-4, rtol=1e-4)  # the other row sees its whole canvas
