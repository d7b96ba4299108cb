"""S2D2: training-free self-speculation for block-diffusion models (Han et al., "Fast Decoding for Diffusion
LLMs via Training-Free Self-Speculation", arXiv 2603.25702; official code phymhan/S2D2: SDAR/
generate_ssd_policy.py, Fast-dLLM-v2/generate_policy_utils.py, LLaDA2/generate_utils.py).

A block-diffusion model at block size 1 is autoregressive, so the same weights draft and verify. SDAR's
AR-like caching: policies/s2d2_ar.py; LLaDA2.1's token editing with S2D2 (LLaDA2's loop) and its top-k /
top-p: policies/s2d2_editing.py; the router: policies/s2d2_router.py. Each step:
1. draft: the block's forward (the exact block cache) predicts every position (the engine's prediction);
2. the router decides whether to verify the first contiguous run of masks of the block (of the current
   sub-block with Fast-dLLM v2's rule): ``mask_span_length`` (the run is at least ``min_span`` long),
   ``score_threshold`` (score >= ``score_threshold``), ``score_hysteresis`` (on above ``hysteresis_on``,
   off below ``hysteresis_off``, the state kept across the request). The score is E[K] - c (``static``) or
   E[K] - c * (masks above the threshold) (``dynamic``), E[K] = sum_k prod_{i<=k} alpha_i over the run,
   alpha_i from the draft distribution (``estimator``: margin > ``margin_threshold``, exp(-t * normalised
   entropy), or sum p^2);
3. verify (models/selfspec.py: one more forward of the request): the block with its draft filled in, read at
   block size 1; each run position's draft token is accepted with probability min(1, q / p) (q the verify
   distribution, p the draft's), left to right; the first rejected position takes a token drawn from
   (q - p)+ normalised, and the positions after it wait. Committed: the accepted prefix and that token
   (``resample=False``, the official --no_resample: the draft there under SDAR's loop, nothing under Fast-dLLM
   v2's), and with ``ratio_threshold`` >= 0 every later run position whose min(1, q / p) reaches it;
   ``always_check_high_confidence`` then adds every mask left above ``threshold``;
4. fallback, when fewer than the step's quota were committed (or no verification ran): the base rule on
   the rest: SDAR's low_confidence_dynamic / LLaDA2.x's threshold rule (``sub_block`` None: every mask above
   ``threshold`` when at least the quota pass, else the quota's most confident; the quota the schedule's, or
   ``num_to_transfer``), or Fast-dLLM v2's sub-block rule (``sub_block`` given: every mask of the current
   sub-block above ``threshold`` and always the most confident, only when no verification ran).

The acceptance draws are the request's own generator's (seeded by seed and prompt), as the official code
draws from torch's, also at temperature 0. ``acceptance="greedy"`` (a deviation, named in
docs/decoder-fidelity.md) accepts a draft token exactly when it is the verify argmax and puts the verify
argmax at the first rejection: the lossless greedy rule, with no draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch

from caidllm.checks import is_number
from caidllm.decode.policies import s2d2_ar, s2d2_editing
from caidllm.decode.policies.base import PolicySettings, PolicyState, StepView
from caidllm.decode.policies.s2d2_bandit import Bandit
from caidllm.decode.policies.s2d2_router import decide
from caidllm.decode.sampling import request_generator
from caidllm.errors import InputError
from caidllm.setting_rules import (
    BLOCK_CAUSAL,
    UNIT_INTERVAL,
    Rule,
    choice_rule,
    named,
    positive_int,
    unit_interval,
)

ROUTERS = ("mask_span_length", "score_threshold", "score_hysteresis", "contextual_bandit_ucb")
ENTROPY_SOURCES = ("span", "masked")
SCORES = ("difference_dynamic", "difference_static")
ESTIMATORS = ("hard_margin_threshold", "soft_entropy_negexp", "soft_renyi_2_entropy")
ACCEPTANCE = ("official", "greedy")


def _number(v) -> bool:
    return is_number(v)


def _optional_count(v) -> bool:
    return v is None or positive_int(v)


@dataclass
class S2D2Settings(PolicySettings):
    """The base rule's threshold and quota (or Fast-dLLM v2's sub-block), the router and the acceptance.
    Defaults: SDAR/generate_ssd_policy.py's ``block_diffusion_generate`` signature (the router verifies every
    step: mask_span_length with min_span 1); the presets (decode/methods.py) carry the paper's
    configurations (the repository README's "Configurations used in the paper")."""

    threshold: float = 0.85  # confidence_threshold
    num_to_transfer: int | None = None  # LLaDA2.x's fixed quota (None: the schedule, SDAR's)
    sub_block: int | None = None  # Fast-dLLM v2's small_block_size (None: the block rule)
    router: str = "mask_span_length"  # do_verify_policy
    min_span: int = 1  # min_ssd_span_length
    score_threshold: float = -1.0  # do_verify_score_threshold
    hysteresis_on: float = 0.0  # hysteresis_threshold_on
    hysteresis_off: float = -1.0  # hysteresis_threshold_off
    score: str = "difference_dynamic"  # do_verify_score_type
    penalty: float = 2.0  # score_penalty_coef
    estimator: str = "hard_margin_threshold"  # token_acceptance_estimator
    margin_threshold: float = 0.05  # ssd_confidence_margin_threshold
    entropy_temperature: float = 1.0  # ssd_entropy_temperature
    tempering: float = 1.0  # ssd_ratio_tempering_factor
    acceptance: str = "official"  # caidllm's switch: "greedy" is the deterministic greedy rule
    resample: bool = True  # allow_resample (False: --no_resample)
    ratio_threshold: float = -1.0  # ssd_ratio_threshold (< 0: off; the block rule only)
    ratio_all_masks: bool = False  # ssd_threshold_all_spans: the ratio threshold over every mask left
    always_check_high_confidence: bool = False  # the block rule only
    ucb_beta: float = 1.0  # the bandit router's exploration coefficient
    ucb_span_bins: int = 2  # ucb_span_length_bins
    ucb_progress_bins: int = 2  # ucb_block_progress_bins
    ucb_entropy_bins: int = 2
    ucb_entropy_source: str = "span"  # "span" (the run) or "masked" (every mask of the block)
    top_k: int = 0  # with token editing at temperature 0 (policies/s2d2_editing.py); 0: off
    top_p: float = 1.0  # the same; 1: off
    cache_ver: bool = False  # AR-like caching (policies/s2d2_ar.py): earlier blocks' K/V token-causal
    draft_ver: bool = False  # the draft reads the block's decoded prefix token-causally

    OWNER: ClassVar[str] = "s2d2"
    TITLE: ClassVar[str] = "S2D2 self-speculative block diffusion (arXiv 2603.25702)"
    LEGACY: ClassVar[dict[str, str]] = {"threshold": "threshold"}
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("threshold", UNIT_INTERVAL, unit_interval),
        Rule(
            "num_to_transfer",
            "an integer >= 1 (or None: the schedule)",
            lambda v: v is None or positive_int(v),
        ),
        Rule(
            "sub_block", "an integer >= 1 (or None: the block rule)", lambda v: v is None or positive_int(v)
        ),
        choice_rule("router", ROUTERS, models=BLOCK_CAUSAL, about="S2D2's router"),
        Rule("min_span", "an integer >= 1", positive_int),
        Rule("score_threshold", "a finite number", _number),
        Rule("hysteresis_on", "a finite number", _number),
        Rule("hysteresis_off", "a finite number", _number),
        choice_rule("score", SCORES),
        Rule("penalty", "a finite number", _number),
        choice_rule("estimator", ESTIMATORS),
        Rule("margin_threshold", "a finite number", _number),
        Rule("entropy_temperature", "a finite number", _number),
        Rule("tempering", "a finite number > 0", lambda v: is_number(v) and v > 0),
        choice_rule("acceptance", ACCEPTANCE),
        Rule("resample", "true or false", lambda v: isinstance(v, bool)),
        Rule("ratio_threshold", "a finite number", _number),
        Rule("always_check_high_confidence", "true or false", lambda v: isinstance(v, bool)),
        Rule("ratio_all_masks", "true or false", lambda v: isinstance(v, bool)),
        Rule("ucb_beta", "a finite number", _number),
        Rule("ucb_span_bins", "an integer >= 1", positive_int),
        Rule("ucb_progress_bins", "an integer >= 1", positive_int),
        Rule("ucb_entropy_bins", "an integer >= 1", positive_int),
        choice_rule("ucb_entropy_source", ENTROPY_SOURCES),
        Rule("top_k", "an integer >= 0 (0: off)", lambda v: v == 0 or positive_int(v)),
        Rule("top_p", UNIT_INTERVAL, unit_interval),
        Rule("cache_ver", "true or false", lambda v: isinstance(v, bool)),
        Rule("draft_ver", "true or false", lambda v: isinstance(v, bool)),
    )

    def check_with(self, config) -> None:
        if self.router == "score_hysteresis" and not self.hysteresis_on > self.hysteresis_off:
            name, field_ = named(config.labels, "s2d2.hysteresis_on")
            raise InputError(
                f"{name} ({self.hysteresis_on}) must be greater than s2d2.hysteresis_off "
                f"({self.hysteresis_off})",
                field=field_,
            )
        if self.sub_block is not None and config.block_length % self.sub_block:
            name, field_ = named(config.labels, "s2d2.sub_block")
            raise InputError(
                f"{name} ({self.sub_block}) must divide block_length ({config.block_length})", field=field_
            )
        block_only = {
            "ratio_threshold": self.ratio_threshold >= 0,
            "always_check_high_confidence": self.always_check_high_confidence,
            "router": self.router == "contextual_bandit_ucb",  # Fast-dLLM v2's bandit not re-stated here
        }
        for key in (k for k, on in block_only.items() if on and self.sub_block is not None):
            name, field_ = named(config.labels, f"s2d2.{key}")  # Fast-dLLM v2's loop has no such option
            raise InputError(
                f"{name}={getattr(self, key)!r} does not apply with s2d2.sub_block (Fast-dLLM v2's rule)",
                field=field_,
            )
        if config.cache == "none":  # the verify forward reads the earlier blocks' K/V from the exact cache
            raise InputError(
                "cache='none' does not apply to S2D2: its verify forward reads the earlier blocks' keys and "
                "values from the exact block cache (cache 'block')",
                field="cache",
            )
        s2d2_ar.check_settings(self, config)
        if config.editing_threshold is not None:
            s2d2_editing.check_editing(self, config)
        s2d2_editing.check_filters(self, config)

    def arguments(self, gating: bool) -> dict:
        return dict(settings=self)

    def causal_span(self):
        on = self.cache_ver or self.draft_ver
        return (
            partial(s2d2_ar.causal_span, cache_ver=self.cache_ver, draft_ver=self.draft_ver) if on else None
        )

    def check_model(self, config, model) -> None:
        s2d2_ar.check_model(self, config, model.family)


