"""The training recipe's settings: `TrainConfig` and the task mix of the shipped `tiny`."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from caidllm.errors import InputError
from caidllm.models.loading import resolve_folder
from caidllm.tasks import COT_NAMES, DRILL_NAMES, TASK_NAMES
from caidllm.tasks.vocab import vocabulary_extra
from caidllm.train.objectives import OBJECTIVES

# The recipe's task mix, in phases: (first step, weight per task). At
# first the arithmetic facts drill (tasks/arithmetic_facts.py) gets 41% of
# the batches from the first step, because a fresh model needs hundreds of
# exposures per fact (probes on the drill alone: 11% of results right after
# 300 steps, 26% after 1,200), and the arithmetic and navigate chains are
# only as good as their facts. dyck_languages (its chain copies the whole
# input, where the model loses its place) and multistep_arithmetic_two (no
# target, far beyond this model) get the least compute.
TASK_PHASES = (
    (
        0,
        {
            "boolean_expressions": 1.0,
            "web_of_lies": 1.25,
            "navigate": 1.75,
            "dyck_languages": 0.5,
            "multistep_arithmetic_two": 0.25,
            "arithmetic": 1.75,
            "arithmetic_facts": 4.5,
        },
    ),
    # By step 8,200 the drill's facts were learned (99.6%, Trainer.fact_accuracy)
    # and the chains were not: most of its compute goes to them.
    (
        8200,
        {
            "boolean_expressions": 1.75,
            "web_of_lies": 1.0,
            "navigate": 2.5,
            "dyck_languages": 0.5,
            "multistep_arithmetic_two": 0.25,
            "arithmetic": 3.0,
            "arithmetic_facts": 1.0,
        },
    ),
)


@dataclass
class TrainConfig:
    """Defaults are the recipe of the shipped tiny model (see its MODEL_CARD.md)."""

    out_dir: str = "runs/tiny"
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    mlp_hidden_size: int = 768
    max_sequence_length: int = 1024
    batch_size: int = 32
    steps: int = 12000
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    # Steps at which the cosine schedule starts again, from restart_lr down to
    # min_lr at the next restart (or at `steps`). To continue a finished run
    # without changing the rates it trained with, add a restart at its
    # `steps` and raise `steps`. Restarts past `steps` never happen: the
    # cycle running at `steps` ends there.
    lr_restarts: tuple[int, ...] = ()
    restart_lr: float = 4e-4
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # each batch draws one that fits its longest answer
    canvas_lengths: tuple[int, ...] = (
        64,
        96,
        128,
        160,
        192,
        256,
    )
    tight_canvas_share: float = 0.75  # share of batches on the tightest canvas that fits, the rest on any
    block_share: float = 0.5  # share of rows noised like a block decoder's input (see data.mask_answers)
    block_length: int = 64
    # Share of the rows with equations that are cut at a result: clean up to
    # it, masked from there (see data.mask_answers), from step results_from
    # on. Drill rows mask only their results instead.
    cut_share: float = 0.5
    # Step from which the drill masks only results and chains are cut at
    # them; before it every row is plain or block. The shipped run started
    # them at 4,600: on a fresh model they did nothing within 300 steps
    # (the fact plateau comes first, see training/README.md).
    results_from: int = 4600
    task_phases: tuple[tuple[int, dict[str, float]], ...] = field(
        default_factory=lambda: copy.deepcopy(TASK_PHASES)
    )
    bf16_autocast: bool = True  # CPU bf16 matmuls roughly halve the step time where supported
    seed: int = 0
    threads: int = 2
    save_every: int = 50
    eval_every: int = 1000
    eval_examples: int = 8  # per task, validation split
    time_limit_s: float | None = None  # stop (and save) after this much wall time in this run
    # "masked": LLaDA's SFT (every row kind above). "block_diffusion": block-causal
    # attention, each answer block noised on its own (train/block_diffusion.py); each batch
    # draws one of block_lengths, and the export says the model is block-causal. "uniform": a
    # DiffusionGemma-architecture model, uniform-state noise and self-conditioning (train/uniform.py).
    objective: str = "masked"
    canvas_length: int = 64  # uniform: the canvas the model is trained on and decodes
    self_conditioning: float = (
        0.5  # uniform: share of rows whose second pass gets the first's soft embeddings
    )
    block_lengths: tuple[int, ...] = (4, 8, 16, 32)
    keep_validated: bool = False  # also export the model at each validation to RUN/step-N (to pick the best)
    init_from: str | None = None  # a model folder or embedded name ("tiny") to start from, not random weights
    # The run's tokenizer: "tiny", or "tiny-cot" (tiny's tokens, then the words of the long
    # tasks, tasks/vocab.py); a start with fewer tokens gets new rows (train/init_weights.py).
    vocabulary: str = "tiny"
    # Share of the rows whose prompt starts with solved examples of the same task (train/fewshot.py).
    fewshot_share: float = 0.0
    fewshot_max: int = 3  # shots per such row: 1 to this many

    def __post_init__(self):
        for name in (
            "steps",
            "batch_size",
            "block_length",
            "d_model",
            "n_layers",
            "n_heads",
            "threads",
            "canvas_length",
            "fewshot_max",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an integer >= 1, got {value!r}")
        check_task_phases(self.task_phases)
        restarts = list(self.lr_restarts)
        if any(
            isinstance(r, bool) or not isinstance(r, int) or r <= self.warmup_steps for r in restarts
        ) or restarts != sorted(set(restarts)):
            raise InputError(
                f"lr_restarts must be increasing integer steps after the warm-up "
                f"(> warmup_steps = {self.warmup_steps}), got {restarts}"
            )
        if (
            isinstance(self.results_from, bool)
            or not isinstance(self.results_from, int)
            or self.results_from < 0
        ):
            raise InputError(f"results_from must be an integer step >= 0, got {self.results_from!r}")
        vocabulary_extra(self.vocabulary)  # an unknown name is refused before any work
        cot = sorted({name for _, weights in self.task_phases for name in weights} & set(COT_NAMES))
        if cot and self.vocabulary == "tiny":
            # tiny's tokens lack their words: spelled letter by letter, answers would outgrow the canvases
            raise InputError(f"task_phases: {cot[0]} needs vocabulary 'tiny-cot' (--vocabulary tiny-cot)")
        lengths = self.canvas_lengths
        if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
            raise InputError(f"canvas_lengths must be integers >= 1, got {lengths!r}")
        for name in ("tight_canvas_share", "block_share", "cut_share", "fewshot_share"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise InputError(f"{name} must be a number in [0, 1], got {value!r}")
        if self.objective not in OBJECTIVES:
            raise InputError(f"objective must be one of {tuple(OBJECTIVES)}, got {self.objective!r}")
        if not (isinstance(self.self_conditioning, (int, float)) and 0.0 <= self.self_conditioning <= 1.0):
            raise InputError(f"self_conditioning must be a number in [0, 1], got {self.self_conditioning!r}")
        lengths = self.block_lengths
        if (
            not isinstance(lengths, tuple)
            or not lengths
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths)
        ):
            raise InputError(f"block_lengths must be a non-empty tuple of integers >= 1, got {lengths!r}")
        if self.init_from is not None:
            resolve_folder(self.init_from)  # a missing model is refused before any work
        if self.d_model % self.n_heads:
            raise InputError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine cycles: the first from lr, each restart
        from restart_lr, all down to min_lr at the cycle's end."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        restarts = [r for r in self.lr_restarts if r <= step]
        begin = restarts[-1] if restarts else self.warmup_steps
        # restarts past `steps` never happen
        end = min([r for r in self.lr_restarts if r > step] + [self.steps])
        peak = self.restart_lr if restarts else self.lr
        progress = min(1.0, (step - begin) / max(1, end - begin))
        return self.min_lr + (peak - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def check_task_phases(task_phases: tuple[tuple[int, dict[str, float]], ...]) -> None:
    """Phases start at step 0, in increasing order; known tasks, weights >= 0 with a positive sum."""
    starts = [phase[0] for phase in task_phases]
    if (
        not starts
        or any(isinstance(a, bool) or not isinstance(a, int) for a in starts)
        or starts[0] != 0
        or any(b <= a for a, b in zip(starts, starts[1:]))
    ):
        raise InputError(f"task_phases must start at step 0 and in increasing order, got starts {starts}")
    for start, weights in task_phases:
        unknown = sorted(set(weights) - set(TASK_NAMES + COT_NAMES + DRILL_NAMES))
        if unknown:
            raise InputError(
                f"task_phases: unknown task(s) {unknown} at step {start}; "
                f"known: {list(TASK_NAMES + COT_NAMES + DRILL_NAMES)}"
            )
        if any(
            isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0
            for w in weights.values()
        ) or not sum(weights.values()):
            raise InputError(
                f"task_phases: weights at step {start} must be >= 0 with a positive sum, got {weights}"
            )
