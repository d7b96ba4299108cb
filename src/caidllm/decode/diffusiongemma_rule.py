"""What a uniform-state decoder decides at each step, after the draws: which positions keep their new
token (the rest are renoised) and whether the canvas ends. The official rule (transformers'
EntropyBoundSampler and StableAndConfidentStoppingCriteria) is `EntropyBoundRule`; a decoder with its own
reading (diffusiongemma_cai.py) derives from it. A rule keeps whatever it needs per canvas on the request
(`r.rule_state`), never on itself: one rule object serves every request of a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def accepted_positions(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """[L] bool: the lowest-entropy positions whose cumulative entropy minus the largest is <= bound."""
    ordered, order = torch.sort(entropy, dim=-1, descending=False)
    chosen = torch.cumsum(ordered, dim=-1) - ordered <= bound
    return torch.zeros_like(chosen).scatter(-1, order, chosen)


@dataclass
class StepDraws:
    """One request's step: the sampled tokens, the argmax and the entropy per position ([L] each)."""

    tokens: torch.Tensor
    argmax: torch.Tensor
    entropy: torch.Tensor


class EntropyBoundRule:
    """The official sampler's acceptance and stopping."""

    def accept(self, r, draws: StepDraws) -> tuple[torch.Tensor, torch.Tensor]:
        """([L] bool accepted, [L] the tokens the accepted positions take) of step r.step."""
        return accepted_positions(draws.entropy, r.settings.entropy_bound), draws.tokens

    def stop(self, r, draws: StepDraws) -> bool:
        """Whether the canvas ends after this step (before max_denoising_steps); reads r.argmax as the
        previous step's argmax. The stability history is recorded at every step, as the reference does."""
        s = r.settings
        if not s.adaptive_stop:
            return False
        return r.stable(draws.argmax) & bool(draws.entropy.mean() < s.confidence_threshold)
