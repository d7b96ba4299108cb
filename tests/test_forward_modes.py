"""The forward modes as objects (models/modes/): one registry read by the model and the engine, a mode
added by one module (docs/forward-modes.md's worked example, re-stated here), the engine's vouched
call equal to the checked one, and clear errors for a mode given the wrong inputs or the wrong model.
Tiny random LLaDA / Dream, fp32 CPU."""

from dataclasses import dataclass

import pytest
import torch

from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.errors import InputError
from caidllm.models.modes import DKV, FORWARD_MODES, Block, Dual, Elastic, Full, Prefix, SubBlock
from caidllm.models.modes.base import CachedCanvasMode


@dataclass(kw_only=True)
class Window(CachedCanvasMode):
    """docs/forward-modes.md's example: the block and the `left` positions before it recomputed."""

    name = "window"
    left: int = 4

    def extra(self, lm) -> int:
        return lm.model.extra_left + self.left


def canvas(lm):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, 100, (2, 24), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :3] = False  # a left-padded row
    return ids, mask


def test_one_registry_names_every_mode_and_the_cache_modes_use_it():
    assert list(FORWARD_MODES) == [
        "full",
        "prefix",
        "dual",
        "es",
        "dkv",
        "elastic",
        "verify",
        "block",
        "subblock",
    ]
    assert all(FORWARD_MODES[m.between_refreshes.name] is m.between_refreshes for m in CACHE_MODES.values())


def test_an_added_mode_runs_through_the_model_unchanged(llada_lm, monkeypatch):
    lm = llada_lm
    monkeypatch.setitem(FORWARD_MODES, "window", Window)  # its registry line
    ids, mask = canvas(lm)
    cache = lm.new_cache(*ids.shape)
    lm.forward(ids, mask, cache)
    dual = lm.forward(ids, mask, cache, Dual(start=12, end=20))
    window = lm.forward(ids, mask, cache, FORWARD_MODES["window"](start=12, end=20, left=4))
    # the window's K/V are what the cache holds
    torch.testing.assert_close(window, dual, atol=1e-5, rtol=1e-5)
    changed = ids.clone()
    changed[:, 10] = 7  # inside the window, left of the block: dual reads its stale K/V, the window its fresh
    stale = lm.forward(changed, mask, cache, Dual(start=12, end=20))
    assert not torch.allclose(lm.forward(changed, mask, cache, Window(start=12, end=20)), stale, atol=1e-4)
    with pytest.raises(InputError, match="start must be >= 4"):
        lm.forward(ids, mask, cache, Window(start=2, end=10))


@pytest.mark.parametrize("mode", [Prefix, Dual])
def test_the_vouched_call_equals_the_checked_one(lm, mode):
    ids, mask = canvas(lm)
    cache = lm.new_cache(*ids.shape)
    lm.forward(ids, mask, cache)
    checked = lm.forward(ids, mask, cache, mode(start=[12, 12], end=[20, 20]))
    vouched = lm.forward(ids, mask, cache, mode(start=[12, 12], end=[20, 20], real_from=[0, 3]))
    assert torch.equal(checked, vouched)