@dataclass
class S2D2State(PolicyState):
    """A request's acceptance draws (its own generator) and the hysteresis router's switch, kept across
    its blocks as the official loop keeps it across the generation."""

    generator: torch.Generator | None = None
    on: bool = False
    prompt_length: int = 0
    bandit: Bandit | None = None  # the bandit router's counts, made at its first decision
    draft_prefix: torch.Tensor | None = None  # draft_ver alone: the block's decoded prefix at its last step


def new_state(config, prompt: list[int]) -> S2D2State:
    return S2D2State(request_generator(config.seed or 0, prompt, "cpu"), prompt_length=len(prompt))


# ---- verification -------------------------------------------------------------------------------


def accepted_run(
    q: torch.Tensor, p: torch.Tensor, draft: torch.Tensor, s: S2D2Settings, gen, residual_p=None
) -> dict[int, int]:
    """Run offset -> token to commit: the accepted drafts, then at the first rejection a token from
    (q - p)+ (``resample``; else the draft there, or nothing under Fast-dLLM v2's rule), then the later
    drafts whose ratio reaches ``ratio_threshold`` (q, p [S, V] the verify and draft distributions, draft [S]
    the drafted tokens; residual_p: the draft's for the residual where it differs, LLaDA2's top-k / top-p)."""
    ratios = acceptance_ratios(q, p, draft, s)
    if s.acceptance == "greedy":
        best = q.argmax(dim=-1)
        accepted = (best == draft).tolist()
    else:
        accepted = (torch.rand(ratios.shape[0], generator=gen, dtype=ratios.dtype) < ratios).tolist()
    n = accepted.index(False) if False in accepted else len(accepted)
    picks = dict(enumerate(draft[:n].tolist()))
    if n == len(accepted):
        return picks
    if not s.resample:
        if s.sub_block is None:  # SDAR's loop commits the rejected draft; Fast-dLLM v2's leaves it masked
            picks[n] = int(draft[n])
    elif s.acceptance == "greedy":
        picks[n] = int(best[n])
    else:
        picks[n] = residual_draw(q[n], (p if residual_p is None else residual_p)[n], gen)
    if s.ratio_threshold >= 0:
        picks |= {
            k: int(draft[k]) for k in range(n + 1, len(accepted)) if float(ratios[k]) >= s.ratio_threshold
        }
    return picks


