"""Nemotron-Labs-Diffusion's three decoders, as its modeling file (``modeling_nemotron_labs_diffusion.py``)
and chat scripts (``chat_ar.py``, ``chat_dlm.py``, ``chat_linear_spec.py``) run them, greedy, one request
at a time over a causal KV cache (decode/nemotron_runner.py):

- ``ar`` (``ar_generate``): a causal prefill, then one causal forward per token, argmax.
- ``nemotron-dlm`` (``generate``, causal_context): each block of ``block_length`` starts with the token
  the causal forward predicted after the previous block, its other positions masked; bidirectional
  denoising forwards over the cache commit the masked positions (threshold set: the most confident one
  and every other one at or above the threshold; threshold None: one a step, by confidence); then one
  causal forward over the finished block writes its keys and values and predicts the next block's first
  token. An end token with no mask before it ends the block's denoising; one in the answer ends the answer.
- ``linear-spec`` (``linear_spec_generate``, LinearSpec self-speculation): a block [last token, masks]
  drafted bidirectionally (one forward at threshold 0, else until no mask is left, at least one position a
  forward), then verified by one causal forward: the longest prefix of drafts that equal the causal argmax
  is accepted plus the causal argmax after it; the cache is cropped to the accepted tokens. At temperature
  0 it returns ``ar``'s tokens (tested): the causal pass decides every token.

Deviations (docs/nemotron.md): greedy only (temperature > 0 refused); the thinking budget
(``max_thinking_tokens``) is not implemented; every end id of the model ends an answer (the scripts pass
the tokenizer's one eos); linear-spec's answer is cut at gen_length (the official loop can return up to
block_length - 1 tokens past max_new_tokens); linear-spec drafts a block with at most block_length forwards
(the official loop runs forever while the model predicts the mask token).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator

import torch

from caidllm.checks import is_int
from caidllm.decode.nemotron_runner import CacheRunner, RecomputeRunner
from caidllm.decode.results import GenerationResult, Trace
from caidllm.errors import InputError
from caidllm.models.families import get_family

SEQUENTIAL_METHODS = ("ar", "nemotron-dlm", "linear-spec")
DEFAULT_THRESHOLD = {"ar": None, "nemotron-dlm": 0.9, "linear-spec": 0.0}  # chat_dlm.py; the modeling file


@dataclasses.dataclass
class SequentialSettings:
    method: str = "nemotron-dlm"
    gen_length: int = 256
    block_length: int = 32  # the chat scripts' block_length
    threshold: float | None = None  # None: the method's default (DEFAULT_THRESHOLD); dlm: "none" = schedule
    early_stop: bool = True
    force: bool = False  # linear-spec / ar on a family not trained as a causal LM

    @property
    def steps_per_block(self) -> int:
        """At most one denoising (or draft) forward per block position (bench's T)."""
        return self.block_length


@dataclasses.dataclass
class Decoded:
    tokens: list[int]
    forwards: int
    steps_per_block: list[int]
    commit_step: list[int]
    accepted: list[int] = dataclasses.field(default_factory=list)  # linear-spec: tokens per verify


def sequential_lengths(checkpoint, gen_length=None, block_length=None) -> dict:
    """gen_length / block_length left None as generate takes them: a known checkpoint's, else 256 / 32."""
    recommended = getattr(checkpoint, "recommended", None)
    return dict(
        gen_length=gen_length or getattr(recommended, "gen_length", None) or 256,
        block_length=block_length or getattr(recommended, "block_length", None) or 32,
    )


def untrained_refusal(family: str, method: str) -> str:
    return (
        f"method {method!r} needs a model trained both as a causal language model and as a bidirectional "
        f"denoiser (Nemotron-Labs-Diffusion); model family {family!r} was trained only as a denoiser, so the "
        "causal forwards that decide every token are untrained (the output is lossless only against its own "
        "meaningless causal greedy decoding); pass force=True to run it anyway"
    )


def check_settings(lm, method: str | None, **options) -> SequentialSettings:
    """The settings `method` decodes with on `lm`, checked (InputError naming the field)."""
    family = get_family(lm.config.family)
    method = method or "nemotron-dlm"
    if method not in SEQUENTIAL_METHODS:
        raise InputError(
            f"model family {family.name!r} decodes with its own decoders "
            f"{', '.join(map(repr, SEQUENTIAL_METHODS))}; "
            f"method {method!r} is a mask-engine decoder"
        )
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - {f.name for f in dataclasses.fields(SequentialSettings)} - {"temperature"})
    if unknown:
        raise InputError(
            f"setting {unknown[0]!r} does not apply to the sequential decoder {method!r}; it takes "
            "gen_length, "
            "block_length, threshold, early_stop, force"
        )
    if given.pop("temperature", 0) not in (0, 0.0):
        raise InputError(
            "temperature: the sequential decoders (ar, nemotron-dlm, linear-spec) are greedy only (0)"
        )
    settings = SequentialSettings(method=method, **given)
    check_values(settings)
    if not family.sequential and not settings.force:
        raise InputError(untrained_refusal(family.name, method))
    if not family.sequential and getattr(lm.model, "extra_left", 0):
        raise InputError(
            f"model family {family.name!r} predicts position i from i - 1: forced {method!r} cannot run on it"
        )
    return settings


