"""Named methods: each preset is a set of overrides of `DecodeConfig`: shared fields, and a method's
settings under its owner's key (eb=dict(gamma=...)); `threshold` stays flat, its meaning shared by every
threshold rule (fastdllm's, dynamic, subblock, CAI's fixed one).

The same names are used by the API, the CLI and the benchmark runner. Any
field can still be overridden by the caller (e.g. method="fastdllm",
cache="none"). `preset_config` builds and checks one; presets.build_config
adds a settings file on top (settings_file.py sits between the two).
"""

from __future__ import annotations

import copy
import dataclasses

from caidllm.decode.config import DecodeConfig
from caidllm.decode.forward_modes import CACHE_MODES
from caidllm.decode.policies import POLICIES, NoSettings
from caidllm.decode.setting_names import not_read, owners_of, split
from caidllm.errors import InputError
from caidllm.setting_rules import BLOCK_CAUSAL, NoCacheSettings


def _s2d2_llada2(threshold: float, editing_threshold: float, score_threshold: float) -> dict:
    """S2D2 on LLaDA2.1-Mini as the paper's eval scripts run LLaDA2's loop with its token editing
    (LLaDA2/generate_utils.py generate_ssd_policy): block 32, one commit a step (num_to_transfer 1), no
    editing step after a block's last mask (max_post_steps 0), eos_early_stop, score router static, c = 4,
    soft entropy;
    the configurations differ in their thresholds (Conservative 0.95 / 0.9 / -5, Quality 0.7 / 0.5 / 0)."""
    return dict(
        policy="s2d2",
        cache="block",
        block_length=32,
        threshold=threshold,
        editing_threshold=editing_threshold,
        max_post_steps=0,
        s2d2=dict(
            num_to_transfer=1,
            router="score_threshold",
            score_threshold=score_threshold,
            score="difference_static",
            penalty=4.0,
            estimator="soft_entropy_negexp",
        ),
    )