def acceptance_ratios(q: torch.Tensor, p: torch.Tensor, draft: torch.Tensor, s: S2D2Settings) -> torch.Tensor:
    """[S] min(1, (q / p) ** tempering) at the drafted tokens (on the CPU, where the draws are)."""
    p_sel = p.gather(-1, draft[:, None]).squeeze(-1).clamp_min(1e-12)
    q_sel = q.gather(-1, draft[:, None]).squeeze(-1).clamp_min(0.0)
    return (q_sel / p_sel if s.tempering == 1.0 else (q_sel / p_sel) ** s.tempering).clamp(max=1.0).cpu()


def residual_draw(q: torch.Tensor, p: torch.Tensor, gen) -> int:
    """A token from (q - p)+ normalised; from q where that has no mass (the official fallback)."""
    delta = (q - p).clamp_min(0.0).cpu()
    z = float(delta.sum())
    if z <= 0.0 or not torch.isfinite(delta).all():
        return int(torch.multinomial(q.clamp_min(0).float().cpu(), 1, generator=gen))
    return int(torch.multinomial((delta / z).float(), 1, generator=gen))


# ---- one step -----------------------------------------------------------------------------------


def first_run(candidates: list[bool]) -> list[int]:
    """Positions of the first contiguous run of True."""
    if True not in candidates:
        return []
    start = candidates.index(True)
    end = candidates.index(False, start) if False in candidates[start:] else len(candidates)
    return list(range(start, end))


