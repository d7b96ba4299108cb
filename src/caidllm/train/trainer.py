"""Masked diffusion SFT of a small LLaDA-architecture model on the synthetic
tasks, on a CPU: resumable, seeded, logged, with validation accuracy.

The loss is LLaDA's: mask each answer position with probability t ~ U(eps, 1),
cross-entropy on the masked positions weighted by 1/t, normalised by the
answer length. Rows of the facts drill mask only their results (how a
fact table gets learned); half of the chain rows with equations are cut at
a result (clean up to it, masked from there: no later token gives it
away), and half of the others are "block rows" (a clean answer prefix, a
noised block, a fully masked tail: what a block decoder feeds the model);
see data.mask_answers. Everything the run needs to resume (weights, optimiser, step)
is in `checkpoint.pt`; the data stream and the masking are seeded by the step,
so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tqdm import tqdm

from caidllm.errors import InputError
from caidllm.models.families import family_of, parse_config
from caidllm.models.lm import DiffusionLM
from caidllm.models.loading import load_tokenizer, resolve_folder
from caidllm.tasks import DRILL_NAMES, TASK_NAMES, get_task, get_training_task, score
from caidllm.tasks.vocab import build_tokenizer
from caidllm.train.data import TaskStream, encode_pair
from caidllm.train.moe_balance import ExpertBalancer, initial_config
from caidllm.train.objectives import OBJECTIVES
from caidllm.train.uniform import generation_config_dict, init_from_llada, initialise

SPECIAL_TOKEN_NAMES = {
    "bos": "<|startoftext|>",
    "eos": "<|endoftext|>",
    "mask": "<|mdm_mask|>",
    "eot": "<|eot_id|>",
}

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
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an integer >= 1, got {value!r}")
        starts = [phase[0] for phase in self.task_phases]
        if (
            not starts
            or any(isinstance(a, bool) or not isinstance(a, int) for a in starts)
            or starts[0] != 0
            or any(b <= a for a, b in zip(starts, starts[1:]))
        ):
            raise InputError(f"task_phases must start at step 0 and in increasing order, got starts {starts}")
        for start, weights in self.task_phases:
            unknown = sorted(set(weights) - set(TASK_NAMES + DRILL_NAMES))
            if unknown:
                raise InputError(
                    f"task_phases: unknown task(s) {unknown} at step {start}; "
                    f"known: {list(TASK_NAMES + DRILL_NAMES)}"
                )
            if any(
                isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0
                for w in weights.values()
            ) or not sum(weights.values()):
                raise InputError(
                    f"task_phases: weights at step {start} must be >= 0 with a positive sum, got {weights}"
                )
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
        for name in ("tight_canvas_share", "block_share", "cut_share"):
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


def model_config_dict(cfg: TrainConfig, vocab_size: int, special: dict[str, int]) -> dict:
    """config.json in the official LLaDA layout, so the result loads like LLaDA-8B."""
    return {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_heads,
        "mlp_hidden_size": cfg.mlp_hidden_size,
        "mlp_ratio": cfg.mlp_hidden_size / cfg.d_model,
        "vocab_size": vocab_size,
        "embedding_size": vocab_size,
        "max_sequence_length": cfg.max_sequence_length,
        "rope": True,
        "rope_theta": 10000.0,
        "rope_full_precision": True,
        "block_type": "llama",
        "activation_type": "silu",
        "layer_norm_type": "rms",
        "rms_norm_eps": 1e-5,
        "include_bias": False,
        "include_qkv_bias": False,
        "bias_for_layer_norm": False,
        "attention_layer_norm": False,
        "weight_tying": False,
        "alibi": False,
        "scale_logits": False,
        "input_emb_norm": False,
        "mask_token_id": special["mask"],
        "eos_token_id": special["eos"],
        "pad_token_id": special["eos"],
        "bos_token_id": special["bos"],
        "torch_dtype": "float32",
        "use_cache": False,
    }


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(cfg.threads)
        self.tokenizer_dir = self.out / "tokenizer"
        if not (self.tokenizer_dir / "tokenizer.json").exists():
            build_tokenizer(self.tokenizer_dir)
        vocab = Tokenizer.from_file(str(self.tokenizer_dir / "tokenizer.json"))
        special = {name: vocab.token_to_id(token) for name, token in SPECIAL_TOKEN_NAMES.items()}
        vocab_size = -(-vocab.get_vocab_size() // 64) * 64  # embedding rows padded like the real models'
        self.special = special
        self.objective = OBJECTIVES[cfg.objective]
        self._build_model(vocab_size)
        self.balancer = ExpertBalancer(self.model)  # LLaDA2's expert score bias (a no-op without MoE layers)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=(0.9, 0.95),
        )
        self.stream = TaskStream(
            self.tokenizer,
            cfg.task_phases,
            cfg.batch_size,
            cfg.canvas_lengths,
            eot_id=special["eot"],
            eos_id=special["eos"],
            seed=cfg.seed,
            tight_canvas_share=cfg.tight_canvas_share,
        )
        self.step = 0
        self.trained_s = 0.0
        self._resume()

    def _build_model(self, vocab_size: int) -> None:
        """The config.json trained (the objective's, or the start's architecture), the model, its weights."""
        self.raw_config = model_config_dict(self.cfg, vocab_size, self.special)
        if self.objective.model_config is not None:  # uniform: a DiffusionGemma-architecture model
            self.raw_config = self.objective.model_config(self.cfg, self.raw_config, vocab_size, self.special)
        elif self.cfg.init_from is not None:  # its own architecture (tiny-moe: LLaDA2, upcycled from tiny-bd)
            self.raw_config = initial_config(self.cfg.init_from, self.raw_config)
        self.tokenizer, self.model_config = load_tokenizer(self.tokenizer_dir, parse_config(self.raw_config))
        torch.manual_seed(self.cfg.seed)
        # PyTorch's default initialisation (unit-variance embeddings,
        # 1/sqrt(fan_in) linears), not the 0.02-std init of the 8B models: at
        # this size the small init leaves the model unable to learn to copy
        # tokens from its context (on one fixed batch, a micro model reaches
        # loss 0.7 with it and 0.006 without after 150 steps; see
        # tests/test_train.py::test_a_fresh_model_memorises_one_batch).
        self.model = family_of(self.raw_config).model_class(self.model_config)
        if self.objective.uniform:
            initialise(self.model)
        if self.cfg.init_from is not None:
            self._load_initial_weights(self.cfg.init_from)
        if self.objective.export_config is not None:
            self.raw_config = self.objective.export_config(self.cfg, self.raw_config)

    def _load_initial_weights(self, name: str) -> None:
        folder, _ = resolve_folder(name)
        if not (folder / "model.safetensors").is_file():
            raise InputError(f"init_from {name!r}: {folder} has no model.safetensors")
        if self.objective.uniform:  # from a LLaDA-layout model: what fits (train/uniform.py)
            self.log(
                {
                    "event": "initialised from",
                    "model": name,
                    "tensors": len(init_from_llada(self.model, folder)),
                }
            )
            return
        weights = load_file(str(folder / "model.safetensors"))
        try:
            self.model.load_state_dict({key: value.float() for key, value in weights.items()})
        except RuntimeError as e:
            first = str(e).strip().splitlines()[-1].strip()
            raise InputError(
                f"init_from {name!r}: its weights do not fit the model of this TrainConfig "
                f"(d_model={self.cfg.d_model}, n_layers={self.cfg.n_layers}, "
                f"mlp_hidden_size={self.cfg.mlp_hidden_size}): {first}"
            ) from None

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def _resume(self):
        if not self.checkpoint_path.exists():
            return
        state = torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.trained_s = state["step"], state.get("trained_s", 0.0)
        self.log({"event": "resumed", "step": self.step})

    def save(self):
        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "step": self.step,
                "trained_s": self.trained_s,
                "config": asdict(self.cfg),
            },
            tmp,
        )
        tmp.replace(self.checkpoint_path)

    def log(self, record: dict):
        with open(self.out / "train.log", "a") as f:
            f.write(json.dumps(record) + "\n")

    def loss_on(self, step: int) -> torch.Tensor:
        batch = self.stream.batch(step)
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
        return self.objective.loss(self, step, batch, generator)

    def train(self) -> None:
        cfg = self.cfg
        self.model.train()
        run_started = time.time()
        bar = tqdm(total=cfg.steps, initial=self.step, desc="train", dynamic_ncols=True)
        while self.step < cfg.steps:
            tick = time.time()
            for group in self.optimizer.param_groups:
                group["lr"] = cfg.lr_at(self.step)
            loss = self.loss_on(self.step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            self.balancer.update()
            self.step += 1
            self.trained_s += time.time() - tick
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if self.step % 20 == 0:
                self.log(
                    {
                        "step": self.step,
                        "loss": round(loss.item(), 4),
                        "lr": cfg.lr_at(self.step),
                        "trained_s": round(self.trained_s, 1),
                    }
                )
            if self.step % cfg.save_every == 0 or self.step == cfg.steps:
                self.save()
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                self.log({"step": self.step, "facts": self.fact_accuracy(), "validation": self.validate()})
                if cfg.keep_validated:
                    self.export(self.out / f"step-{self.step}")
                self.model.train()
            # A run whose last step just finished is done, not stopped: its validation stays the
            # log's last line (training/run_chunks.sh reads it to know the run is over).
            out_of_time = cfg.time_limit_s is not None and time.time() - run_started > cfg.time_limit_s
            if out_of_time and self.step < cfg.steps:
                self.save()
                self.log({"event": "time limit reached", "step": self.step})
                break
        bar.close()

    def as_lm(self):
        """The model being trained, wrapped like a loaded checkpoint (fp32, eval mode)."""
        self.model.eval()
        return DiffusionLM(self.model, self.model_config, self.tokenizer, torch.device("cpu"), torch.float32)

    @torch.no_grad()
    def validate(
        self, method: str = "fastdllm", n: int | None = None, gen_length: int = 256
    ) -> dict[str, float]:
        """Accuracy per task on the validation split (a fast decoder, to keep training moving)."""
        from caidllm.decode import generate

        lm = self.as_lm()
        n = n or self.cfg.eval_examples
        accuracy = {}
        names = TASK_NAMES
        if self.objective.mix_only:
            names = [n for n in TASK_NAMES if any(w.get(n) for _, w in self.cfg.task_phases)]
        for name in names:
            examples = get_task(name).examples("validation", n, seed=self.cfg.seed)
            prompts = [e.prompt for e in examples]
            if self.objective.decode is not None:
                texts = self.objective.decode(lm, prompts, gen_length)
            else:
                texts = [
                    r.text
                    for r in generate(
                        lm, prompts, method=method, gen_length=gen_length, block_length=64, batch_size=8
                    )
                ]
            accuracy[name] = sum(score(name, text, e.target) for text, e in zip(texts, examples)) / len(
                examples
            )
        return accuracy

    @torch.no_grad()
    def fact_accuracy(self, n: int = 64) -> float:
        """Share of the arithmetic drill's facts (validation split) whose
        result the model fills in right in one forward pass, with every
        result masked and the operands given: how far the facts the chains
        rely on are learned. None for a uniform-state model (no mask token)."""
        if self.objective.uniform:
            return None
        self.model.eval()
        right = total = 0
        for example in get_training_task("arithmetic_facts").examples("validation", n, seed=self.cfg.seed):
            prompt, answer = encode_pair(self.tokenizer, example.prompt, example.answer, self.special["eot"])
            flagged = [len(prompt) + i for i, flag in enumerate(self.stream.answer_results(answer)) if flag]
            ids = torch.tensor(prompt + answer)
            noisy = ids.clone()
            noisy[flagged] = self.special["mask"]
            hits = (self.model(noisy[None])[0].argmax(-1) == ids)[flagged].tolist()
            per_fact = []  # a fact's result is a run of adjacent flagged positions
            for i, (position, hit) in enumerate(zip(flagged, hits)):
                if i and position == flagged[i - 1] + 1:
                    per_fact[-1] = per_fact[-1] and hit
                else:
                    per_fact.append(hit)
            right += sum(per_fact)
            total += len(per_fact)
        return round(right / total, 4)

    def export(self, folder: str | Path) -> Path:
        """Write the model in the Hugging Face layout of LLaDA-8B (bf16 weights)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        # the score bias stays fp32, as LLaDA2 ships it
        tensors = {
            name: t.detach()
            .to(torch.float32 if name.endswith("expert_bias") else torch.bfloat16)
            .contiguous()
            for name, t in self.model.state_dict().items()
        }
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        # stored bf16, computed in fp32 on CPU by default
        config = dict(self.raw_config, torch_dtype="float32")
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if self.objective.uniform:  # the sampler's defaults and end tokens
            generation = generation_config_dict(self.special)
            (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (self.tokenizer_dir / name).exists():
                shutil.copy(self.tokenizer_dir / name, folder / name)
        return folder
