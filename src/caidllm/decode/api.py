"""`generate`: prompts in, answers with their decoding statistics out."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from caidllm.checks import is_id_list, is_int
from caidllm.decode.constraints import constraint_of, per_prompt
from caidllm.decode.engine import Engine
from caidllm.decode.nemotron import SEQUENTIAL_METHODS, generate_sequential
from caidllm.decode.prefix_reuse import shared_store
from caidllm.decode.presets import build_config, options_for_model
from caidllm.decode.results import GenerationResult, Trace  # noqa: F401 - re-exported
from caidllm.decode.uniform_api import generate_uniform
from caidllm.errors import InputError
from caidllm.models.checkpoints import recommended_method
from caidllm.models.families import get_family
from caidllm.models.lm import DiffusionLM


def generate(
    lm,
    prompts,
    method: str | None = None,
    gen_length: int | None = None,
    block_length: int | None = None,
    steps: int | None = None,
    cache: str | None = None,
    threshold: float | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    early_stop: bool = True,
    batch_size: int = 8,
    chat: bool | None = None,
    compile: bool = False,
    settings=None,
    prefix_cache_mb: float | None = None,
    json_schema=None,
    regex: str | None = None,
    choice: list[str] | None = None,
    json_object: bool = False,
    logprobs: bool = False,
    top_logprobs: int = 0,
    constraint=None,
    **overrides,
) -> list[GenerationResult]:
    """Decode `prompts` (strings, or lists of token ids used as given) with a method preset; any keyword given
    overrides the preset's value (a uniform-state model, DiffusionGemma, runs its own: decode/uniform_api.py).

    gen_length / block_length / steps / temperature left None: the recommendation of a known checkpoint
    (models/checkpoints.py; lm.checkpoint), else 256 / 64 / gen_length / 0; a block-diffusion model decodes
    with its own block length unless one is given (presets.options_for_model, the rule of every command).
    method None: a known block-diffusion checkpoint's own decoder (and its threshold, when threshold is None
    too), else "cai". chat None: lm.chat_default (instruct checkpoints and folders with a chat template:
    True).

    A client of the step-level engine: every prompt is submitted, at most `batch_size` decode together, and
    a finished one's slot goes to the next at once. compile=True: the model runs its norms and MLPs through
    torch.compile from then on (models/compiled.py). `settings`: a settings file (path or loaded, see
    decode/settings_file.py) whose method settings apply under the keywords. prefix_cache_mb: the budget of
    the prefix store kept with the model across calls (decode/prefix_reuse.py; None: the default on a
    block-causal model, 0: off; exact: the same tokens either way). Each result's elapsed_s,
    policy_s and forward_s are those of the whole run.
    json_schema, regex, choice, json_object, constraint: structured output (docs/structured-output.md).
    logprobs: each result's `logprobs`, with top_logprobs alternatives, taken at the step that committed each
    token."""
    if get_family(lm.config.family).uniform:  # DiffusionGemma: its own decoders and engine (uniform_api.py)
        return _generate_uniform(**locals())
    if get_family(lm.config.family).sequential or method in SEQUENTIAL_METHODS:  # decode/nemotron.py
        return _generate_sequential(**locals())
    method = recommended_method(getattr(lm, "checkpoint", None) if settings is None else None, method)
    lengths = dict(gen_length=gen_length, block_length=block_length, steps=steps, temperature=temperature)
    options = dict(cache=cache, seed=seed, early_stop=early_stop, **overrides)
    config = _config_for(lm, method, settings, lengths, threshold, options)
    _prepare(lm, batch_size, compile)
    token_prompts = tokenize_prompts(lm, prompts, getattr(lm, "chat_default", True) if chat is None else chat)
    given = constraint_of(json_schema=json_schema, regex=regex, choice=choice, json_object=json_object)
    constraints = per_prompt(constraint if given is None else given, len(token_prompts))
    top = top_logprobs if logprobs else None
    return _run(lm, token_prompts, config, constraints, batch_size, prefix_cache_mb, top)


def _prepare(lm, batch_size: int, compile: bool) -> None:
    """Refuse a bad batch size; compile=True: the model's norms and MLPs through torch.compile from now
    on (models/compiled.py)."""
    if not is_int(batch_size) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    if compile:
        from caidllm.models.compiled import enable_compile

        enable_compile(lm)


def _config_for(lm, method: str, settings, lengths: dict, threshold, options: dict):
    """The decode config of `method`: the lengths left None from a known checkpoint's recommendation (and
    a block-diffusion model's own block length), the settings file under the keywords given."""
    checkpoint = getattr(lm, "checkpoint", None)
    # Fitted to the model's family at submit, after the engine's check that the family runs the decoder.
    lengths, taken = options_for_model(
        lm.config, checkpoint, method, settings=settings, threshold=threshold, **lengths
    )
    return build_config(method, settings=settings, filled=taken, **options, **lengths)


