"""What a finished request returns: its answer and its decoding statistics."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field


@dataclass
class Trace:
    """Per generated position: when it was committed and how confident the
    model was about it at its block's first step."""

    # Early stop fills every position after the answer's end token with EOS. A filled position that
    # was still masked was never committed: it keeps -1. One committed (in the end token's block)
    # before the stop keeps the step it was committed at, though its token now reads EOS.
    commit_step: list[int]  # global step (steps of earlier blocks included); -1 = never committed
    commit_step_in_block: list[int]  # local step t within the block; -1 = never committed
    first_confidence: list[float | None]  # s_i; None for blocks never run (early stop)


@dataclass
class GenerationResult:
    """One finished request: its answer, tokens and decoding statistics (what generate() returns)."""

    text: str  # the answer, up to the first end token
    token_ids: list[int]  # every generated position (prompt excluded), end tokens included
    answer_length: int  # answer tokens: generated positions before the first end token
    nfe: int  # forward passes this row took part in
    steps_per_block: list[int]
    elapsed_s: float  # wall time from admission to the end (generate(): of the whole run)
    policy_s: float  # of which in the commit policy (of every request in flight meanwhile)
    early_stopped: bool
    method: str
    prompt_length: int
    trace: Trace = field(repr=False)
    # Share of the (layer, block position) work of the row's steps actually run: < 1.0 only with early
    # skipping (cache "es"); refresh steps count in full; prompt and suffix work is not counted.
    computed_fraction: float = 1.0
    # generate(): seconds inside the model forwards of the whole run (the engine's forward timer).
    forward_s: float = 0.0
    # The prefix store (decode/prefix_reuse.py): prompt positions this request prefilled, and those whose
    # keys and values it took from the store instead (the two add up to prompt_length).
    prefill_positions: int = 0
    reused_positions: int = 0
    # logprobs asked for (decode/logprobs.py): per answer token, {"token_id", "logprob", "top_logprobs":
    # [[token_id, logprob], ...]}, taken at the step that committed it.
    logprobs: list[dict] | None = None
    # linear-spec (decode/nemotron.py): the tokens each verify forward accepted (its bonus token included)
    accepted_lengths: list[int] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def result_of(lm, r, policy_s: float) -> GenerationResult:
    """The GenerationResult of a finished Request (every position committed or filled)."""
    G = r.config.gen_length  # block diffusion decodes to the end of its last block; the answer is G long
    ids = list(r.generated[:G])
    eos_ids = set(lm.config.eos_ids)
    answer_length = next((i for i, t in enumerate(ids) if t in eos_ids), len(ids))
    trace = Trace(
        commit_step=list(r.commit_step[:G]),
        commit_step_in_block=list(r.commit_step_in_block[:G]),
        first_confidence=[None if math.isnan(c) else c for c in r.first_confidence[:G]],
    )
    step_pairs = lm.config.n_layers * r.config.block_length
    return GenerationResult(
        text=lm.decode(ids[:answer_length]),
        token_ids=ids,
        answer_length=answer_length,
        nfe=r.nfe,
        steps_per_block=list(r.steps_per_block),
        elapsed_s=time.perf_counter() - r.admitted_at,
        policy_s=policy_s,
        early_stopped=r.early_stopped,
        method=r.config.method,
        prompt_length=len(r.prompt),
        trace=trace,
        prefill_positions=len(r.prompt) - r.reused,
        reused_positions=r.reused,
        computed_fraction=r.computed_pairs / max(r.nfe * step_pairs, 1),
        logprobs=None if r.logprobs is None else answer_logprobs(r.logprobs.at, ids[:answer_length]),
    )


def answer_logprobs(at: dict, ids: list[int]) -> list[dict]:
    """The answer tokens' logprob entries, in order (every answer position was committed at some step)."""
    return [
        {"token_id": token, "logprob": at[p][0], "top_logprobs": [list(pair) for pair in at[p][1]]}
        for p, token in enumerate(ids)
    ]
