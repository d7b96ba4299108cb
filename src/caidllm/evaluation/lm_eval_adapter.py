"""caidllm as an lm-eval model: ``--model caidllm``.

    python -m caidllm.evaluation --model caidllm \\
        --model_args pretrained=/path/to/LLaDA-8B-Instruct,method=cai,gen_length=256,block_length=64 \\
        --tasks caidllm_gsm8k --batch_size 8 --output_path runs/lm-eval

(``caidllm-lm-eval`` is the same as a console script.) Importing this module
registers the model with lm-eval; lm-eval's own ``lm_eval`` command does not
import it, hence the wrapper. ``--include_path`` is for task configs: the
wrapper adds this package's offline task configs (evaluation/tasks/) unless
one is given.

model_args: ``pretrained`` (a model folder or "tiny"), ``method`` (a preset;
default: a known block-diffusion checkpoint's own decoder, else cai), ``gen_length`` and ``block_length``
(default: as ``caidllm generate`` takes them: a known checkpoint's recommendation, else 256 and the method's,
a block-diffusion model's own where the method's does not apply), ``steps``,
``cache``, ``threshold``, ``temperature`` (0; a task's temperature wins),
``seed`` (0), ``early_stop`` (true), ``dtype``, ``chat`` (auto | true |
false: auto applies the model's chat template to plain-text requests when the
tokenizer has one), ``stats_path`` (where to write the decoding statistics;
default: caidllm_stats.json in --output_path, via the wrapper); any other key
is a decoding override of the preset (e.g. ``gating=false``; a method's own setting also as
``OWNER.FIELD``, e.g. ``cai.gating=false``, ``dgcai.warmup=0.2``). Batch size and
device come from lm-eval's ``--batch_size`` and ``--device``.

Data parallel: under ``accelerate launch -m caidllm.evaluation ...`` or
``torchrun --nproc-per-node N -m caidllm.evaluation ...`` each process joins
the process group (caidllm.distributed: NCCL with cuda:LOCAL_RANK, gloo on
CPU) and reports its rank and the world size to lm-eval, which gives each
rank every N-th document and gathers the metrics on rank 0; the statistics
are summed over ranks (wall time: the slowest rank's) and written by rank 0.

Only ``generate_until`` is supported: a masked diffusion model has no cheap
exact log-likelihood, nor has a uniform-state one (DiffusionGemma), so ``loglikelihood`` tasks (multiple
choice by likelihood) raise NotImplementedError saying why; use the generative configs here. On
DiffusionGemma ``method`` is diffusiongemma (default), greedy or diffusiongemma-cai, its knobs (entropy_bound,
t_min, ...; the CAI variant's as ``dgcai.FIELD``) go as model_args, gen_length defaults to one canvas,
and temperature, block_length and the prefix store do not apply (refused by name).
The ``until`` stop strings are applied to the decoded answer (the diffusion
canvas is always ``gen_length`` positions; ``max_gen_toks`` is not used).
NFE, steps per block and throughput are logged after every call and written
as JSON to ``stats_path``.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from caidllm.decode.api import tokenize_prompts
from caidllm.decode.prefix_reuse import check_budget, make_store
from caidllm.decode.presets import config_for_model
from caidllm.decode.uniform_api import check_uniform
from caidllm.distributed import World
from caidllm.errors import InputError
from caidllm.evaluation import lm_eval_stats
from caidllm.models.checkpoints import recommended_method
from caidllm.models.families import get_family
from caidllm.options import check_before_load, model_config_of, nest_owner_keys

logger = logging.getLogger("lm_eval.caidllm")  # under lm-eval's logger, so its --verbosity applies
STATS_ENV = "CAIDLLM_LM_EVAL_STATS"

NOT_SUPPORTED = (
    "caidllm: {kind} requests are not supported: masked diffusion models (LLaDA, Dream) have no exact "
    "autoregressive likelihood, and a Monte Carlo ELBO estimate is not implemented. Use generative "
    "tasks (output_type: generate_until), e.g. the caidllm_* task configs."
)
NOT_SUPPORTED_UNIFORM = (
    "caidllm: {kind} requests are not supported on model family {family!r}: uniform-state diffusion "
    "(DiffusionGemma) has no exact likelihood either (an answer is a canvas of random tokens denoised by a "
    "sampler; scoring one would need an ELBO over the uniform-noise corruption, which is not implemented). "
    "Use generative tasks (output_type: generate_until), e.g. the caidllm_* task configs."
)


def _bool(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise InputError(f"model_args {name}={value!r}: expected true or false")


def _decode_options(steps, cache, threshold, seed, early_stop, overrides: dict) -> dict:
    """The model_args that go to generate as they are (typed from lm-eval's strings)."""
    return dict(
        steps=None if steps is None else int(steps),
        cache=cache,
        threshold=None if threshold is None else float(threshold),
        seed=int(seed),
        early_stop=_bool(early_stop, "early_stop"),
        **nest_owner_keys(overrides),  # dgcai.warmup=0.2 -> dgcai={"warmup": 0.2}, as --set takes it
    )


@register_model("caidllm")
class CaidllmLM(LM):
    def __init__(
        self,
        pretrained="tiny",
        method=None,
        gen_length=None,
        block_length=None,
        steps=None,
        cache=None,
        threshold=None,
        temperature=0.0,
        seed=0,
        early_stop=True,
        dtype=None,
        chat="auto",
        stats_path=None,
        batch_size=8,
        max_batch_size=None,
        device=None,
        quantize=None,
        quantize_head=False,
        prefix_cache_mb=None,
        **overrides,
    ):
        super().__init__()
        # method None: a known checkpoint's own decoder, else cai
        self.method = None if method is None else str(method)
        self.gen_length = None if gen_length is None else int(gen_length)
        self.block_length = None if block_length is None else int(block_length)
        self.decode = _decode_options(steps, cache, threshold, seed, early_stop, overrides)
        self.temperature = float(temperature)
        # The prefix store (decode/prefix_reuse.py), kept with the model across batches: a few-shot task's
        # shared examples are prefilled once. None: the default on a block-causal model; 0: off.
        self.prefix_cache_mb = check_budget(prefix_cache_mb, "model_args prefix_cache_mb")
        self._check_settings(pretrained)
        self.chat = str(chat).lower()
        if self.chat not in ("auto", "true", "false"):
            raise InputError(f"model_args chat={chat!r}: expected auto, true or false")
        self.batch_size = _batch_size(batch_size)
        self.world = World.from_env()
        self.lm = self._load(pretrained, device, dtype, quantize, quantize_head)
        self._fit_lengths()
        if not self.uniform:
            make_store(self.lm, self.prefix_cache_mb)  # a budget the model cannot use fails here
        self._device = self.lm.device
        # What lm-eval splits requests by.
        self._rank, self._world_size = self.world.rank, self.world.world_size
        self.pretrained = str(pretrained)
        self._start_stats(stats_path)

    def _check_settings(self, pretrained) -> None:
        """Bad settings, or ones the model's family does not take, fail here, before loading (read from
        its config.json). A uniform-state model (DiffusionGemma) takes no temperature (its own is the
        t_max -> t_min schedule) and no prefix store."""
        self.family = model_config_of(pretrained)[0].family
        self.uniform = get_family(self.family).uniform
        if self.uniform:
            for name, value in (("temperature", self.temperature), ("prefix_cache_mb", self.prefix_cache_mb)):
                if value:
                    raise InputError(
                        f"model_args {name}={value}: does not apply to model family {self.family!r} "
                        "(uniform-state diffusion: its own decoders and engine)",
                        name,
                    )
        check_before_load(
            pretrained,
            self.method,
            gen_length=self.gen_length,
            block_length=self.block_length,
            **({} if self.uniform else {"temperature": self.temperature}),
            **self.decode,
        )

    def _load(self, pretrained, device, dtype, quantize, quantize_head):
        """The model on this rank's device (one GPU per rank in a distributed run)."""
        from caidllm.models import load

        device = _device(device)
        if self.world.distributed and (device is None or str(device).startswith("cuda")):
            device = self.world.device("cuda" if torch.cuda.is_available() else "cpu")  # one GPU per rank
        self.world.init(device)
        return load(
            pretrained,
            device=device,
            dtype=dtype,
            quantize=quantize or None,
            quantize_head=_bool(quantize_head, "quantize_head"),
        )

    def _fit_lengths(self) -> None:
        """Unset lengths as generate takes them (a known checkpoint's recommendation, a block-diffusion
        model's own block length): the lengths every request of the run decodes with."""
        checkpoint = getattr(self.lm, "checkpoint", None)
        if self.uniform:  # its own decoder by default; the canvas is the block, one canvas by default
            settings = check_uniform(
                self.lm.config, self.method, getattr(self.lm, "path", None), gen_length=self.gen_length
            )
            self.method, self.block_length = settings.method, settings.canvas_length
            self.gen_length = self.gen_length or settings.canvas_length
            return
        self.method = recommended_method(checkpoint, self.method)
        config, _ = config_for_model(
            self.lm.config,
            checkpoint,
            self.method,
            gen_length=self.gen_length,
            block_length=self.block_length,
            temperature=self.temperature,
            **self.decode,
        )
        self.gen_length, self.block_length = config.gen_length, config.block_length

    def _start_stats(self, stats_path) -> None:
        """The run's counters, the file they go to (stats_path, else $CAIDLLM_LM_EVAL_STATS) and the chat
        template's markers."""
        self.stats_path = (
            Path(stats_path)
            if stats_path
            else (Path(os.environ[STATS_ENV]) if os.environ.get(STATS_ENV) else None)
        )
        template = getattr(self.lm.tokenizer, "chat_template", None) or ""
        self._template_markers = [
            t.content
            for t in self.lm.tokenizer.added_tokens_decoder.values()
            if t.special and t.content and t.content in template
        ]
        self.stats = lm_eval_stats.new_stats()

    # ---- lm-eval interface ----------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    def chat_template(self, chat_template=False):
        return getattr(self.lm.tokenizer, "chat_template", None)

    def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
        return self.lm.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # lm-eval's collectives for data-parallel runs (its evaluator calls them when world_size > 1)

    def all_gather(self, tensor):
        if not self.world.distributed:
            return tensor
        gathered = [torch.zeros_like(tensor) for _ in range(self.world.world_size)]
        torch.distributed.all_gather(gathered, tensor.contiguous())
        return torch.stack(gathered) if tensor.dim() == 0 else torch.cat(gathered)

    def gather_object(self, obj, dst=0):
        return self.world.gather(obj, dst=dst)

    def barrier(self) -> None:
        self.world.barrier()

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(self._not_supported("loglikelihood"))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(self._not_supported("loglikelihood_rolling"))

    def _not_supported(self, kind: str) -> str:
        if self.uniform:
            return NOT_SUPPORTED_UNIFORM.format(kind=kind, family=self.family)
        return NOT_SUPPORTED.format(kind=kind)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm import tqdm

        answers: list[str | None] = [None] * len(requests)
        groups: dict[float, list[int]] = {}
        parsed = []
        for i, request in enumerate(requests):
            context, gen_kwargs = request.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            temperature = self.temperature
            if "temperature" in gen_kwargs:
                temperature = float(gen_kwargs["temperature"])
            if not gen_kwargs.get("do_sample", temperature > 0):
                temperature = 0.0
            parsed.append((context, until))
            groups.setdefault(temperature, []).append(i)

        progress = tqdm(total=len(requests), desc="caidllm generate_until", disable=disable_tqdm)
        for temperature, indices in groups.items():
            for first in range(0, len(indices), self.batch_size):
                batch = indices[first : first + self.batch_size]
                ids = [self._encode(parsed[i][0]) for i in batch]
                started = time.perf_counter()
                results = self.lm.generate(
                    ids, **self._generate_options(temperature), batch_size=len(batch), chat=False
                )
                if torch.device(self._device).type == "cuda":
                    torch.cuda.synchronize(self._device)
                lm_eval_stats.account(self.stats, results, time.perf_counter() - started, self.gen_length)
                for i, result in zip(batch, results):
                    text = cut_at_stop(result.text, parsed[i][1])
                    answers[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                progress.update(len(batch))
        progress.close()
        self._report()
        return answers

    # ---- helpers ----------------------------------------------------------------

    def _generate_options(self, temperature: float) -> dict:
        """generate()'s keywords of a batch: a uniform-state model's decoder reads no block length, prefix
        store nor temperature (a task's temperature does not apply to it: its schedule is t_max -> t_min)."""
        if self.uniform:
            return dict(method=self.method, gen_length=self.gen_length, **self.decode)
        return dict(
            method=self.method,
            gen_length=self.gen_length,
            block_length=self.block_length,
            temperature=temperature,
            prefix_cache_mb=self.prefix_cache_mb,
            **self.decode,
        )

    def _templated(self, context: str) -> bool:
        return any(marker in context for marker in self._template_markers)

    def _encode(self, context: str) -> list[int]:
        tokenizer_has_template = bool(getattr(self.lm.tokenizer, "chat_template", None))
        wanted = self.chat == "true" or (self.chat == "auto" and tokenizer_has_template)
        apply = wanted and not self._templated(context)
        if not context.strip():
            context = " "
        ids = tokenize_prompts(self.lm, [context], apply)[0]
        budget = self.lm.config.max_length - self.gen_length
        if len(ids) > budget:  # keep the end of the prompt, as lm-eval's HF model does
            self.stats["truncated_prompts"] += 1
            logger.warning(
                "prompt of %d tokens cut to its last %d to fit the model's context", len(ids), budget
            )
            ids = ids[-budget:]
        return ids

    def _run_fields(self) -> dict:
        """The run's fixed fields in the statistics file."""
        return {
            "model": self.pretrained,
            "method": self.method,
            "gen_length": self.gen_length,
            "block_length": self.block_length,
            "batch_size": self.batch_size,
            "device": str(self._device),
            "world_size": self.world.world_size,
        }

    def _report(self) -> None:
        if self.world.distributed:  # every rank calls generate_until, so every rank is here
            gathered = self.world.gather(self.stats)
            if not self.world.is_main:
                return
            summary = lm_eval_stats.summary(lm_eval_stats.combined(gathered), self._run_fields())
        else:
            summary = lm_eval_stats.summary(self.stats, self._run_fields())
        logger.info(
            "caidllm %s: %d requests, NFE/request %.1f, %.1f positions/s, %.1f answer tokens/s",
            self.method,
            summary["requests"],
            summary["nfe_mean"] or 0.0,
            summary["tps_positions"] or 0.0,
            summary["tps_answer"] or 0.0,
        )
        lm_eval_stats.write(self.stats_path, summary, logger)


def cut_at_stop(text: str, until: list[str]) -> str:
    """`text` up to the earliest occurrence of any stop string."""
    cut = len(text)
    for stop in until:
        if stop:
            at = text.find(stop)
            if at != -1:
                cut = min(cut, at)
    return text[:cut]


def _batch_size(value) -> int:
    if value is None or str(value).startswith("auto"):
        return 8
    try:
        size = int(value)
    except (TypeError, ValueError):
        raise InputError(f"batch_size {value!r}: expected a positive integer or 'auto'") from None
    if size < 1:
        raise InputError(f"batch_size {value!r}: expected a positive integer")
    return size


def _device(value):
    if value is None:
        return None
    text = str(value)
    if text.startswith("cuda") and not torch.cuda.is_available():
        logger.warning(
            "device %s requested (lm-eval's default is cuda:0) but CUDA is not available: using cpu", text
        )
        return "cpu"
    return text
