"""S2D2 at the paper's configurations (phymhan/S2D2 README, "Configurations used in the paper"): SDAR's
AR-like caching (``s2d2.cache_ver``, ``s2d2.draft_ver``) and LLaDA2.1's token editing with S2D2
(``editing_threshold``), each token for token against the re-stated official loop (s2d2_reference.py,
s2d2_llada2_reference.py); batch invariance; what is refused; the presets."""

import pytest

from caidllm.decode.presets import build_config
from caidllm.errors import InputError
from helpers.decoding import alone_static_joined
from helpers.s2d2 import (
    ALWAYS,
    BANDIT,
    DEFAULTS,
    HYSTERESIS,
    PLAIN,
    PROMPTS,
    RATIO,
    STATIC,
    answer,
    assert_batch_invariant,
    assert_parity,
    models,
)

AR_LIKE = dict(cache_ver=True, draft_ver=True)


@pytest.mark.parametrize("kind", ["sdar", "llada"])
@pytest.mark.parametrize(
    "router, acceptance, block",
    [
        (dict(ALWAYS, **AR_LIKE), "official", 4),
        (dict(ALWAYS, cache_ver=True), "official", 4),
        (dict(ALWAYS, draft_ver=True), "official", 4),
        (dict(HYSTERESIS, cache_ver=False, draft_ver=True), "greedy", 8),
        (dict(STATIC, **AR_LIKE), "official", 4),
        (dict(STATIC, **AR_LIKE), "greedy", 8),
        (dict(RATIO, cache_ver=True), "official", 8),
        (dict(BANDIT, **AR_LIKE), "official", 4),
    ],
)
def test_ar_like_caching_parity(block_family, bd_llada, kind, router, acceptance, block):
    """SDAR's --cache_ver (earlier blocks' keys and values token-causal) and --draft_ver (the draft reads
    the block's decoded prefix token-causally) against the official loop, prompts ending inside a block
    (the random SDAR decodes blocks of 4 only). The prefix store holds the prompts' block-causal blocks
    first: a request with AR-like caching must not take them."""
    s = {**DEFAULTS, **router, "acceptance": acceptance}
    lm = models(block_family, bd_llada)[kind]
    lm.generate(PROMPTS, method="s2d2", gen_length=16, block_length=block if kind == "llada" else 4)
    assert_parity(models(block_family, bd_llada)[kind], s, None, block=block if kind == "llada" else 4)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("ar_like", [dict(cache_ver=True), AR_LIKE, dict(cache_ver=False, draft_ver=True)])
def test_ar_like_caching_batch_invariance(block_family, ar_like, temperature):
    """A request's token-causal span and cache row are its own: alone, batched, or joining a running batch
    (and beside a request without AR-like caching) it decodes the same."""
    lm = block_family("sdar")
    assert_batch_invariant(lm, dict(ALWAYS, **ar_like), temperature)
    from caidllm.decode.engine import Engine
    from helpers.decoding import _finished

    configs = [
        build_config(
            "s2d2", gen_length=16, block_length=4, early_stop=False, temperature=temperature, seed=3, s2d2=s
        )
        for s in (dict(ALWAYS, **ar_like), ALWAYS)
    ]
    alone = {}
    for c, config in enumerate(configs):
        for p, prompt in enumerate(PROMPTS):
            engine = Engine(lm, max_batch=1)
            rid = engine.submit(prompt, config)
            alone[c, p] = _finished(engine)[rid].token_ids
    if temperature == 0:  # the setting changes some answer (sampled, draft_ver alone happens not to here)
        assert alone[0, 0] != alone[1, 0] or alone[0, 1] != alone[1, 1]
    engine = Engine(lm, max_batch=4)
    ids = {
        (c, p): engine.submit(prompt, config)
        for c, config in enumerate(configs)
        for p, prompt in enumerate(PROMPTS)
    }
    mixed = _finished(engine)
    assert {key: mixed[rid].token_ids for key, rid in ids.items()} == alone