def check_values(s: SequentialSettings) -> SequentialSettings:
    for name in ("gen_length", "block_length"):
        value = getattr(s, name)
        if not is_int(value) or value < 1:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if s.threshold is None:
        s.threshold = DEFAULT_THRESHOLD[s.method]
    elif s.threshold == "none" and s.method == "nemotron-dlm":
        s.threshold = None
    elif (
        isinstance(s.threshold, bool)
        or not isinstance(s.threshold, (int, float))
        or not 0 <= s.threshold <= 1
    ):
        raise InputError(f"threshold must be a number in [0, 1], got {s.threshold!r}")
    if s.method == "nemotron-dlm" and s.gen_length % s.block_length:
        raise InputError(
            f"gen_length {s.gen_length} must be a multiple of block_length {s.block_length} for "
            "'nemotron-dlm' "
            "(the modeling file's generate asserts it)"
        )
    for name in ("early_stop", "force"):
        if not isinstance(getattr(s, name), bool):
            raise InputError(f"{name} must be true or false, got {getattr(s, name)!r}")
    return s


def decode_ar(
    runner, prompt: list[int], s: SequentialSettings, eos: set
) -> Generator[list[int], None, Decoded]:
    logits, out = runner.prefill(prompt), []
    for step in range(s.gen_length):
        token = int(logits[-1].argmax())
        out.append(token)
        if s.early_stop and token in eos:
            break
        if step < s.gen_length - 1:
            logits = runner.verify([token])
        yield out
    return Decoded(out, runner.forwards, [1] * len(out), list(range(len(out))))


def _transfer(logits, block: torch.Tensor, mask_id: int, threshold, quota: int) -> torch.Tensor:
    """Which masked positions a denoising step commits (the modeling file's _get_transfer_index at
    temperature 0): the top `quota` by confidence (every masked one with a threshold), then, with a
    threshold, all but the first dropped below it."""
    masked = block == mask_id
    x0 = logits.argmax(-1)
    confidence = torch.where(masked, torch.softmax(logits, -1).gather(-1, x0[:, None])[:, 0], -torch.inf)
    k = int(masked.sum()) if threshold is not None else quota
    _, chosen = torch.topk(confidence, k=k)
    if threshold is not None:
        chosen = torch.cat([chosen[:1], chosen[1:][confidence[chosen[1:]] >= threshold]])
    out = block.clone()
    out[chosen] = x0[chosen]
    return out


