"""Per-step prediction: each masked position's token and its confidence
(paper Box 1), and the per-request sampling seeds."""

from __future__ import annotations

import hashlib
import random

import torch


def row_seed(seed: int, prompt_ids: list[int]) -> int:
    """A request's sampling seed depends on the seed and its own prompt only,
    so its samples do not change with the rest of the batch."""
    digest = hashlib.sha256(f"{seed}:{','.join(map(str, prompt_ids))}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def request_generator(seed: int | None, prompt_ids: list[int], device) -> torch.Generator:
    """The request's own generator. Without a seed a fresh one is drawn from the
    system (never from torch's global RNG, which is the caller's)."""
    base = seed if seed is not None else random.SystemRandom().getrandbits(63)
    return torch.Generator(device=device).manual_seed(row_seed(base, prompt_ids))


def predict(
    logits: torch.Tensor,
    mask_id: int,
    temperature: float,
    generators: list[torch.Generator] | None,
    *,
    consume: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted tokens and their confidences (softmax probability of the
    prediction under the un-noised logits). The mask token is never predicted.
    `logits` is read, never changed, unless `consume=True` (the engine, which owns
    the logits of its forwards: the softmax then runs in place, without a second
    [rows, block, vocab] array).
    With temperature > 0, Gumbel noise in float64 picks the token, one
    generator per row."""
    # float32 logits come back from .float() as the caller's own tensor: rather than copy the
    # whole array, the mask column is set to -inf for the computation and put back afterwards.
    logits = logits.float()
    mask_column = None if consume else logits[..., mask_id].clone()
    logits[..., mask_id] = float("-inf")
    try:
        maxima = logits.amax(dim=-1)
        if temperature == 0:
            predicted, chosen = logits.argmax(dim=-1), maxima
        else:
            predicted = torch.stack(
                [_gumbel_argmax(row, temperature, gen) for row, gen in zip(logits, generators)]
            )
            chosen = logits.gather(-1, predicted[..., None]).squeeze(-1)
        # torch.logsumexp's own arithmetic (shift by the row max, exp, sum, log, add the max back),
        # so the confidences are bit-identical to it; written out, its max doubles as the greedy
        # token's logit and, consumed, the shift needs no temporary (at a 32k vocabulary on this
        # CPU the softmax then takes half the time: it costs as much as a dual step's attention).
        shift = maxima.masked_fill(maxima.abs() == float("inf"), 0)
        shifted = logits.sub_(shift[..., None]) if consume else logits - shift[..., None]
        log_sum = shifted.exp_().sum(dim=-1).log_().add_(shift)
        confidence = torch.exp(chosen - log_sum)
    finally:
        if mask_column is not None:
            logits[..., mask_id] = mask_column
    return predicted, confidence


def _gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    uniform = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=logits.device)
    gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-300)))
    return (logits.double() / temperature + gumbel).argmax(dim=-1)


def token_probability(logits: torch.Tensor, tokens: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[R, n] probability of `tokens` [R, n] under `logits` [R, n, V], the mask token excluded
    (never predicted): WINO's verification of the tokens already drafted."""
    logits = logits.float().clone()
    logits[..., mask_id] = float("-inf")
    return torch.softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
