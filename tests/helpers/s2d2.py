"""What tests/test_s2d2.py and tests/test_s2d2_paper.py share: prompts, router settings, the models and
the parity and batch-invariance checks against the re-stated official loops (s2d2_reference.py)."""

from caidllm.decode.presets import build_config
from helpers.decoding import alone_static_joined
from s2d2_reference import s2d2_generate

PROMPTS = [[40, 41, 42, 43, 44], [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60]]
# The official signature's defaults (AR-like caching off; the s2d2 preset turns it on, SDAR Config-A's).
PLAIN = dict(cache_ver=False, draft_ver=False)
ALWAYS = dict(router="mask_span_length", min_span=1, **PLAIN)
STATIC = dict(
    router="score_threshold",
    score_threshold=0.0,
    score="difference_static",
    penalty=1.0,
    estimator="soft_entropy_negexp",
)
HYSTERESIS = dict(
    router="score_hysteresis",
    hysteresis_on=1.0,
    hysteresis_off=-5.0,
    score="difference_dynamic",
    penalty=1.0,
    estimator="hard_margin_threshold",
)
NO_RESAMPLE = dict(ALWAYS, resample=False)
RATIO = dict(ALWAYS, ratio_threshold=0.3, always_check_high_confidence=True)
BANDIT = dict(
    router="contextual_bandit_ucb", ucb_beta=0.5, ucb_span_bins=2, ucb_progress_bins=2, ucb_entropy_bins=2
)
DEFAULTS = dict(
    min_span=1,
    score_threshold=-1.0,
    hysteresis_on=0.0,
    hysteresis_off=-1.0,
    score="difference_dynamic",
    penalty=2.0,
    estimator="hard_margin_threshold",
    margin_threshold=0.05,
    entropy_temperature=1.0,
    acceptance="official",
    **PLAIN,
)


def answer(result):
    return (
        result.token_ids[: result.answer_length + 1]
        if result.answer_length < len(result.token_ids)
        else result.token_ids
    )


def models(block_family, bd_llada):
    """The three random models by kind (bd_llada: conftest.py's sharpened block-causal LLaDA layout)."""
    return {"sdar": block_family("sdar"), "llada2": block_family("llada2"), "llada": bd_llada}


def assert_parity(lm, s: dict, quota, block: int) -> None:
    threshold = 0.6
    results = lm.generate(
        PROMPTS,
        method="s2d2",
        gen_length=16,
        block_length=block,
        threshold=threshold,
        s2d2={**s, "num_to_transfer": quota},
    )
    stop = set(lm.config.eos_ids)
    for prompt, result in zip(PROMPTS, results):
        expected = s2d2_generate(
            lm,
            prompt,
            gen_length=16,
            block_length=block,
            steps=block,
            threshold=threshold,
            s=s,
            num_to_transfer=quota,
            stop_ids=stop,
        )
        assert answer(result) == expected


def assert_batch_invariant(lm, s2d2: dict, temperature: float) -> None:
    config = build_config(
        "s2d2",
        gen_length=16,
        block_length=4,
        early_stop=False,
        temperature=temperature,
        seed=3,
        s2d2=s2d2,
    )
    alone, static, joined = alone_static_joined(lm, config, PROMPTS + [[61, 62, 63]])
    assert alone == static == joined
