"""`generate`: prompts in, answers with their decoding statistics out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

from caidllm.decode.config import DecodeConfig
from caidllm.decode.engine import BatchOutput, run_batch
from caidllm.decode.presets import build_config
from caidllm.errors import InputError


@dataclass
class Trace:
    """Per generated position: when it was committed and how confident the
    model was about it at its block's first step."""

    commit_step: list[int]  # global step (steps of earlier blocks included); -1 = filled by early stop
    commit_step_in_block: list[int]  # local step t within the block; -1 = filled by early stop
    first_confidence: list[float | None]  # s_i; None for blocks never run (early stop)


@dataclass
class GenerationResult:
    text: str  # the answer, up to the first end token
    token_ids: list[int]  # every generated position (prompt excluded), end tokens included
    answer_length: int  # answer tokens: generated positions before the first end token
    nfe: int  # forward passes this row took part in
    steps_per_block: list[int]
    elapsed_s: float  # wall time of the batch this prompt was decoded in
    controller_s: float  # of which in the commit policy (whole batch)
    early_stopped: bool
    method: str
    prompt_length: int
    trace: Trace = field(repr=False)
    # Share of the (layer, block position) work of the row's steps actually run: < 1.0 only with early
    # skipping (cache "es"); refresh steps count in full. See BatchOutput.computed_fraction.
    computed_fraction: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def generate(lm, prompts, method: str = "cai", gen_length: int = 256, block_length: int = 64,
             steps: int | None = None, cache: str | None = None, threshold: float | None = None,
             temperature: float = 0.0, seed: int | None = None, early_stop: bool = True,
             batch_size: int = 8, chat: bool = True, **overrides) -> list[GenerationResult]:
    """Decode `prompts` (strings, or lists of token ids used as given) with a
    method preset; any keyword given overrides the preset's value."""
    config = build_config(method, gen_length=gen_length, block_length=block_length, steps=steps, cache=cache,
                          threshold=threshold, temperature=temperature, seed=seed, early_stop=early_stop,
                          **overrides)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    token_prompts = tokenize_prompts(lm, prompts, chat)
    check_canvas_fits(lm, token_prompts, config)
    gating = lm.config.confidence_gating if config.cai.gating is None else config.cai.gating
    refresh_every = lm.config.cache_refresh_every if config.refresh_every is None else config.refresh_every

    results: list[GenerationResult] = []
    for first in range(0, len(token_prompts), batch_size):
        batch = token_prompts[first:first + batch_size]
        output = run_batch(lm, batch, config, gating=gating, refresh_every=refresh_every)
        results.extend(_results_of(lm, batch, output, config))
    return results


def tokenize_prompts(lm, prompts, chat: bool) -> list[list[int]]:
    if isinstance(prompts, str) or _is_id_list(prompts):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise InputError("prompts must be a non-empty list of strings or of token-id lists")
    kinds = {"text" if isinstance(p, str) else "ids" if _is_id_list(p) else "other" for p in prompts}
    if "other" in kinds:
        bad = next(p for p in prompts if not isinstance(p, str) and not _is_id_list(p))
        raise InputError(f"each prompt must be a string or a list of token ids, got {type(bad).__name__}: {bad!r:.80}")
    if len(kinds) > 1:
        raise InputError("a batch must not mix strings and token-id lists; pass one kind")
    token_prompts = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if not prompt.strip():
                raise InputError(f"prompt {i} is empty")
            ids = lm.encode_chat(prompt) if chat else lm.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            ids = list(prompt)
            if not ids:
                raise InputError(f"prompt {i} is an empty list of token ids")
            bad = [t for t in ids if not 0 <= t < lm.config.vocab_size]
            if bad:
                raise InputError(f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {lm.config.vocab_size})")
        token_prompts.append(ids)
    return token_prompts


def _is_id_list(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def check_canvas_fits(lm, token_prompts: list[list[int]], config: DecodeConfig) -> None:
    longest = max(len(p) for p in token_prompts)
    if longest + config.gen_length > lm.config.max_length:
        raise InputError(
            f"prompt ({longest} tokens) + gen_length ({config.gen_length}) = {longest + config.gen_length} "
            f"exceeds the model's context of {lm.config.max_length} tokens")


def _results_of(lm, prompts: list[list[int]], out: BatchOutput, config: DecodeConfig) -> list[GenerationResult]:
    eos_ids = set(lm.config.eos_ids)
    results = []
    for r, prompt in enumerate(prompts):
        ids = out.generated[r].tolist()
        answer_length = next((i for i, t in enumerate(ids) if t in eos_ids), len(ids))
        trace = Trace(
            commit_step=out.commit_step[r].tolist(),
            commit_step_in_block=out.commit_step_in_block[r].tolist(),
            first_confidence=[None if math.isnan(c) else c for c in out.first_confidence[r].tolist()],
        )
        results.append(GenerationResult(
            text=lm.decode(ids[:answer_length]), token_ids=ids, answer_length=answer_length,
            nfe=int(out.nfe[r]), steps_per_block=out.steps_per_block[r].tolist(), elapsed_s=out.elapsed_s,
            controller_s=out.controller_s, early_stopped=bool(out.early_stopped[r]), method=config.method,
            prompt_length=len(prompt), trace=trace, computed_fraction=float(out.computed_fraction[r]),
        ))
    return results