def distributions(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The official _probs_from_logits at temperature 0 (softmax) or t (softmax of logits / t)."""
    return torch.softmax(logits / temperature if temperature > 1e-6 else logits, dim=-1, dtype=torch.float32)


def select(view: StepView, settings: S2D2Settings) -> torch.Tensor:
    commit = torch.zeros_like(view.masked)
    tokens = view.predicted.clone()
    for i in range(view.masked.shape[0]):
        picks = row_step(view, i, settings)
        for b, token in picks.items():
            commit[i, b] = True
            tokens[i, b] = token
    view.tokens = tokens
    return commit


def row_step(view: StepView, i: int, s: S2D2Settings) -> dict[int, int]:
    """Block position -> token committed this step for row i."""
    masked = view.masked[i].tolist()
    if s.sub_block is not None and masked[0]:  # Fast-dLLM v2: a block opens with its autoregressive token
        return {0: int(view.predicted[i, 0])}
    region = masked if s.sub_block is None else current_sub_block(masked, s.sub_block)
    state, spec = view.policy_states[i], view.self_spec
    probs = distributions(spec.logits[i], spec.temperature)
    shaped = s2d2_editing.filtered(spec.logits[i], s) if s2d2_editing.filters(s) else probs  # top-k / top-p
    run = first_run(region)
    confident = [b for b, m in enumerate(region) if m and float(view.confidence[i, b]) > s.threshold]
    picks: dict[int, int] = {}
    # The score routers decide at every step (LLaDA2's loop: also at an editing step with no mask left, where
    # the hysteresis switch turns off); the bandit only when there is a run to verify.
    routed = bool(run) or s.router != "contextual_bandit_ucb"
    verify = routed and decide(shaped, run, masked, len(confident), s, state) and bool(run)
    if verify:
        filled = view.masked[i] if spec.edits is None else view.masked[i] | spec.edits[i]  # edits verified
        drafted = torch.where(filled, view.predicted[i], spec.block[i])
        logits = spec.verify(i, drafted)
        q = (
            s2d2_editing.filtered(logits, s)
            if s2d2_editing.filters(s)
            else distributions(logits, spec.temperature)
        )
        accepted = accepted_run(q[run], probs[run], view.predicted[i, run], s, state.generator, shaped[run])
        picks = {run[k]: token for k, token in accepted.items()}
        if s.ratio_threshold >= 0 and s.ratio_all_masks:  # every other mask left, by its own ratio
            picks |= ratio_picks(
                q, probs, view.predicted[i], [b for b, m in enumerate(masked) if m and b not in picks], s
            )
        if s.sub_block is not None and picks:
            return picks
    if s.always_check_high_confidence:  # every mask left above the threshold, verified or not
        picks |= {b: int(view.predicted[i, b]) for b in confident if b not in picks}
    picks |= fallback(view, i, s, region, picks)
    if state.bandit is not None:
        state.bandit.reward(len(picks), verify)
    return picks


def ratio_picks(q, p, predicted, positions: list[int], s: S2D2Settings) -> dict[int, int]:
    """The positions whose min(1, q / p) reaches ``ratio_threshold``, with their drafts."""
    if not positions:
        return {}
    ratios = acceptance_ratios(q[positions], p[positions], predicted[positions], s).tolist()
    return {b: int(predicted[b]) for b, r in zip(positions, ratios) if r >= s.ratio_threshold}


def current_sub_block(masked: list[bool], size: int) -> list[bool]:
    first = masked.index(True)
    lo = first - first % size
    return [lo <= b < lo + size and m for b, m in enumerate(masked)]


def fallback(view: StepView, i: int, s: S2D2Settings, region: list[bool], picks: dict) -> dict[int, int]:
    """The base rule over the masks left, when the step committed fewer than its quota."""
    left = [b for b, m in enumerate(region) if m and b not in picks]
    conf = {b: float(view.confidence[i, b]) for b in left}
    above = [b for b in left if conf[b] > s.threshold]
    if s.sub_block is not None:  # Fast-dLLM v2: every mask above the threshold, always the most confident
        chosen = set(above) | {max(left, key=lambda b: (conf[b], -b))}
    else:
        quota = s.num_to_transfer or block_quota(view)
        k = min(quota, sum(view.masked[i].tolist())) - len(picks)
        if k <= 0:
            return {}
        k = min(k, len(left))
        chosen = set(above) if len(above) >= k else set(sorted(left, key=lambda b: (-conf[b], b))[:k])
    return {b: int(view.predicted[i, b]) for b in chosen}


def block_quota(view: StepView) -> int:
    """The transfer schedule's share of the block at this step (SDAR's get_num_transfer_tokens)."""
    n, t = view.block_length, view.total_steps
    return n // t + (view.step < n % t)
