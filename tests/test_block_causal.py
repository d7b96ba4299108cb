"""Block-causal attention in the shared model layer (block-diffusion models): a position sees
its own block and every earlier block, never a later one; blocks laid from the first real token."""

import pytest
import torch

import caidllm
from caidllm.errors import InputError, ModelLoadError
from caidllm.models.families import parse_config
from caidllm.models.modes import Full

BLOCK_CAUSAL = {"caidllm_block_causal": True, "caidllm_block_lengths": [4, 8]}


@pytest.fixture(scope="module")
def bd_lm(random_checkpoint):
    folder = random_checkpoint("llada", config_overrides=BLOCK_CAUSAL, seed=3)
    return caidllm.load(folder, device="cpu", dtype="float32")


def test_parser_reads_block_fields(bd_lm, llada_lm):
    assert bd_lm.config.block_causal and bd_lm.config.block_lengths == (4, 8)
    assert not llada_lm.config.block_causal and llada_lm.config.block_lengths == ()


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"caidllm_block_causal": "yes"}, "caidllm_block_causal"),
        ({"caidllm_block_causal": True, "caidllm_block_lengths": [4, 0]}, "caidllm_block_lengths"),
        ({"caidllm_block_causal": True, "caidllm_block_lengths": 4}, "caidllm_block_lengths"),
        ({"caidllm_block_lengths": [4]}, "caidllm_block_causal"),
    ],
)
def test_parser_rejects_bad_block_fields(bd_lm, extra, needle):
    raw = {k: v for k, v in bd_lm.config.raw.items() if not k.startswith("caidllm_block")}
    with pytest.raises(ModelLoadError, match=needle):
        parse_config({**raw, **extra})


def test_a_block_never_sees_a_later_one(bd_lm):
    """Changing a token changes the logits of its own block and later blocks only."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 60, (1, 16), generator=g)
    base = bd_lm.forward(ids, mode=Full(attention_block=4))
    changed = ids.clone()
    changed[0, 9] = 61  # block 2 of length 4 (positions 8..11)
    after = bd_lm.forward(changed, mode=Full(attention_block=4))
    same = (base - after).abs().amax(dim=-1)[0] < 1e-6
    assert same[:8].all() and not same[8:].any()
    # The default attention block is the first of the model's lengths; a model-level forward agrees.
    assert torch.allclose(bd_lm.forward(ids), base, atol=1e-5)
    assert torch.allclose(bd_lm.model(ids), base, atol=1e-5)


def test_blocks_start_at_the_first_real_token(bd_lm):
    """Left padding shifts the canvas, not the blocks: a padded row equals the unpadded one."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 60, (1, 12), generator=g)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 12)], dim=1)
    alone = bd_lm.forward(ids, mode=Full(attention_block=4))
    in_pad = bd_lm.forward(padded, mask, mode=Full(attention_block=4))[:, 3:]
    assert torch.allclose(alone, in_pad, atol=1e-5)


def test_block_causal_equals_one_forward_per_prefix(bd_lm):
    """Block b's logits are those of a plain bidirectional forward over blocks 0..b only."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 60, (1, 16), generator=g)
    logits = bd_lm.forward(ids, mode=Full(attention_block=8))
    head = bd_lm.forward(ids[:, :8], mode=Full(attention_block=8))
    assert torch.allclose(logits[:, :8], head, atol=1e-5)


def test_attention_block_checked(bd_lm, llada_lm):
    ids = torch.randint(3, 60, (1, 8))
    with pytest.raises(InputError, match="block length 5 is not one this model decodes with"):
        bd_lm.forward(ids, mode=Full(attention_block=5))
    with pytest.raises(InputError, match="bidirectional"):
        llada_lm.forward(ids, mode=Full(attention_block=4))