PRESETS: dict[str, dict] = {
    # LLaDA low-confidence remasking, no cache, one token per step (steps = gen_length): the paper's 1.0x.
    "vanilla": dict(policy="vanilla", cache="none"),
    # Fast-dLLM threshold decoding with DualCache: the paper's "DualCache" baseline. As the official
    # code runs them, its DualCache and prefix cache are refreshed at block starts only (refresh_every=0);
    # CAI and ES-dLLM keep the paper's f (the model's cache_refresh_every).
    "fastdllm": dict(policy="threshold", cache="dual", refresh_every=0, threshold=0.9),
    "fastdllm-prefix": dict(policy="threshold", cache="prefix", refresh_every=0, threshold=0.9),
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
    "cai-apd": dict(
        policy="cai", cache="dual", cai=dict(block_schedule=False, position_factors=False, gating=False)
    ),
    "cai-apd-block": dict(policy="cai", cache="dual", cai=dict(position_factors=False, gating=False)),
    "cai-apd-block-pos": dict(policy="cai", cache="dual", cai=dict(gating=False)),
    # EB-Sampler (arXiv 2505.24857): entropy-bounded unmasking, no cache, gamma 0.01 (policies/eb.py).
    "eb": dict(policy="eb", cache="none", eb=dict(gamma=0.01, proxy="entropy")),
    # The same with the paper's other error proxies ordering the positions (the bound stays on entropies).
    "eb-confidence": dict(policy="eb", cache="none", eb=dict(gamma=0.01, proxy="confidence")),
    "eb-margin": dict(policy="eb", cache="none", eb=dict(gamma=0.01, proxy="margin")),
    # EB-Sampler's rule over Fast-dLLM's dual cache refreshed at block starts (a combination, not a paper's).
    "eb-dual": dict(policy="eb", cache="dual", refresh_every=0, eb=dict(gamma=0.01, proxy="entropy")),
    # SlowFast Sampling (arXiv 2506.10848, LiangrunFlora/Slow-Fast-Sampling) at its official defaults, its
    # fast phase's forwards after the first ending at the span's end as the official code runs them.
    "slowfast": dict(
        policy="slowfast",
        cache="none",
        slowfast=dict(explore_steps=6, cycle_threshold=0.3, window=2, std=1.0, high=0.9, shortened=True),
    ),
    # caidllm's earlier reading: every forward on the whole canvas (BENCHMARKS.md compares the two).
    "slowfast-whole": dict(
        policy="slowfast",
        cache="none",
        slowfast=dict(explore_steps=6, cycle_threshold=0.3, window=2, std=1.0, high=0.9, shortened=False),
    ),
    # dKV-Cache-Decode (arXiv 2505.15781, horseee/dKV-Cache): LLaDA's low-confidence remasking with delayed
    # caching of decoded tokens' K/V, refreshed every 8 steps (the paper's setting) and at a block's first
    # two.
    "dkv": dict(policy="vanilla", cache="dkv", refresh_every=8),
    # dKV-Cache-Greedy (same paper and repository): LLaDA's random remasking (the only one its official
    # generate supports); between refreshes only the positions a step decodes, the previous step's and 2
    # masked neighbours of each are computed; refreshed every 8 steps (window and period: our pick, as dkv).
    "dkv-greedy": dict(policy="random", cache="dkv-greedy", refresh_every=8, dkv=dict(window=2)),
    # WINO (arXiv 2507.18578, Feng-Hong/WINO-DLLM) at its official defaults: draft 0.6, verify 0.9.
    "wino": dict(policy="wino", cache="none", wino=dict(draft=0.6, verify=0.9)),
    # KLASS (arXiv 2511.05664, shkim0116/KLASS) at its official defaults: confidence above 0.9 and a KL below
    # 0.01 at each of the last 2 steps, else LLaDA's schedule; no cache, as its official LLaDA loop.
    "klass": dict(policy="klass", cache="none", klass=dict(conf_threshold=0.9, kl_threshold=0.01, history=2)),
    # Prophet (pixeli99/Prophet) at its official thresholds 7.5 / 5.0 / 2.5, no cache; the answer watched from
    # 28 positions before the generation's end (the official example's 100 of 128; its evaluation places it
    # after the prompt's constraints, which caidllm does not have).
    "prophet": dict(
        policy="prophet", cache="none", prophet=dict(answer_start=-28, early=7.5, mid=5.0, late=2.5)
    ),
    # CAI-dLLM with Prophet's early exit (policies/cai_prophet.py): CAI's controller at its defaults,
    # Prophet's watch as the `prophet` preset's; no cache (the watch reads the whole generation's logits).
    "cai-prophet": dict(
        policy="cai-prophet", cache="none", cai_prophet=dict(answer_start=-28, early=7.5, mid=5.0, late=2.5)
    ),
    # LocalLeap (arXiv 2510.07081, friedrichor/LocalLeap) at its official example's settings: anchors at 0.9,
    # their neighbours within 4 positions at 0.75; no cache, as its official LLaDA loop.
    "localleap": dict(
        policy="localleap", cache="none", threshold=0.9, localleap=dict(relaxed_threshold=0.75, radius=4)
    ),
    # Elastic-Cache (arXiv 2510.14973, VILA-Lab/Elastic-Cache) as its official loop runs: Fast-dLLM's
    # threshold 0.9 over a window of 16 sliding over the whole generation, gamma 0.9, one tracked token per
    # layer, its stop at the first end token (decode/elastic.py). One block of gen_length: a block_length
    # given that differs is refused (elastic.ElasticSettings.settle_lengths); the bench gives it none of the
    # run's (presets.run_lengths).
    "elastic": dict(
        policy="threshold",
        cache="elastic",
        refresh_every=0,
        threshold=0.9,
        elastic=dict(gamma=0.9, scope="generation"),
    ),
    # caidllm's block-wise reading: the same rule with the window inside each block (BENCHMARKS.md compares).
    "elastic-block": dict(
        policy="threshold",
        cache="elastic",
        refresh_every=0,
        threshold=0.9,
        elastic=dict(gamma=0.9, scope="block"),
    ),
    # CAI-dLLM's budgets and schedule over the Elastic-Cache backend (as cai-es over ES-dLLM's), block-wise.
    "cai-elastic": dict(
        policy="cai", cache="elastic", refresh_every=0, elastic=dict(gamma=0.9, scope="block")
    ),
    # Block-diffusion models' own decoders with their official defaults (docs/block-diffusion.md), on the
    # exact block cache. LLaDA2.x: threshold decoding, block 32, 32 steps per block, threshold 0.95.
    "llada2": dict(policy="dynamic", cache="block", block_length=32, threshold=0.95),
    # LLaDA2.1: threshold decoding with token editing, one forced commit a step (num_to_transfer 1), up to 16
    # editing steps after a block's last mask. "llada2.1": the official generate's defaults (threshold 0.95,
    # editing 0.9, eos_early_stop False); the model card's Q (quality: 0.7 / 0.5) and S (speed: 0.5 / 0.0)
    # modes.
    "llada2.1": dict(
        policy="dynamic",
        cache="block",
        block_length=32,
        editing_threshold=0.9,
        max_post_steps=16,
        early_stop=False,
        threshold=0.95,
        dynamic=dict(num_to_transfer=1),
    ),
    "llada2.1-quality": dict(
        policy="dynamic",
        cache="block",
        block_length=32,
        editing_threshold=0.5,
        max_post_steps=16,
        threshold=0.7,
        dynamic=dict(num_to_transfer=1),
    ),
    "llada2.1-speed": dict(
        policy="dynamic",
        cache="block",
        block_length=32,
        editing_threshold=0.0,
        max_post_steps=16,
        threshold=0.5,
        dynamic=dict(num_to_transfer=1),
    ),
    # LLaDA2.2: InDel decoding (SGLang's JointThresholdInDel defaults, the modeling file's generate() too:
    # threshold 0.5, editing 0, 16 post-edit steps), block 32, on the exact block cache.
    "llada2.2": dict(
        policy="indel",
        cache="block",
        block_length=32,
        threshold=0.5,
        indel=dict(edit_threshold=0.0, max_post_edit_steps=16),
    ),
    # SDAR (generate.py's defaults): block 4, 4 denoising steps per block; low_confidence_dynamic with
    # confidence_threshold 0.85 (JetEngine's example uses 0.9), or low_confidence_static.
    "sdar": dict(policy="dynamic", cache="block", block_length=4, threshold=0.85),
    "sdar-static": dict(policy="static", cache="block", block_length=4),
    # Fast-dLLM v2 (its eval.py's defaults): block 32 (bd_size), sub-blocks of 8, threshold 0.9, on the exact
    # block cache plus the within-block cache of its generator's use_block_cache (cache="block": without it).
    # S2D2 (arXiv 2603.25702, phymhan/S2D2) at the paper's configurations (the repository README's
    # "Configurations used in the paper"), each family's own base rule under the router:
    # SDAR Config-A: block 4, 4 steps, low_confidence_dynamic 0.85, score router tau 0, static, c = 1, the
    # soft entropy estimator, AR-like caching (--cache_ver --draft_ver, policies/s2d2_ar.py).
    "s2d2": dict(
        policy="s2d2",
        cache="block",
        block_length=4,
        threshold=0.85,
        s2d2=dict(
            router="score_threshold",
            score_threshold=0.0,
            score="difference_static",
            penalty=1.0,
            estimator="soft_entropy_negexp",
            cache_ver=True,
            draft_ver=True,
        ),
    ),
    # Fast-dLLM v2 Config-A: block 32, sub-blocks of 4, threshold 0.9, hysteresis on 1 / off -5, dynamic,
    # c = 1, soft entropy.
    "s2d2-fastdllm-v2": dict(
        policy="s2d2",
        cache="block",
        block_length=32,
        threshold=0.9,
        s2d2=dict(
            sub_block=4,
            router="score_hysteresis",
            hysteresis_on=1.0,
            hysteresis_off=-5.0,
            score="difference_dynamic",
            penalty=1.0,
            estimator="soft_entropy_negexp",
        ),
    ),
    # LLaDA2.1-Mini with token editing (_s2d2_llada2): Conservative, then Quality
    "s2d2-llada2": _s2d2_llada2(threshold=0.95, editing_threshold=0.9, score_threshold=-5.0),
    "s2d2-llada2-quality": _s2d2_llada2(threshold=0.7, editing_threshold=0.5, score_threshold=0.0),
    "fastdllm-v2": dict(
        policy="subblock", cache="subblock", block_length=32, threshold=0.9, subblock=dict(sub_block=8)
    ),
}