@pytest.mark.parametrize(
    "kind, options",
    [
        ("llada2", {}),
        ("fastdllm_v2", {}),
        ("sdar", {"cache": "subblock"}),
        ("llada2", {"s2d2": dict(cache_ver=False, draft_ver=True), "field": "s2d2.draft_ver"}),
    ],
)
def test_ar_like_caching_refused_where_the_loop_has_none(block_family, kind, options):
    """LLaDA2's loop has no AR-like caching, Fast-dLLM v2's is not re-stated; it needs the exact cache."""
    lm, options = block_family(kind), dict(options)
    settings, field = options.pop("s2d2", dict(cache_ver=True)), options.pop("field", "s2d2.cache_ver")
    with pytest.raises(InputError, match=field) as err:
        lm.generate([[5, 6, 7]], method="s2d2", gen_length=8, block_length=4, s2d2=settings, **options)
    assert err.value.field == "s2d2" and "\n" not in str(err.value)


# The hysteresis switch on for good once on (off at -100), unless an editing step with no mask left turns
# it off as LLaDA2's loop does: a case that fails when that step skips the router.
STICKY = dict(
    router="score_hysteresis",
    hysteresis_on=1.5,
    hysteresis_off=-100.0,
    score="difference_static",
    penalty=0.0,
    margin_threshold=0.02,
)


@pytest.mark.parametrize(
    "kind, router, acceptance, editing, post, block",
    [
        ("llada2", ALWAYS, "official", 0.0, 16, 4),
        ("llada2", dict(HYSTERESIS, **PLAIN), "official", 0.0, 2, 4),
        ("llada2", dict(STICKY, **PLAIN), "official", 0.0, 1, 4),
        ("llada2", dict(HYSTERESIS, **PLAIN), "greedy", 0.1, 1, 8),
        ("llada2", dict(STATIC, **PLAIN), "official", 0.05, 0, 8),
        ("llada2", ALWAYS, "greedy", 0.1, 3, 8),
        ("llada", dict(STATIC, **PLAIN), "official", 0.5, 2, 4),
        ("llada2", dict(ALWAYS, top_k=3), "official", 0.0, 2, 4),
        ("llada2", dict(HYSTERESIS, **PLAIN, top_p=0.3), "official", 0.1, 1, 8),
        ("llada", dict(STATIC, **PLAIN, top_k=5, top_p=0.9), "official", 0.5, 2, 4),
    ],
)
def test_editing_parity(block_family, bd_llada, kind, router, acceptance, editing, post, block):
    """LLaDA2.1's token editing with S2D2 (LLaDA2/generate_utils.py generate_ssd_policy, re-stated in
    s2d2_llada2_reference.py): the edits made before verification and verified with the block, the router
    asked at editing steps with no mask left, the block's end by the editing rule."""
    from s2d2_llada2_reference import s2d2_llada2_generate

    lm = models(block_family, bd_llada)[kind]
    s = {**DEFAULTS, **router, "acceptance": acceptance}
    config = dict(gen_length=16, block_length=block, threshold=0.6, max_post_steps=post, s2d2=s)
    results = lm.generate(PROMPTS, method="s2d2-llada2", editing_threshold=editing, **config)
    for prompt, result in zip(PROMPTS, results):
        expected = s2d2_llada2_generate(
            lm,
            prompt,
            gen_length=16,
            block_length=block,
            threshold=0.6,
            editing_threshold=editing,
            max_post_steps=post,
            s=s,
            stop_ids=set(lm.config.eos_ids),
        )
        assert answer(result) == expected


def test_editing_changes_the_tokens(block_family):
    lm = block_family("llada2")
    config = dict(method="s2d2-llada2", gen_length=16, block_length=4, threshold=0.6, s2d2=ALWAYS)
    edited = lm.generate(PROMPTS, editing_threshold=0.0, max_post_steps=16, **config)
    plain = lm.generate(PROMPTS, editing_threshold=1.0, max_post_steps=16, **config)
    assert [r.token_ids for r in edited] != [r.token_ids for r in plain]
    assert all(e.nfe > p.nfe for e, p in zip(edited, plain))  # the editing steps' forwards


