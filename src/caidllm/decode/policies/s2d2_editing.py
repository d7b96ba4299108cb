"""S2D2 with LLaDA2.1's token editing: LLaDA2's loop (phymhan/S2D2 LLaDA2/generate_utils.py
``generate_ssd_policy``, the paper's LLaDA2.1-Mini configurations).

Each step the engine's token editing (decode/block_diffusion.py: ``edits``) rewrites committed positions of
the block that are not the prompt's, whose draft differs with probability above ``editing_threshold``;
the edits are made before verification, and the verify forward reads the block with the draft filled in
and the edits applied (decode/runner.py: SelfSpec.edits). The router decides at every step, an editing
step with no mask left too (there the score is -inf: the hysteresis switch turns off), the fallback fills
the fixed quota (``num_to_transfer``, the edits not counted), and a block ends by the editing rule
(``max_post_steps``). The loop has none of SDAR's extra options: they are refused with editing.

Its top-k / top-p (``s2d2.top_k``, ``s2d2.top_p``): its ``_probs_from_logits`` filters the logits at
temperature 0 too, so there they shape the router's estimates, the verify distribution q and the draft's
distribution in the residual (q - p)+ at a rejection, not the draft token (the argmax) nor its probability
in min(1, q / p) (the unfiltered softmax). SDAR's loop filters only when sampling, and the engine's draft
sampling has no top-k / top-p: they are refused without editing and at temperature > 0.
"""

from __future__ import annotations

import torch

from caidllm.errors import InputError
from caidllm.setting_rules import named

# SDAR's options that LLaDA2's loop (the one with token editing) has not: refused with editing_threshold.
NOT_IN_LLADA2 = {
    "ratio_threshold": lambda s: s.ratio_threshold >= 0,
    "always_check_high_confidence": lambda s: s.always_check_high_confidence,
    "resample": lambda s: not s.resample,
    "router": lambda s: s.router == "contextual_bandit_ucb",
    "sub_block": lambda s: s.sub_block is not None,
    "cache_ver": lambda s: s.cache_ver,
    "draft_ver": lambda s: s.draft_ver,
    "num_to_transfer": lambda s: s.num_to_transfer is None,
}


def check_editing(s, config) -> None:
    """Token editing with S2D2 is LLaDA2's loop (LLaDA2/generate_utils.py ``generate_ssd_policy``): its
    fixed quota, no option of SDAR's or Fast-dLLM v2's loop; InputError naming the field."""
    for key, on in NOT_IN_LLADA2.items():
        if on(s):
            name, field_ = named(config.labels, f"s2d2.{key}")
            value = getattr(s, key)
            raise InputError(
                f"{name}={value!r} does not apply with editing_threshold: S2D2 with token editing is "
                "LLaDA2's loop (LLaDA2/generate_utils.py), which has no such option"
                + (" (it needs a fixed quota)" if key == "num_to_transfer" else ""),
                field=field_,
            )


def filters(s) -> bool:
    return s.top_k > 0 or s.top_p < 1.0


def filtered(logits: torch.Tensor, s) -> torch.Tensor:
    """LLaDA2's _probs_from_logits at temperature 0: the logits [..., V] outside the top_k largest set to
    -inf, then those outside the smallest prefix (by descending logit) whose probability exceeds top_p (the
    first always kept), then the float32 softmax."""
    if s.top_k > 0:
        kth = logits.topk(min(s.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)
    if s.top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        beyond = torch.softmax(ordered, dim=-1).cumsum(dim=-1) > s.top_p
        beyond[..., 1:] = beyond[..., :-1].clone()
        beyond[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(beyond).scatter(-1, order, beyond), float("-inf"))
    return torch.softmax(logits, dim=-1, dtype=torch.float32)


def check_filters(s, config) -> None:
    """top_k / top_p only where the official loop reads them and the engine can: LLaDA2's (token editing)
    at temperature 0; InputError naming the field."""
    if not filters(s):
        return
    name, field_ = named(config.labels, "s2d2.top_k" if s.top_k > 0 else "s2d2.top_p")
    if config.editing_threshold is None:
        raise InputError(
            f"{name} applies with token editing (editing_threshold: LLaDA2's loop, which filters at "
            "temperature 0 too); SDAR's loop filters only when sampling, which the engine's draft does "
            "without top-k / top-p",
            field=field_,
        )
    if config.temperature > 0:
        raise InputError(
            f"{name} applies at temperature 0 here: the engine's draft sampling has no top-k / top-p",
            field=field_,
        )
