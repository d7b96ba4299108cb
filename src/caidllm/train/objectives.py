"""The objectives of `caidllm train` (`--objective`), a registry: each names its loss over a batch, the
config.json of the model it trains, the decoder its validation runs, and what its export adds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from caidllm.tasks import DRILL_NAMES
from caidllm.train.bd_decode import block_diffusion_generate
from caidllm.train.block_diffusion import block_diffusion_loss
from caidllm.train.data import Batch, mask_answers, masked_loss
from caidllm.train.uniform import dg_config_dict, uniform_decode, uniform_loss


@dataclass(frozen=True)
class Objective:
    loss: Callable  # (trainer, step, batch, generator) -> scalar loss
    # (TrainConfig, the recipe's LLaDA config.json, vocab size, special ids) -> the config.json of the model
    # built and trained
    model_config: Callable | None = None
    # (TrainConfig, config.json) -> the config.json exported (what the decoders read of the training)
    export_config: Callable | None = None
    decode: Callable | None = None  # (lm, prompts, gen_length) -> texts for validation; None: fastdllm
    mix_only: bool = False  # validate only the tasks of the run's mix (a slow decoder)
    uniform: bool = False  # a uniform-state (DiffusionGemma) model: its own init, export files


def masked_objective(trainer, step: int, batch: Batch, generator: torch.Generator) -> torch.Tensor:
    # A drill's facts are independent (and listed in its prompt): only its
    # results are worth masking. A chain's results are cut at instead.
    cfg = trainer.cfg
    drill = batch.task in DRILL_NAMES
    results = step >= cfg.results_from
    noisy, masked, p_mask, in_answer = mask_answers(
        batch,
        trainer.special["mask"],
        generator,
        cfg.block_share,
        cfg.block_length,
        result_share=1.0 if drill and results else 0.0,
        cut_share=cfg.cut_share if results and not drill else 0.0,
    )
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16_autocast):
        logits = trainer.model(noisy)
    return masked_loss(logits, batch.input_ids, masked, p_mask, in_answer)


def block_objective(trainer, step: int, batch: Batch, generator: torch.Generator) -> torch.Tensor:
    lengths = trainer.cfg.block_lengths
    block_length = lengths[int(torch.randint(len(lengths), (1,), generator=generator))]
    return block_diffusion_loss(
        trainer.model, batch, block_length, trainer.special["mask"], generator, trainer.cfg.bf16_autocast
    )


def block_config(cfg, raw: dict) -> dict:
    raw = dict(raw, caidllm_block_lengths=list(cfg.block_lengths))
    if raw["model_type"] == "llada":  # the block-diffusion families are block-causal anyway
        raw["caidllm_block_causal"] = True
    return raw


def block_decode(lm, prompts: list[str], gen_length: int) -> list[str]:
    return block_diffusion_generate(
        lm, prompts, 8, gen_length, batch_size=8
    )  # vanilla at block 8, as the card


OBJECTIVES = {
    "masked": Objective(masked_objective),
    "block_diffusion": Objective(block_objective, export_config=block_config, decode=block_decode),
    "uniform": Objective(
        uniform_loss,
        model_config=lambda cfg, raw, vocab_size, special: dg_config_dict(cfg, vocab_size, special),
        decode=uniform_decode,
        mix_only=True,
        uniform=True,
    ),
}