def block_diffusion_preset(method) -> bool:
    """Whether `method` is a preset that only applies to block-causal models: its policy is one of their
    own decoders (PolicySpec.models); the others run on every family."""
    preset = PRESETS.get(method) if isinstance(method, str) else None
    return preset is not None and POLICIES[preset["policy"]].models == BLOCK_CAUSAL


BLOCK_DIFFUSION_PRESETS = tuple(m for m in PRESETS if block_diffusion_preset(m))


def method_names(block_causal: bool | None = None) -> list[str]:
    """Every preset; with block_causal=False, those a full-sequence model runs (its own
    decoders are the block-diffusion models')."""
    if block_causal is False:
        return [m for m in PRESETS if not block_diffusion_preset(m)]
    return list(PRESETS)


def uses_cai(method: str) -> bool:
    """Whether the preset runs the CAI controller."""
    return PRESETS.get(method, {}).get("policy") == "cai"


def settings_classes(policy: str, cache: str) -> tuple[type, type]:
    """The settings classes of a policy and a cache mode (the no-settings ones for a name unknown, which
    validation then refuses)."""
    spec = POLICIES.get(policy) if isinstance(policy, str) else None
    mode = CACHE_MODES.get(cache) if isinstance(cache, str) else None
    return (spec.settings_type if spec else NoSettings), (mode.settings_type if mode else NoCacheSettings)