@pytest.mark.parametrize("filters", [dict(top_k=3), dict(top_p=0.3)])
def test_top_k_top_p_change_the_tokens(block_family, filters):
    """LLaDA2's loop filters the verify distribution and the residual at temperature 0 too."""
    lm = block_family("llada2")
    config = dict(method="s2d2-llada2", gen_length=16, block_length=4, threshold=0.6, editing_threshold=0.0)
    plain = lm.generate(PROMPTS, s2d2=ALWAYS, **config)
    filtered = lm.generate(PROMPTS, s2d2=dict(ALWAYS, **filters), **config)
    assert [r.token_ids for r in plain] != [r.token_ids for r in filtered]


@pytest.mark.parametrize(
    "settings, options, field, says",
    [
        (dict(top_k=3), dict(method="s2d2"), "s2d2.top_k", "token editing"),
        (dict(top_p=0.5), dict(method="s2d2-llada2", temperature=0.8), "s2d2.top_p", "temperature 0"),
        (dict(top_k=-1), dict(method="s2d2-llada2"), "s2d2.top_k", "integer"),
        (dict(top_p=0.0), dict(method="s2d2-llada2"), "s2d2.top_p", "(0, 1]"),
    ],
)
def test_top_k_top_p_refused_where_not_read(block_family, settings, options, field, says):
    lm = block_family("llada2")
    s2d2 = dict(PLAIN, **settings) if options["method"] == "s2d2" else settings
    with pytest.raises(InputError) as err:
        lm.generate([[5, 6, 7]], gen_length=8, block_length=8, s2d2=s2d2, **options)
    assert err.value.field == "s2d2" and field in str(err.value) and says in str(err.value)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_editing_batch_invariance(block_family, temperature):
    lm = block_family("llada2")
    config = build_config(
        "s2d2-llada2",
        gen_length=16,
        block_length=4,
        early_stop=False,
        temperature=temperature,
        seed=3,
        threshold=0.6,
        editing_threshold=0.0,
        max_post_steps=2,
        s2d2=dict(HYSTERESIS),
    )
    alone, static, joined = alone_static_joined(lm, config, PROMPTS + [[61, 62, 63]])
    assert alone == static == joined


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(ratio_threshold=0.3), "s2d2.ratio_threshold"),
        (dict(always_check_high_confidence=True), "s2d2.always_check_high_confidence"),
        (dict(resample=False), "s2d2.resample"),
        (dict(router="contextual_bandit_ucb"), "s2d2.router"),
        (dict(num_to_transfer=None), "s2d2.num_to_transfer"),
        (dict(draft_ver=True), "s2d2.draft_ver"),
    ],
)
def test_editing_refuses_what_llada2s_loop_lacks(block_family, settings, field):
    """Token editing with S2D2 is LLaDA2's loop: SDAR's options are refused with it, naming the field."""
    lm = block_family("llada2")
    with pytest.raises(InputError) as err:
        lm.generate([[5, 6, 7]], method="s2d2-llada2", gen_length=8, block_length=8, s2d2=settings)
    assert err.value.field == "s2d2" and field in str(err.value) and "editing_threshold" in str(err.value)


def test_the_paper_presets():
    """SDAR Config-A with AR-like caching; LLaDA2.1-Mini Conservative and Quality with token editing."""
    from caidllm.decode.methods import PRESETS

    assert PRESETS["s2d2"]["s2d2"] | {"cache_ver": True, "draft_ver": True} == PRESETS["s2d2"]["s2d2"]
    conservative, quality = PRESETS["s2d2-llada2"], PRESETS["s2d2-llada2-quality"]
    assert (conservative["threshold"], conservative["editing_threshold"]) == (0.95, 0.9)
    assert (quality["threshold"], quality["editing_threshold"]) == (0.7, 0.5)
    assert conservative["s2d2"]["score_threshold"] == -5.0 and quality["s2d2"]["score_threshold"] == 0.0
