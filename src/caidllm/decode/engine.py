"""The one denoising loop shared by every method.

Canvas = left-padded prompts + gen_length mask tokens, decoded block by block,
left to right, at most T steps per block. At each step the model runs (a full
forward without a cache, or a cached forward that recomputes only part of the
canvas), each masked position gets a predicted token and its confidence, and
the policy picks which to commit. Cache refreshes happen at each block start
and every f steps. With cache="es" the other steps are early-skip forwards
(models/skip.py): the engine hands the model each row's confidences and
commits of the previous step, which rank the positions worth recomputing.
Rows are independent: a row that finished its block (or its whole answer,
with early stop) is left out of later forwards, and nothing a row computes
depends on the other rows of the batch.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import torch

from caidllm.decode.config import DecodeConfig
from caidllm.decode.policies import StepView, make_policy
from caidllm.models.skip import EarlySkip


@dataclass
class BatchOutput:
    """Per-row results of one batch, as tensors (api.py turns them into results)."""

    generated: torch.Tensor  # [B, G] token ids of the generated region
    nfe: torch.Tensor  # [B] forward passes each row took part in
    steps_per_block: torch.Tensor  # [B, num_blocks] steps each row spent in each block
    commit_step: torch.Tensor  # [B, G] global step at which each position was committed (-1: filled by early stop)
    commit_step_in_block: torch.Tensor  # [B, G] the same, counted within the block
    first_confidence: torch.Tensor  # [B, G] s_i, NaN for blocks never run
    early_stopped: torch.Tensor  # [B] True when the answer ended and the rest was filled with EOS
    # [B] (layer, block position) pairs the row's forwards ran / n_layers * block_length per forward it took
    # part in: 1.0 for every mode but "es". Refreshes count as full steps; prompt and suffix work is not counted.
    computed_fraction: torch.Tensor
    elapsed_s: float
    controller_s: float  # time spent in the policy (the CAI controller) for the whole batch


class PolicyTimer:
    """Time spent in the commit policy. On CUDA, events around each call are
    read once at the end, so the timing adds no host sync to the step."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.seconds = 0.0
        self.events: list = []

    def __enter__(self):
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._tick = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._start, end))
        else:
            self.seconds += time.perf_counter() - self._tick

    def total(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            self.seconds += sum(start.elapsed_time(end) for start, end in self.events) / 1000
            self.events.clear()
        return self.seconds


def row_seed(seed: int, prompt_ids: list[int]) -> int:
    """A row's sampling seed depends on the seed and its own prompt only,
    so its samples do not change with the rest of the batch."""
    digest = hashlib.sha256(f"{seed}:{','.join(map(str, prompt_ids))}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def predict(logits: torch.Tensor, mask_id: int, temperature: float,
            generators: list[torch.Generator] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted tokens and their confidences (softmax probability of the
    prediction under the un-noised logits). The mask token is never predicted.
    With temperature > 0, Gumbel noise in float64 picks the token, one
    generator per row."""
    logits = logits.float()
    logits[..., mask_id] = float("-inf")
    if temperature == 0:
        predicted = logits.argmax(dim=-1)
    else:
        predicted = torch.stack([
            _gumbel_argmax(row, temperature, gen) for row, gen in zip(logits, generators)
        ])
    chosen = logits.gather(-1, predicted[..., None]).squeeze(-1)
    confidence = torch.exp(chosen - torch.logsumexp(logits, dim=-1))
    return predicted, confidence


def _gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    uniform = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=logits.device)
    gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-300)))
    return (logits.double() / temperature + gumbel).argmax(dim=-1)


def answer_complete(generated: torch.Tensor, mask_id: int, eos_ids: torch.Tensor) -> torch.Tensor:
    """[B] True when an end token is committed with every position before it committed."""
    no_mask_before = torch.cumsum(generated == mask_id, dim=1) == 0
    return (torch.isin(generated, eos_ids) & no_mask_before).any(dim=1)


def fill_after_first_end(generated: torch.Tensor, eos_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Every position after the first end token becomes EOS."""
    is_end = torch.isin(generated, eos_ids).long()
    after_end = torch.cumsum(is_end, dim=1) - is_end > 0
    return generated.masked_fill(after_end, eos_id)


def run_batch(lm, prompts: list[list[int]], config: DecodeConfig, *, gating: bool, refresh_every: int) -> BatchOutput:
    """Decode one batch of tokenised prompts. `gating` and `refresh_every` are
    already resolved against the model's defaults by the caller."""
    device = lm.device
    mask_id, eos_id = lm.config.mask_id, lm.config.eos_id
    eos_ids = torch.tensor(sorted(lm.config.eos_ids), device=device)
    B, G, bl = len(prompts), config.gen_length, config.block_length
    P = max(len(p) for p in prompts)
    L = P + G
    T = config.steps_per_block

    canvas = torch.full((B, L), lm.config.pad_id, dtype=torch.long, device=device)
    attention = torch.zeros((B, L), dtype=torch.bool, device=device)
    for r, ids in enumerate(prompts):
        canvas[r, P - len(ids):P] = torch.tensor(ids, dtype=torch.long, device=device)
        attention[r, P - len(ids):] = True
    canvas[:, P:] = mask_id

    generators = None
    if config.temperature > 0:
        base = config.seed if config.seed is not None else int(torch.seed())
        generators = [torch.Generator(device=device).manual_seed(row_seed(base, ids)) for ids in prompts]

    policy, state_names = make_policy(config, gating)
    cache = None
    if config.cache != "none":
        cache = lm.new_cache(B, L, skip_schedule=config.es_schedule if config.cache == "es" else None)
    step_pairs = lm.config.n_layers * bl  # (layer, block position) pairs of a step without skipping

    nfe = torch.zeros(B, dtype=torch.long, device=device)
    steps_per_block = torch.zeros((B, config.num_blocks), dtype=torch.long, device=device)
    commit_step = torch.full((B, G), -1, dtype=torch.long, device=device)
    commit_local = torch.full((B, G), -1, dtype=torch.long, device=device)
    first_conf = torch.full((B, G), float("nan"), device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    steps_before_block = torch.zeros(B, dtype=torch.long, device=device)
    computed_pairs = torch.zeros(B, dtype=torch.long, device=device)
    # The previous step as seen by each row (early skipping ranks positions with it); set by the
    # block's first step, which is always a refresh.
    prev_confidence = torch.zeros((B, bl), device=device)
    just_committed = torch.zeros((B, bl), dtype=torch.bool, device=device)
    policy_timer = PolicyTimer(device)

    started = time.perf_counter()
    for b in range(config.num_blocks):
        start, end = P + b * bl, P + (b + 1) * bl
        gs, ge = start - P, end - P  # the block inside the generated region
        state = {name: torch.zeros(B, dtype=torch.long, device=device) for name in state_names}
        block_done = finished.clone()
        for t in range(T):
            active = (~block_done).nonzero().squeeze(1)
            if active.numel() == 0:
                break
            rows = None if active.numel() == B else active
            block = canvas[active, start:end]
            masked = block == mask_id
            # No cache, or a refresh (block start, every f steps): a full forward (filling the cache if any).
            refresh = cache is None or t == 0 or (refresh_every > 0 and t % refresh_every == 0)
            mode = "full" if refresh else config.cache
            skip = None
            if mode == "es":
                skip = EarlySkip(prev_confidence[active], just_committed[active], masked,
                                 config.es_schedule, config.es_alpha)
            logits = lm.forward(canvas, attention, mode=mode, cache=cache, start=start, end=end, rows=rows, skip=skip)
            nfe[active] += 1
            computed_pairs[active] += step_pairs if skip is None else skip.computed_pairs
            row_generators = None if generators is None else [generators[i] for i in active.tolist()]
            predicted, confidence = predict(logits, mask_id, config.temperature, row_generators)

            if t == 0:
                first_conf[active, gs:ge] = confidence
            view = StepView(confidence=confidence, predicted=predicted, masked=masked,
                            first_confidence=first_conf[active, gs:ge], step=t, total_steps=T,
                            block_index=b, rows=active, state=state)
            with policy_timer:
                commit = policy(view) & masked
            if t == T - 1:  # the last step commits whatever is left: no mask ever leaves the engine
                commit = masked

            canvas[active, start:end] = torch.where(commit, predicted, block)
            prev_confidence[active], just_committed[active] = confidence, commit
            global_step = (steps_before_block[active] + t)[:, None]
            commit_step[active, gs:ge] = torch.where(commit, global_step, commit_step[active, gs:ge])
            commit_local[active, gs:ge] = torch.where(commit, torch.full_like(global_step, t), commit_local[active, gs:ge])
            steps_per_block[active, b] += 1
            block_done[active] = ~(canvas[active, start:end] == mask_id).any(dim=1)

            if config.early_stop:
                generated = canvas[active, P:]
                complete = answer_complete(generated, mask_id, eos_ids)
                if complete.any():
                    done = active[complete]
                    canvas[done, P:] = fill_after_first_end(canvas[done, P:], eos_ids, eos_id)
                    finished[done] = True
                    block_done[done] = True
        steps_before_block += steps_per_block[:, b]

    controller_s = policy_timer.total()  # synchronises the device, so the clock below is honest
    return BatchOutput(
        generated=canvas[:, P:].clone(), nfe=nfe, steps_per_block=steps_per_block,
        commit_step=commit_step, commit_step_in_block=commit_local, first_confidence=first_conf,
        early_stopped=finished, elapsed_s=time.perf_counter() - started, controller_s=controller_s,
        computed_fraction=computed_pairs.double() / (nfe * step_pairs).clamp_min(1),
    )