def _ended(block: torch.Tensor, mask_id: int, eos: set) -> bool:
    """An end token in the block with no mask before the first one (the block's denoising stops)."""
    tokens = block.tolist()
    first = next((i for i, t in enumerate(tokens) if t in eos), None)
    return first is not None and mask_id not in tokens[:first]


def _denoise_block(runner, block: torch.Tensor, s: SequentialSettings, mask_id: int, eos: set) -> tuple:
    """Denoising forwards over one block until no mask is left (or an end token ends it); (block, steps,
    the step each position was committed at, -1 for the seed)."""
    n_masked = int((block == mask_id).sum())
    quotas = [
        n_masked // s.block_length + (1 if i < n_masked % s.block_length else 0)
        for i in range(s.block_length)
    ]
    committed_at = [-1] * s.block_length
    steps = 0
    for i in range(s.block_length):
        if not (block == mask_id).any():
            break
        new = _transfer(runner.draft(block.tolist()), block, mask_id, s.threshold, quotas[i])
        for j in torch.nonzero(new != block)[:, 0].tolist():
            committed_at[j] = i
        block, steps = new, steps + 1
        if s.early_stop and _ended(block, mask_id, eos):
            break
    return block, steps, committed_at


def decode_dlm(
    runner, prompt: list[int], s: SequentialSettings, mask_id: int, eos: set
) -> Generator[list[int], None, Decoded]:
    seed = int(runner.prefill(prompt)[-1].argmax())
    out, steps_per_block, commit_step, steps_before = [], [], [], 0
    for _ in range(s.gen_length // s.block_length):
        block = torch.full((s.block_length,), mask_id, device=runner.device)
        block[0] = seed
        block, steps, committed_at = _denoise_block(runner, block, s, mask_id, eos)
        seed = int(runner.verify(block.tolist())[-1].argmax())
        out += block.tolist()
        commit_step += [steps_before + max(t, 0) for t in committed_at]
        steps_per_block.append(steps + 1)
        steps_before += steps + 1
        first = next((i for i, t in enumerate(out) if t in eos), None) if s.early_stop else None
        if first is not None:
            return Decoded(out[: first + 1], runner.forwards, steps_per_block, commit_step[: first + 1])
        yield out
    return Decoded(out, runner.forwards, steps_per_block, commit_step)


def _draft_block(runner, block: torch.Tensor, threshold: float, mask_id: int) -> int:
    """Fill the block's masks by bidirectional drafts (in place); the number of forwards. At most
    len(block) forwards: the official loop has no bound and never ends while the model keeps predicting
    the mask token itself at a position (a named deviation; masks left are rejected by the verify)."""
    forwards = 0
    while (block == mask_id).any() and forwards < len(block):
        masked = block == mask_id
        logits = runner.draft(block.tolist())
        forwards += 1
        tokens = logits.argmax(-1)
        if threshold <= 0:
            block[masked] = tokens[masked]
            break
        confidence = torch.softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]
        confidence = torch.where(masked, confidence, -torch.inf)
        unmask = confidence >= threshold
        if not unmask.any():  # always progress: the most confident masked position
            unmask[int(confidence.argmax())] = True
        block[unmask] = tokens[unmask]
    return forwards