def _run(lm, token_prompts, config, constraints, batch_size: int, prefix_cache_mb, logprobs) -> list:
    """Every prompt submitted to one engine (at most batch_size decoding together); the results in the
    prompts' order, each with the whole run's times."""
    store = shared_store(lm, prefix_cache_mb)
    engine = Engine(
        lm, max_batch=batch_size, max_queue=len(token_prompts), prefix_cache_mb=0, prefix_store=store
    )
    started = time.perf_counter()
    ids = [
        engine.submit(p, config, constraint=c, logprobs=logprobs) for p, c in zip(token_prompts, constraints)
    ]
    try:
        results = {event.request_id: event.result for event in engine.run() if event.finished}
    except BaseException:  # the store outlives this call: its requests must let go of the blocks they hold
        engine.cancel_all()
        raise
    _sync(lm)
    elapsed, policy = time.perf_counter() - started, engine.runner.policy_timer.total()
    forward = engine.runner.forward_timer.total()
    return [
        dataclasses.replace(results[i], elapsed_s=elapsed, policy_s=policy, forward_s=forward) for i in ids
    ]


def _generate_uniform(
    lm,
    prompts,
    method,
    batch_size,
    chat,
    overrides,
    early_stop,
    compile,
    json_object,
    logprobs,
    top_logprobs,
    **options,
):
    """generate() on a uniform-state model: its settings checked (a mask-based decoder's refused by name)."""
    if not is_int(batch_size) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    token_prompts = tokenize_prompts(lm, prompts, getattr(lm, "chat_default", True) if chat is None else chat)
    flags = {
        "compile": compile,
        "json_object": json_object,
        "logprobs": logprobs,
        "top_logprobs": top_logprobs,
    }
    options.update({name: value or None for name, value in flags.items()}, early_stop=early_stop)
    return generate_uniform(lm, token_prompts, method, batch_size, **options, **overrides)


def _generate_sequential(lm, prompts, method, batch_size, chat, overrides, early_stop, gen_length, **options):
    """generate() on a model with the sequential decoders (ar, nemotron-dlm, linear-spec; decode/nemotron.py),
    or one of those decoders asked of another family (refused unless force=True)."""
    if not is_int(batch_size) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
    unsupported = [k for k, v in options.items() if v not in (None, False, 0) and k not in SEQUENTIAL_KEYS]
    if unsupported:
        raise InputError(
            f"setting {sorted(unsupported)[0]!r} does not apply to the sequential decoders (ar, "
            "nemotron-dlm, "
            "linear-spec); they take gen_length, block_length, threshold, temperature (0), early_stop, force"
        )
    token_prompts = tokenize_prompts(lm, prompts, getattr(lm, "chat_default", True) if chat is None else chat)
    checkpoint = getattr(lm, "checkpoint", None)  # a known checkpoint's own decoder and lengths (its row)
    method = recommended_method(checkpoint, method) if checkpoint is not None else method
    if checkpoint is not None and method == checkpoint.recommended.decoder:
        options.setdefault("threshold", None)
        options["threshold"] = options["threshold"] or checkpoint.recommended.threshold
        gen_length = gen_length or checkpoint.recommended.gen_length
        options["block_length"] = options.get("block_length") or checkpoint.recommended.block_length
    gen_length = gen_length or 256
    kept = {k: options[k] for k in SEQUENTIAL_KEYS if options.get(k) is not None and k != "seed"}
    return generate_sequential(
        lm, token_prompts, method, gen_length=gen_length, early_stop=early_stop, **kept, **overrides
    )


# seed: accepted and unused (greedy); the rest go to the decoders' settings
SEQUENTIAL_KEYS = ("block_length", "threshold", "temperature", "seed")


def _sync(lm) -> None:
    if torch.device(lm.device).type == "cuda":
        torch.cuda.synchronize(lm.device)


def tokenize_prompts(lm, prompts, chat: bool) -> list[list[int]]:
    if isinstance(prompts, str) or is_id_list(prompts):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise InputError("prompts must be a non-empty list of strings or of token-id lists")
    # An empty list counts as token ids here, so that it gets its own clear error below.
    kinds = {
        "text" if isinstance(p, str) else "ids" if is_id_list(p, allow_empty=True) else "other"
        for p in prompts
    }
    if "other" in kinds:
        bad = next(p for p in prompts if not isinstance(p, str) and not is_id_list(p, allow_empty=True))
        raise InputError(
            f"each prompt must be a string or a list of token ids, got {type(bad).__name__}: {bad!r:.80}"
        )
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
                raise InputError(
                    f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {lm.config.vocab_size})"
                )
        token_prompts.append(ids)
    return token_prompts


DiffusionLM.register_generate(generate)  # lm.generate(...) is this generate(lm, ...)
