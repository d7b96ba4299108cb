"""Named methods: each preset is a set of overrides of `DecodeConfig`.

The same names are used by the API, the CLI and the benchmark runner. Any
field can still be overridden by the caller (e.g. method="fastdllm",
cache="none"). `preset_config` builds and checks one; presets.build_config
adds a settings file on top (settings_file.py sits between the two).
"""

from __future__ import annotations

import copy
from dataclasses import replace

from caidllm.decode.config import CAI_FIELDS, DECODE_FIELDS, CAISettings, DecodeConfig
from caidllm.decode.field_scope import check_given_apply
from caidllm.errors import InputError

PRESETS: dict[str, dict] = {
    # LLaDA low-confidence remasking, no cache, one token per step (steps = gen_length): the paper's 1.0x.
    "vanilla": dict(policy="vanilla", cache="none"),
    # Fast-dLLM threshold decoding with DualCache: the paper's "DualCache" baseline. As the official
    # code runs them, its DualCache and prefix cache are refreshed at block starts only (refresh_every=0);
    # CAI and ES-dLLM keep the paper's f (the model's cache_refresh_every).
    "fastdllm": dict(policy="threshold", cache="dual", threshold=0.9, refresh_every=0),
    "fastdllm-prefix": dict(policy="threshold", cache="prefix", threshold=0.9, refresh_every=0),
    # ES-dLLM baseline: early skipping on the dual cache, schedule [(1.0, 0.0), (0.5, 0.125), (0.25, 0.25)]
    # and alpha 0.5 (the DecodeConfig defaults), committing with a fixed confidence threshold of 0.9 (the
    # paper's ablation starts from ES-dLLM and adds the adaptive schedule, APD, on top of it).
    "es-dllm": dict(policy="threshold", cache="es", threshold=0.9),
    # CAI-dLLM, all components, gating from the model's default (on for LLaDA, off for Dream).
    # Its backend stays the dual cache until the ES backend ("cai-es") is measured against it.
    "cai": dict(policy="cai", cache="dual"),
    # CAI-dLLM on the ES-dLLM cache backend, as the paper builds it (Section 5).
    "cai-es": dict(policy="cai", cache="es"),
    "cai-gate-off": dict(policy="cai", cache="dual", cai=dict(gating=False)),
    "cai-gate-on": dict(policy="cai", cache="dual", cai=dict(gating=True)),
    # Grinding as Algorithm 1 writes it: after K low-yield steps the block ends (BENCHMARKS.md compares both).
    "cai-exit": dict(policy="cai", cache="dual", cai=dict(grinding_action="exit")),
    # Ablation ladder of the paper (Tables 3 and 11): APD alone, + block schedule, + position factors.
    "cai-apd": dict(policy="cai", cache="dual",
                    cai=dict(block_schedule=False, position_factors=False, gating=False)),
    "cai-apd-block": dict(policy="cai", cache="dual", cai=dict(position_factors=False, gating=False)),
    "cai-apd-block-pos": dict(policy="cai", cache="dual", cai=dict(gating=False)),
    # EB-Sampler (arXiv 2505.24857): entropy-bounded unmasking, no cache, gamma 0.01 (policies/eb.py).
    "eb": dict(policy="eb", cache="none", eb_gamma=0.01, eb_proxy="entropy"),
    # The same with the paper's other error proxies ordering the positions (the bound stays on entropies).
    "eb-confidence": dict(policy="eb", cache="none", eb_gamma=0.01, eb_proxy="confidence"),
    "eb-margin": dict(policy="eb", cache="none", eb_gamma=0.01, eb_proxy="margin"),
    # EB-Sampler's rule over Fast-dLLM's dual cache refreshed at block starts (a combination, not a paper's).
    "eb-dual": dict(policy="eb", cache="dual", eb_gamma=0.01, eb_proxy="entropy", refresh_every=0),
    # SlowFast Sampling (arXiv 2506.10848, LiangrunFlora/Slow-Fast-Sampling) at its official defaults, its
    # fast phase's forwards after the first ending at the span's end as the official code runs them.
    "slowfast": dict(policy="slowfast", cache="none", sf_explore_steps=6, sf_cycle_threshold=0.3, sf_window=2,
                     sf_std=1.0, sf_high=0.9, sf_shortened=True),
    # caidllm's earlier reading: every forward on the whole canvas (BENCHMARKS.md compares the two).
    "slowfast-whole": dict(policy="slowfast", cache="none", sf_explore_steps=6, sf_cycle_threshold=0.3,
                           sf_window=2, sf_std=1.0, sf_high=0.9, sf_shortened=False),
    # dKV-Cache-Decode (arXiv 2505.15781, horseee/dKV-Cache): LLaDA's low-confidence remasking with delayed
    # caching of decoded tokens' K/V, refreshed every 8 steps (the paper's setting) and at a block's first two.
    "dkv": dict(policy="vanilla", cache="dkv", refresh_every=8),
    # dKV-Cache-Greedy (same paper and repository): LLaDA's random remasking (the only one its official
    # generate supports); between refreshes only the positions a step decodes, the previous step's and 2
    # masked neighbours of each are computed; refreshed every 8 steps (window and period: our pick, as dkv).
    "dkv-greedy": dict(policy="random", cache="dkv-greedy", refresh_every=8, dkv_window=2),
    # WINO (arXiv 2507.18578, Feng-Hong/WINO-DLLM) at its official defaults: draft 0.6, verify 0.9.
    "wino": dict(policy="wino", cache="none", wino_draft=0.6, wino_verify=0.9),
    # Elastic-Cache (arXiv 2510.14973, VILA-Lab/Elastic-Cache) as its official loop runs: Fast-dLLM's
    # threshold 0.9 over a window of 16 sliding over the whole generation, gamma 0.9, one tracked token per
    # layer, its stop at the first end token (decode/elastic.py). One block of gen_length: a block_length given
    # that differs is refused (config._elastic_one_block); the bench gives it none of the run's (presets.run_lengths).
    "elastic": dict(policy="threshold", cache="elastic", threshold=0.9, refresh_every=0, elastic_gamma=0.9,
                    elastic_scope="generation"),
    # caidllm's block-wise reading: the same rule with the window inside each block (BENCHMARKS.md compares).
    "elastic-block": dict(policy="threshold", cache="elastic", threshold=0.9, refresh_every=0, elastic_gamma=0.9,
                          elastic_scope="block"),
    # CAI-dLLM's budgets and schedule over the Elastic-Cache backend (as cai-es over ES-dLLM's), block-wise.
    "cai-elastic": dict(policy="cai", cache="elastic", refresh_every=0, elastic_gamma=0.9, elastic_scope="block"),
    # Block-diffusion models' own decoders with their official defaults (docs/block-diffusion.md), on the
    # exact block cache. LLaDA2.x: threshold decoding, block 32, 32 steps per block, threshold 0.95.
    "llada2": dict(policy="dynamic", cache="block", block_length=32, threshold=0.95),
    # LLaDA2.1: threshold decoding with token editing, one forced commit a step (num_to_transfer 1), up to 16
    # editing steps after a block's last mask. "llada2.1": the official generate's defaults (threshold 0.95,
    # editing 0.9, eos_early_stop False); the model card's Q (quality: 0.7 / 0.5) and S (speed: 0.5 / 0.0) modes.
    "llada2.1": dict(policy="dynamic", cache="block", block_length=32, threshold=0.95, editing_threshold=0.9,
                     num_to_transfer=1, max_post_steps=16, early_stop=False),
    "llada2.1-quality": dict(policy="dynamic", cache="block", block_length=32, threshold=0.7, editing_threshold=0.5,
                             num_to_transfer=1, max_post_steps=16),
    "llada2.1-speed": dict(policy="dynamic", cache="block", block_length=32, threshold=0.5, editing_threshold=0.0,
                           num_to_transfer=1, max_post_steps=16),
    # SDAR (generate.py's defaults): block 4, 4 denoising steps per block; low_confidence_dynamic with
    # confidence_threshold 0.85 (JetEngine's example uses 0.9), or low_confidence_static.
    "sdar": dict(policy="dynamic", cache="block", block_length=4, threshold=0.85),
    "sdar-static": dict(policy="static", cache="block", block_length=4),
    # Fast-dLLM v2 (its eval.py's defaults): block 32 (bd_size), sub-blocks of 8, threshold 0.9, on the exact
    # block cache plus the within-block cache of its generator's use_block_cache (cache="block": without it).
    "fastdllm-v2": dict(policy="subblock", cache="subblock", block_length=32, sub_block=8, threshold=0.9),
}