def decode_linear_spec(
    runner, prompt: list[int], s: SequentialSettings, mask_id: int, eos: set
) -> Generator[list[int], None, Decoded]:
    token = int(runner.prefill(prompt)[-1].argmax())
    out, steps, accepted_lengths, commit = [token], [1], [], [0]
    if s.early_stop and token in eos:
        return Decoded(out, runner.forwards, steps, commit)
    while len(out) < s.gen_length:
        start = runner.length
        block = torch.full((s.block_length,), mask_id, device=runner.device)
        block[0] = token
        drafts = _draft_block(runner, block, s.threshold, mask_id)
        causal = runner.verify(block.tolist()).argmax(-1).tolist()
        drafted = block.tolist()
        accepted = 1 + next(
            (i for i in range(s.block_length - 1) if causal[i] != drafted[i + 1]), s.block_length - 1
        )
        new = causal[:accepted]
        runner.crop(start + accepted)
        token = new[-1]
        first = next((i for i, t in enumerate(new) if t in eos), None) if s.early_stop else None
        new = new if first is None else new[: first + 1]
        out += new
        commit += [len(steps)] * len(new)
        steps.append(drafts + 1)
        accepted_lengths.append(accepted)
        if first is not None:
            break
        yield out
    n = min(len(out), s.gen_length)
    return Decoded(out[:n], runner.forwards, steps, commit[:n], accepted_lengths)


def stepper(lm, prompt: list[int], s: SequentialSettings):
    """The decoder of `s` as a generator: it yields the tokens decided so far after each token (ar), block
    (nemotron-dlm) or verify (linear-spec), and returns the Decoded (the step engine of the server,
    decode/nemotron_engine.py, advances it one yield at a time)."""
    sequential = get_family(lm.config.family).sequential
    runner = CacheRunner(lm) if sequential else RecomputeRunner(lm)
    eos, mask_id = set(lm.config.eos_ids), lm.config.mask_id
    if s.method == "ar":
        return (yield from decode_ar(runner, prompt, s, eos))
    if s.method == "nemotron-dlm":
        return (yield from decode_dlm(runner, prompt, s, mask_id, eos))
    return (yield from decode_linear_spec(runner, prompt, s, mask_id, eos))


def decode_one(lm, prompt: list[int], s: SequentialSettings) -> Decoded:
    steps = stepper(lm, prompt, s)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def result_of(lm, prompt: list[int], s: SequentialSettings, d: Decoded, elapsed: float) -> GenerationResult:
    eos = set(lm.config.eos_ids)
    answer = next((i for i, t in enumerate(d.tokens) if t in eos), len(d.tokens))
    trace = Trace(
        commit_step=list(d.commit_step),
        commit_step_in_block=[-1] * len(d.tokens),
        first_confidence=[None] * len(d.tokens),
    )
    return GenerationResult(
        text=lm.decode(d.tokens[:answer]),
        token_ids=list(d.tokens),
        answer_length=answer,
        nfe=d.forwards,
        steps_per_block=list(d.steps_per_block),
        elapsed_s=elapsed,
        policy_s=0.0,
        early_stopped=answer < len(d.tokens),
        method=s.method,
        prompt_length=len(prompt),
        trace=trace,
        prefill_positions=len(prompt),
        accepted_lengths=list(d.accepted) or None,
    )


@torch.no_grad()
def generate_sequential(lm, token_prompts: list[list[int]], method: str | None, **options) -> list:
    """Each prompt decoded alone (the official loops take one request at a time): its tokens never depend
    on the batch. Results in the prompts' order, each with the whole run's elapsed time."""
    settings = check_settings(lm, method, **options)
    bad = [t for p in token_prompts for t in p if not 0 <= t < lm.config.vocab_size]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the vocabulary [0, {lm.config.vocab_size})")
    longest = max(map(len, token_prompts)) + settings.gen_length + settings.block_length
    if longest > lm.config.max_length:
        raise InputError(
            f"prompt + gen_length + block_length ({longest}) exceeds the model's context "
            f"{lm.config.max_length}"
        )
    started, results = time.perf_counter(), []
    for prompt in token_prompts:
        t0 = time.perf_counter()
        decoded = decode_one(lm, list(prompt), settings)
        results.append(result_of(lm, prompt, settings, decoded, time.perf_counter() - t0))
    elapsed = time.perf_counter() - started
    # all of it in the model's forwards but the argmax and the bookkeeping: forward_s is the whole wall
    return [dataclasses.replace(r, elapsed_s=elapsed, forward_s=elapsed) for r in results]
