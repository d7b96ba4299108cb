"""One denoising step of the uniform-state decoders over a batch of requests (DiffusionGemma's
entropy-bound sampler, as transformers' EntropyBoundSampler / LinearTemperatureScheduleLogitsProcessor /
StableAndConfidentStoppingCriteria do it at batch 1, each request with its own generator):

1. one decoder forward over every request's canvas, reading each one's cache, with its self-conditioning;
2. per request: logits / T(step) (linear schedule from t_max at the first step towards t_min), a token
   per position sampled (``greedy``: the argmax), the per-position entropy;
3. accept the lowest-entropy positions while (sum of their entropies - the largest) <= entropy_bound;
   every other position is renoised with a fresh uniformly random token;
4. stop the canvas when its argmax is unchanged over stability_threshold steps and the mean entropy
   is under confidence_threshold (or after max_denoising_steps); its output is the argmax canvas;
   (3 and 4 are the decoder's rule: decode/diffusiongemma_rule.py, a CAI-style one in diffusiongemma_cai.py)
5. the scaled logits become the next step's self-conditioning (kept as soft embeddings, [L, hidden]).

Memory: the forward's float32 logits [B, L, V] are the one full-size tensor; the temperature divides
them in place, and the probabilities, the exponential draws of the sampling and the entropies'
temporaries exist `sample_chunk` positions at a time (the draws equal one whole-canvas multinomial's).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.distributions import Categorical

from caidllm.decode.diffusiongemma_rule import StepDraws
from caidllm.decode.diffusiongemma_state import CanvasRequest
from caidllm.decode.uniform_decoders import UNIFORM_DECODERS
from caidllm.models.diffusion_gemma_cache import DecoderView


def temperature(r: CanvasRequest) -> torch.Tensor:
    """t_min + (t_max - t_min) * cur_step / N, in float32 as the reference computes it (cur_step an int32
    tensor divided by N)."""
    s = r.settings
    fraction = torch.tensor(r.cur_step, dtype=torch.int32) / s.max_denoising_steps
    return s.t_min + (s.t_max - s.t_min) * fraction


def draw(scaled: torch.Tensor, generator: torch.Generator, sample: bool, chunk: int):
    """(sampled tokens [L], argmax [L], entropy [L]) of scaled logits [L, V], chunk rows at a time."""
    L = scaled.shape[0]
    tokens = torch.empty(L, dtype=torch.long, device=scaled.device)
    argmax = torch.empty_like(tokens)
    entropy = torch.empty(L, dtype=torch.float32, device=scaled.device)
    for s in range(0, L, chunk):
        part = scaled[s : s + chunk]
        if sample:
            probs = torch.softmax(part, dim=-1, dtype=torch.float32)
            tokens[s : s + chunk] = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
            del probs
        argmax[s : s + chunk] = part.argmax(dim=-1)
        entropy[s : s + chunk] = Categorical(logits=part, validate_args=False).entropy()
    if not sample:
        tokens = argmax
    return tokens, argmax, entropy


@torch.no_grad()
def denoise_step(model, requests: list[CanvasRequest], forward_time=nullcontext) -> list[bool]:
    """One step of every request's canvas (one batched decoder forward); whether each one's canvas ended.
    forward_time: a context manager around the forwards (the decoder's, the self-conditioning embeddings)."""
    view = DecoderView.batch([r.cache for r in requests])
    canvas = torch.stack([r.canvas for r in requests])
    soft = None
    if any(r.soft is not None for r in requests):  # a first step's self-conditioning is zero
        soft = torch.stack(
            [
                r.soft
                if r.soft is not None
                else torch.zeros_like(next(q.soft for q in requests if q.soft is not None))
                for r in requests
            ]
        )
    with forward_time():
        logits = model.denoise(canvas, view, soft)
    return [_update(model, r, logits[i], forward_time) for i, r in enumerate(requests)]


def _update(model, r: CanvasRequest, logits: torch.Tensor, forward_time=nullcontext) -> bool:
    s = r.settings
    decoder = UNIFORM_DECODERS[s.method]
    scaled = logits.div_(temperature(r))  # the forward's own tensor: no second [L, V] copy
    draws = StepDraws(*draw(scaled, r.generator, decoder.sample, s.sample_chunk))
    accept, tokens = decoder.rule.accept(r, draws)
    shape = (1, r.canvas_length)
    noise = torch.randint(0, r.vocab_size, shape, generator=r.generator, device=tokens.device)[0]
    r.canvas, r.accepted = torch.where(accept, tokens, noise), accept  # accepted: the draft stream's
    stop = decoder.rule.stop(r, draws)  # reads r.argmax: the previous step's
    r.step += 1
    r.nfe += 1
    r.argmax = draws.argmax
    with forward_time():  # the next step's self-conditioning input: a [L, V] x [V, D] product
        r.soft = model.soft_embeddings(scaled[None], chunk=s.sample_chunk)[0]
    return stop or r.step >= s.max_denoising_steps