# Presets that only apply to block-causal models (their own decoders); the others run on every family.
BLOCK_DIFFUSION_PRESETS = ("llada2", "llada2.1", "llada2.1-quality", "llada2.1-speed", "sdar", "sdar-static",
                           "fastdllm-v2")


def method_names(block_causal: bool | None = None) -> list[str]:
    """Every preset; with block_causal=False, those a full-sequence model runs (its own
    decoders are the block-diffusion models')."""
    if block_causal is False:
        return [m for m in PRESETS if m not in BLOCK_DIFFUSION_PRESETS]
    return list(PRESETS)


def uses_cai(method: str) -> bool:
    """Whether the preset runs the CAI controller (so a settings file applies to it)."""
    return PRESETS.get(method, {}).get("policy") == "cai"


def preset_config(method: str, cai_under: dict | None = None, strict: bool = False, filled=(),
                  **overrides) -> DecodeConfig:
    """The preset `method` with `overrides` applied (None values are ignored), checked.

    Overrides may name any DecodeConfig field or any CAISettings field
    (CAI fields may also be given as a dict under `cai`). `cai_under`: CAI
    values that go over the preset's and under `overrides` (a settings file's). strict: a setting
    given that the method's policy and cache do not read is refused (decode/field_scope.py), as the
    server and the CLI do; the Python API's default lets one set of keywords run over several methods.
    filled: the names among `overrides` that are not the caller's (a known checkpoint's recommendation,
    a server's default): their values apply, but they are not `given`.
    """
    if method not in PRESETS:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(PRESETS)}")
    preset = copy.deepcopy(PRESETS[method])
    cai_overrides = preset.pop("cai", {})
    cai_overrides.update(copy.deepcopy(cai_under or {}))
    top = dict(preset)
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "cai":
            if not isinstance(value, dict):
                raise InputError(f"cai overrides must be a dict of CAI settings, got {type(value).__name__}")
            for k in value:
                if k not in CAI_FIELDS:
                    raise InputError(f"unknown CAI setting {k!r}; known: {', '.join(sorted(CAI_FIELDS))}")
            cai_overrides.update(value)
        elif key in DECODE_FIELDS:
            top[key] = value
        elif key in CAI_FIELDS:
            cai_overrides[key] = value
        else:
            raise InputError(
                f"unknown decoding option {key!r}; known: {', '.join(sorted(DECODE_FIELDS | CAI_FIELDS))}"
            )
    for key in ("factors", "budget_fractions"):
        if isinstance(cai_overrides.get(key), list):
            cai_overrides[key] = tuple(cai_overrides[key])
    given = tuple(sorted(k for k, v in overrides.items() if v is not None and k not in filled))
    config = DecodeConfig(method=method, **top, cai=replace(CAISettings(), **cai_overrides), given=given)
    config.validate()
    if strict:  # a setting this decoder does not read is refused, not ignored
        check_given_apply(config, PRESETS)
    return config