def preset_config(
    method: str, file_values: dict | None = None, strict: bool = False, filled=(), **overrides
) -> DecodeConfig:
    """The preset `method` with `overrides` applied (None values are ignored), checked.

    Overrides name a shared DecodeConfig field, a method's settings under its owner's key (cai={...},
    eb={...}) or by a flat name of earlier versions (eb_gamma=, theta_end=: each settings class's
    LEGACY). `file_values`: values (of the same shape) that go over the preset's and under `overrides`
    (a settings file's). A name of a method that does not run is checked and left out; strict: refused,
    naming who reads it, as the server and the CLI do (the Python API's default lets one set of keywords
    run over several methods). filled: the names among `overrides` that are not the caller's (a known
    checkpoint's recommendation, a server's default): their values apply, but they are not `given`.
    """
    if not isinstance(method, str) or method not in PRESETS:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(PRESETS)}", field="method")
    preset = copy.deepcopy(PRESETS[method])
    policy = overrides.get("policy") or preset["policy"]
    cache = overrides.get("cache") or preset["cache"]
    classes = settings_classes(policy, cache)
    parts = split(preset, *classes, counted=False)
    split(copy.deepcopy(file_values or {}), *classes, counted=False, into=parts)
    split({k: v for k, v in overrides.items() if k in filled}, *classes, counted=False, into=parts)
    split({k: v for k, v in overrides.items() if k not in filled}, *classes, into=parts)
    config = DecodeConfig(
        method=method,
        **parts.shared,
        policy_settings=_build(classes[0], parts.policy),
        cache_settings=_build(classes[1], parts.cache),
        given=tuple(sorted(set(parts.given))),
        labels=parts.labels,
        foreign=tuple(parts.foreign),
    )
    config.validate()
    if strict:  # a setting this decoder does not read is refused, not ignored
        refuse_unread(config)
    return config


def _build(cls, values: dict):
    """cls(**values), a JSON list where the field's default is a tuple made a tuple."""
    defaults = cls()
    return cls(
        **{
            k: tuple(v) if isinstance(v, list) and isinstance(getattr(defaults, k), tuple) else v
            for k, v in values.items()
        }
    )


def refuse_unread(config: DecodeConfig) -> None:
    """InputError naming the first setting the caller gave that the config's policy and cache do not
    read (in the mode they run in), and who does read it."""
    config.policy_settings.refuse_unread(config)
    config.cache_settings.refuse_unread(config)
    if "refresh_every" in config.given and not CACHE_MODES[config.cache].refreshes:
        caches = [name for name, mode in CACHE_MODES.items() if mode.refreshes]
        methods = [m for m, p in PRESETS.items() if p["cache"] in caches]
        raise InputError(
            f"refresh_every does not apply to method {config.method!r} (policy {config.policy!r}, "
            f"cache {config.cache!r}): it is read only by {' or '.join(f'cache {c!r}' for c in caches)} "
            f"(methods: {', '.join(methods)})",
            field="refresh_every",
        )
    for name in config.foreign:
        owners = owners_of(name)
        methods = [
            m for m, p in PRESETS.items() if set(settings_classes(p["policy"], p["cache"])) & set(owners)
        ]
        raise not_read(name, config, methods)


def settings_summary(config: DecodeConfig) -> dict:
    """The method's own settings as a report records them: {owner: {field: value}} for the policy and
    cache."""
    return {
        s.OWNER: dataclasses.asdict(s) for s in (config.policy_settings, config.cache_settings) if s.OWNER
    }
