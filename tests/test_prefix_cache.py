"""The prefix store (decode/prefix_store.py, decode/prefix_reuse.py): with it on, every request gives the
tokens it gives with it off (alone, batched, joining mid-flight, with a store that evicts mid-run), on
tiny-bd and random LLaDA2 / SDAR shapes in fp32; its counters, pins and bad budgets."""

import pytest
import torch

import caidllm
from caidllm.decode.engine import Engine
from caidllm.decode.prefix_store import PrefixStore, chain_digests
from caidllm.decode.presets import build_config
from caidllm.errors import InputError

# A shared beginning of 10 tokens: with blocks of 4 it ends inside the third block.
SHARED = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
PROMPTS = [
    SHARED + [60, 61, 62],
    SHARED + [70, 71, 72, 73, 74, 75],
    SHARED + [60, 61, 62],
    SHARED,
    SHARED + [60, 61, 62, 63, 64, 65, 66, 67, 68],
]


@pytest.fixture(scope="module")
def tiny_bd():
    return caidllm.load("tiny-bd", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def family(block_family):
    return block_family


def decode(lm, prompts, config, *, batch=8, store=None, mb=0.0, join_after=None):
    """Each prompt's tokens through one engine (prompts after `join_after` submitted mid-flight)."""
    engine = Engine(lm, max_batch=batch, max_queue=len(prompts), prefix_cache_mb=mb, prefix_store=store)
    first = prompts if join_after is None else prompts[:1]
    ids = [engine.submit(p, config) for p in first]
    results = {}
    for _ in range(join_after or 0):
        for event in engine.step():
            if event.finished:
                results[event.request_id] = event.result
    if join_after is not None:
        ids += [engine.submit(p, config) for p in prompts[1:]]
    results.update({e.request_id: e.result for e in engine.run() if e.finished})
    return [results[i] for i in ids]


def tokens(results):
    return [r.token_ids for r in results]


CASES = [
    ("tiny-bd", "llada2", 4),
    ("tiny-bd", "vanilla", 8),
    ("llada2", "llada2", 4),
    ("llada2", "llada2.1", 8),
    ("sdar", "sdar", 4),
    ("sdar-moe", "sdar-static", 4),
    ("fastdllm_v2", "fastdllm-v2", 4),
    ("fastdllm_v2", "cai", 4),
    ("fastdllm_v2", "fastdllm-v2-subblock", 4),
]
# Fast-dLLM v2: the token shift, and its within-block cache (its preset's default, 'subblock')


@pytest.mark.parametrize("kind, method, block", CASES)
def test_store_on_gives_the_tokens_of_store_off(tiny_bd, family, kind, method, block):
    lm = tiny_bd if kind == "tiny-bd" else family(kind)
    # Fast-dLLM v2's decoder on the exact block cache, and on its within-block cache over it
    sub_block = {"sub_block": 2, "cache": "block"} if method == "fastdllm-v2" else {}
    if method == "fastdllm-v2-subblock":
        method, sub_block = "fastdllm-v2", {"sub_block": 2, "cache": "subblock"}
    config = build_config(method, gen_length=16, block_length=block, early_stop=False, **sub_block)
    off = tokens(decode(lm, PROMPTS, config))
    store = PrefixStore(64 << 20)
    batched = decode(lm, PROMPTS, config, batch=2, store=store)  # later ones find the first ones' blocks
    assert tokens(batched) == off
    assert sum(r.reused_positions for r in batched) > 0
    alone = [decode(lm, [p], config, batch=1, store=store)[0] for p in PROMPTS]  # every prompt hits now
    assert tokens(alone) == off
    assert [r.reused_positions for r in alone] == [len(p) // block * block for p in PROMPTS]
    assert [r.reused_positions + r.prefill_positions for r in alone] == [len(p) for p in PROMPTS]
    joined = decode(lm, PROMPTS, config, batch=3, store=PrefixStore(64 << 20), join_after=3)
    assert tokens(joined) == off


def test_reused_blocks_are_the_prompts_complete_blocks(tiny_bd):
    """A prompt takes only complete blocks before the block holding its end; a repeat takes all of them."""
    config = build_config("llada2", gen_length=8, block_length=4, early_stop=False)
    store = PrefixStore(64 << 20)
    (first,) = decode(tiny_bd, [SHARED + [60, 61]], config, store=store)  # 12 tokens: 3 prompt blocks
    (again,) = decode(tiny_bd, [SHARED + [60, 61]], config, store=store)
    (other,) = decode(tiny_bd, [SHARED + [90, 91, 92]], config, store=store)  # shares 2 whole blocks
    assert (first.reused_positions, again.reused_positions, other.reused_positions) == (0, 12, 8)
    assert (first.prefill_positions, again.prefill_positions, other.prefill_positions) == (12, 0, 5)
    stats = store.stats()
    assert (stats["lookups"], stats["hits"], stats["positions_saved"]) == (3, 2, 20)
    assert stats["bytes_held"] == sum(b.nbytes for b in store.blocks.values()) <= stats["budget_bytes"]


def test_a_finished_answer_is_found_by_the_next_turn(tiny_bd):
    """Finishing stores the generated blocks too (all but the last): a prompt that repeats the first
    request's prompt and answer takes them."""
    config = build_config("llada2", gen_length=12, block_length=4, early_stop=False)
    store = PrefixStore(64 << 20)
    prompt = SHARED + [60, 61]
    (first,) = decode(tiny_bd, [prompt], config, store=store)
    history = prompt + first.token_ids[:8] + [77, 78]
    (turn,) = decode(tiny_bd, [history], config, store=store)
    assert turn.reused_positions == 20
    assert tokens([turn]) == tokens(decode(tiny_bd, [history], config))


def test_a_small_store_evicts_mid_run_and_stays_exact(tiny_bd):
    config = build_config("llada2", gen_length=12, block_length=4, early_stop=False)
    block_bytes = 2 * tiny_bd.config.n_layers * tiny_bd.config.n_kv_heads * 4 * tiny_bd.config.head_dim * 4
    store = PrefixStore(5 * block_bytes)
    prompts = PROMPTS + [[90 + i] * 9 + SHARED for i in range(3)] + PROMPTS
    on = decode(tiny_bd, prompts, config, batch=2, store=store)
    assert tokens(on) == tokens(decode(tiny_bd, prompts, config))
    stats = store.stats()
    assert stats["blocks_evicted"] > 0 and stats["hits"] > 0
    assert stats["bytes_held"] <= 5 * block_bytes
    assert all(b.refs == 0 for b in store.blocks.values())  # every request let go of its blocks


def test_cancel_leaves_nothing_held_and_nothing_half_written(tiny_bd):
    config = build_config("llada2", gen_length=16, block_length=4, early_stop=False)
    store = PrefixStore(64 << 20)
    engine = Engine(tiny_bd, max_batch=2, prefix_store=store)
    decode(tiny_bd, [SHARED + [60, 61]], config, store=store)
    held = dict(store.blocks)
    rid = engine.submit(SHARED + [60, 61, 62, 63, 64], config)
    engine.step()  # its prompt's blocks went in after its first forward
    engine.step()
    assert any(b.refs for b in store.blocks.values())
    engine.cancel(rid)
    assert all(b.refs == 0 for b in store.blocks.values())
    prompt_chain = chain_digests(SHARED + [60, 61, 62, 63, 64], 4, 3)
    assert set(store.blocks) == set(held) | set(prompt_chain)  # no generated block of the cancelled request
    for block in store.blocks.values():
        assert block.keys.shape == (
            tiny_bd.config.n_layers,
            tiny_bd.config.n_kv_heads,
            4,
            tiny_bd.config.head_dim,
        )


def test_the_first_event_says_what_was_reused(tiny_bd):
    config = build_config("llada2", gen_length=8, block_length=4, early_stop=False)
    engine = Engine(tiny_bd, max_batch=2, prefix_cache_mb=16)
    for _ in range(2):
        rid = engine.submit(SHARED + [60, 61], config)
        events = [e for e in engine.run() if e.request_id == rid]
        assert [e.reused_positions for e in events[1:]] == [None] * (len(events) - 1)
        assert events[0].prompt_length == 12
    assert events[0].reused_positions == 12
    off = Engine(tiny_bd, max_batch=2, prefix_cache_mb=0)
    off.submit(SHARED + [60, 61], config)
    # no store: nothing to say (the live view draws nothing)
    assert next(iter(off.run())).reused_positions is None


def test_lru_evicts_unheld_blocks_first_and_never_held_ones():
    one = torch.zeros(1, 1, 4, 2)  # 32 bytes each for keys and values: 64 a block
    store = PrefixStore(3 * 64)
    for name in (b"a", b"b", b"c"):
        assert store.put(name, one, one)
    store.pin([b"a"])
    store.touch([b"b"])  # c is now the least recently used unheld block
    assert store.put(b"d", one, one)
    assert set(store.blocks) == {b"a", b"b", b"d"}
    store.pin([b"b", b"d"])
    assert not store.put(b"e", one, one)  # every block held: nothing is written
    assert store.stats()["blocks_skipped"] == 1 and store.bytes_held == 3 * 64
    store.unpin([b"a", b"b", b"d"])
    assert store.put(b"e", one, one) and b"a" not in store.blocks


def test_chain_digests_name_a_block_and_everything_before_it():
    a = chain_digests([1, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    b = chain_digests([9, 2, 3, 4, 5, 6, 7, 8], 4, 2)
    assert a[1] != b[1] and len(set(a + b)) == 4
    assert chain_digests([1, 2, 3, 4, 5, 6, 7, 8], 4, 1) == a[:1]
    assert chain_digests([1, 2, 3, 4, 5, 6, 7, 8], 8, 1) != chain_digests([1, 2, 3, 4, 5, 6, 7, 8], 4, 2)[1:]


@pytest.mark.parametrize(
    "value, words",
    [
        (-1, "number of MB >= 0"),
        ("lots", "number of MB >= 0"),
        (float("nan"), "number of MB >= 0"),
        (True, "number of MB >= 0"),
        (1e12, "more than the memory"),
    ],
)
def test_bad_budgets_are_refused(tiny_bd, value, words):
    with pytest.raises(InputError, match=words):
        Engine(tiny_bd, prefix_cache_mb=value)
    with pytest.raises(InputError, match=words):
        tiny_bd.generate([SHARED], method="llada2", gen_length=4, block_length=4, prefix_cache_mb=value)


def test_a_full_sequence_model_refuses_the_store_and_runs_without_it(llada_lm):
    with pytest.raises(InputError, match="does not apply to the llada model: its attention is bidirectional"):
        Engine(llada_lm, prefix_cache_mb=64)
    assert Engine(llada_lm).prefix.store is None and Engine(llada_lm, prefix_cache_mb=0).prefix.store is None


def test_off_means_no_store(tiny_bd):
    assert Engine(tiny_bd, prefix_cache_mb=0).prefix.store is None
    assert Engine(tiny_bd).prefix.store is not None  # on by default for a block-causal model
    config = build_config("llada2", gen_length=8, block_length=4, cache="none")
    (result,) = decode(tiny_bd, [SHARED, SHARED], config, store=PrefixStore(1 << 20))[:1]
    assert result.reused_positions == 0  # the whole window every step: no cache to take blocks into


def test_a_chain_is_evicted_from_its_end(tiny_bd):
    """After a request leaves, its chain's last blocks are the least recently used: a parent outlives
    its children, so what stays can still be matched."""
    config = build_config("llada2", gen_length=8, block_length=4, early_stop=False)
    store = PrefixStore(64 << 20)
    prompt = SHARED + [60, 61, 62, 63, 64, 65]
    decode(tiny_bd, [prompt], config, store=store)
    chain = chain_digests(prompt, 4, 4)
    order = [d for d in store.blocks if d in chain]  # least recently used first
    assert order == list(reversed(chain))


def test_a_generate_call_that_raises_leaves_no_block_held(tiny_bd, monkeypatch):
    """The store is kept with the model across generate() calls: a call whose run raises mid-flight (a
    forward error, Ctrl-C) must not leave its requests' pins behind, or those blocks are never evicted."""
    from caidllm.decode.prefix_reuse import forget_store
    from caidllm.decode.runner import Runner

    forget_store(tiny_bd)
    real, calls = Runner.run, []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a forward failed")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "run", failing)
    with pytest.raises(RuntimeError, match="a forward failed"):
        tiny_bd.generate(
            [SHARED + [60, 61]],
            method="llada2",
            gen_length=16,
            block_length=4,
            early_stop=False,
            prefix_cache_mb=16,
        )
    store = tiny_bd.prefix_store
    assert len(store) > 0 and all(b.refs == 0 for b in store.blocks.values())
    forget_store(tiny_bd)


def test_the_kept_store_is_remade_when_the_model_is_compiled(tiny_bd):
    """Blocks computed by the eager kernels are not what compiled ones compute: a generate(compile=True)
    after an eager one starts with a fresh store (exactness against the store off, compiled)."""
    from caidllm.decode.prefix_reuse import forget_store, shared_store

    forget_store(tiny_bd)
    eager = shared_store(tiny_bd, 16)
    assert shared_store(tiny_bd, None) is eager
    tiny_bd.compiled = True  # what enable_compile sets once its kernels are in
    try:
        assert shared_store(tiny_bd, None) is not eager
    finally:
        tiny_bd.compiled = False
        forget_store(tiny_bd)


def test_the_kept_store_is_remade_when_the_moe_kernel_changes():
    """MoE kernels sum the experts in different orders (last bits): blocks kept from a run with one
    kernel are not reused by a run with another (review r33)."""
    from caidllm.decode.prefix_reuse import forget_store, shared_store
    from caidllm.models.moe import set_moe_kernel

    moe = caidllm.load("tiny-moe")
    set_moe_kernel(moe.model, "grouped")
    first = shared_store(moe, 16)
    assert shared_store(moe, None) is first
    set_moe_kernel(moe.model, "loop")
    assert shared_store(moe, None) is not first
    forget_store(moe)


def test_a_store_filled_by_another_model_is_refused(tiny_bd, family):
    """A store handed to engines (Engine(prefix_store=)) is named by tokens only: one filled by another
    model's forwards would give this one that model's keys and values."""
    store = PrefixStore(1 << 20)
    Engine(tiny_bd, prefix_store=store)
    Engine(tiny_bd, prefix_store=store)  # the same model: shared
    with pytest.raises(InputError, match="prefix_store was made for another model"):
        Engine(family("sdar"), prefix_store=store)