def test_a_mode_given_another_modes_inputs_or_the_wrong_model_is_named(llada_lm, dream_lm, block_family):
    ids, mask = canvas(llada_lm)
    cache = llada_lm.new_cache(*ids.shape)
    llada_lm.forward(ids, mask, cache)
    with pytest.raises(TypeError, match=r"Dual.__init__\(\) got an unexpected keyword argument 'fold'"):
        Dual(start=12, end=20, fold=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'columns'"):
        Full(columns=torch.tensor([[1]]))
    with pytest.raises(InputError, match=r"mode must be a forward-mode object .*got 'dual'"):
        llada_lm.forward(ids, mask, cache, "dual")
    with pytest.raises(
        InputError, match="mode 'block' .* needs a block-causal model; the llada model's attention"
    ):
        llada_lm.forward(ids, mask, cache, Block(start=12, end=20))
    with pytest.raises(InputError, match="subblock forward needs a block-causal model"):
        llada_lm.forward(ids, mask, cache, SubBlock(columns=torch.tensor([[12, 13], [12, 13]])))
    with pytest.raises(InputError, match=r"mode 'dkv' needs columns=\[R, n\]"):
        llada_lm.forward(ids, mask, cache, DKV())
    with pytest.raises(InputError, match=r"mode 'elastic' needs inputs=ElasticInputs"):
        llada_lm.forward(ids, mask, cache, Elastic())
    with pytest.raises(InputError, match="the dkv forward needs unshifted logits; family 'dream'"):
        dream_lm.forward(ids, mask, None, DKV(columns=torch.tensor([[12, 13], [12, 13]])))
    bd = block_family("llada2")
    bd_cache = bd.new_cache(*ids.shape)
    bd.forward(ids, mask, bd_cache)
    with pytest.raises(InputError, match="fold=-1: a non-negative int"):
        bd.forward(ids, mask, bd_cache, Block(start=12, end=20, fold=-1))


def test_dkv_over_the_block_equals_dual(llada_lm):
    ids, mask = canvas(llada_lm)
    cache = llada_lm.new_cache(*ids.shape)
    llada_lm.forward(ids, mask, cache)
    columns = torch.arange(12, 20).expand(2, -1)
    dkv = llada_lm.forward(ids, mask, cache, DKV(columns=columns))
    torch.testing.assert_close(
        dkv, llada_lm.forward(ids, mask, cache, Dual(start=12, end=20)), atol=1e-5, rtol=1e-5
    )


def test_elastic_and_verify_refuse_a_block_causal_model(block_family):
    """Their computations (models/elastic.py, models/shadow.py) attend bidirectionally: on a block-causal
    model they would silently read later blocks."""
    from caidllm.models.elastic import ElasticInputs
    from caidllm.models.modes import Verify

    bd = block_family("llada2")
    ids = torch.randint(5, 100, (1, 16), generator=torch.Generator().manual_seed(2))
    cache = bd.new_cache(1, 16, every_layer=True)
    whole = ElasticInputs(torch.arange(16)[None], torch.arange(8, 16)[None], bd.config.n_layers, whole=True)
    with pytest.raises(
        InputError, match="the elastic forward needs bidirectional attention; the llada2 model"
    ):
        bd.forward(ids, None, cache, Elastic(inputs=whole))
    with pytest.raises(
        InputError, match="the verify forward needs bidirectional attention; the llada2 model"
    ):
        bd.forward(ids, None, None, Verify(start=8, end=16))


def test_key_end_applies_to_the_column_modes_too(llada_lm):
    """SlowFast's shortened forwards (key_end) run with cache 'dkv' and 'elastic' too: the DKV and Elastic
    modes cut each row's keys as the canvas modes do, rather than ignoring the field."""
    from caidllm.models.elastic import ElasticInputs

    ids, mask = canvas(llada_lm)
    mask[:] = True
    key_end = torch.tensor([17, 24])
    cache = llada_lm.new_cache(*ids.shape)
    llada_lm.forward(ids, mask, cache, Full(key_end=key_end))
    columns = torch.arange(12, 20).expand(2, -1)
    dual = llada_lm.forward(ids, mask, cache, Dual(start=12, end=20, key_end=key_end))
    dkv = llada_lm.forward(ids, mask, cache, DKV(columns=columns, key_end=key_end))
    torch.testing.assert_close(dkv, dual, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(dkv, llada_lm.forward(ids, mask, cache, DKV(columns=columns)), atol=1e-4)
    elastic_cache = llada_lm.new_cache(*ids.shape, every_layer=True)
    whole = ElasticInputs(torch.arange(24).expand(2, -1), columns, llada_lm.config.n_layers, whole=True)
    elastic = llada_lm.forward(ids, mask, elastic_cache, Elastic(inputs=whole, key_end=key_end))
    full = llada_lm.forward(ids, mask, None, Full(key_end=key_end))
    torch.testing.assert_close(elastic, full[:, 12:20], atol=1e-4, rtol=1e-4)


def test_verify_refuses_a_key_end(llada_lm):
    from caidllm.models.modes import Verify

    ids, mask = canvas(llada_lm)
    with pytest.raises(InputError, match="mode 'verify' takes no key_end"):
        llada_lm.forward(ids, None, None, Verify(start=8, end=16, key_end=torch.tensor([12, 12])))


@pytest.mark.parametrize(
    "columns, block_at, message",
    [
        ([[12, 13]], None, r"columns has 1 rows for 2 selected rows"),
        ([[12, 30], [12, 13]], None, r"columns must lie in \[0, 24\), got 30"),
        ([[13, 12], [12, 13]], None, r"columns must be ascending in each row"),
        ([[12.0, 13.0], [12.0, 13.0]], None, r"columns=\[R, n\] long tensor"),
        ([[12, 13], [12, 13]], [[0, 2], [0, 1]], r"block_at must index the 2 columns \(0 \.\. 1\), got 2"),
    ],
)
def test_dkv_columns_out_of_shape_are_named(llada_lm, columns, block_at, message):
    """The column modes are public now: bad columns are an InputError naming them, not an indexing crash."""
    ids, mask = canvas(llada_lm)
    cache = llada_lm.new_cache(*ids.shape)
    llada_lm.forward(ids, mask, cache)
    block_at = None if block_at is None else torch.tensor(block_at)
    with pytest.raises(InputError, match=message):
        llada_lm.forward(ids, mask, cache, DKV(columns=torch.tensor(columns), block_at=block_at))


@pytest.mark.parametrize("key_end", [torch.tensor([20]), torch.tensor([20.0, 24.0]), [20, 24]])
def test_a_key_end_out_of_shape_is_named(llada_lm, key_end):
    ids, mask = canvas(llada_lm)
    with pytest.raises(
        InputError, match=r"key_end must be a \[2\] integer tensor \(one column per selected row\)"
    ):
        llada_lm.forward(ids, mask, None, Full(key_end=key_end))


def test_elastic_given_something_else_than_its_inputs_is_named(llada_lm):
    ids, mask = canvas(llada_lm)
    cache = llada_lm.new_cache(*ids.shape, every_layer=True)
    llada_lm.forward(ids, mask, cache)
    with pytest.raises(InputError, match=r"mode 'elastic' needs inputs=ElasticInputs\(...\), got dict"):
        llada_lm.forward(ids, mask, cache, Elastic(inputs={"whole": True}))
