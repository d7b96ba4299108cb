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

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from tqdm import tqdm

from caidllm.models.families import family_of, parse_config
from caidllm.models.lm import DiffusionLM
from caidllm.models.loading import load_tokenizer, resolve_folder
from caidllm.tasks import COT_NAMES, TASK_NAMES, get_task, get_training_task, score
from caidllm.tasks.vocab import build_tokenizer
from caidllm.train.config import TrainConfig
from caidllm.train.data import TaskStream, encode_pair
from caidllm.train.fewshot import FewShot
from caidllm.train.init_weights import load_initial_weights
from caidllm.train.moe_balance import ExpertBalancer, initial_config
from caidllm.train.objectives import OBJECTIVES
from caidllm.train.uniform import generation_config_dict, init_from_llada, init_from_uniform, initialise

SPECIAL_TOKEN_NAMES = {
    "bos": "<|startoftext|>",
    "eos": "<|endoftext|>",
    "mask": "<|mdm_mask|>",
    "eot": "<|eot_id|>",
}


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
            build_tokenizer(self.tokenizer_dir, vocabulary=cfg.vocabulary)
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
            fewshot=FewShot(
                cfg.fewshot_share, cfg.fewshot_max, cfg.max_sequence_length - max(cfg.canvas_lengths)
            ),
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
        if self.objective.uniform:  # all of a DiffusionGemma-layout start, else what fits of a LLaDA one
            folder, _ = resolve_folder(name)
            start_type = json.loads((folder / "config.json").read_text()).get("model_type")
            copy = init_from_uniform if start_type == "diffusion_gemma" else init_from_llada
            copied = copy(self.model, folder)
            self.log({"event": "initialised from", "model": name, "tensors": len(copied)})
            return
        describe = (
            f"d_model={self.cfg.d_model}, n_layers={self.cfg.n_layers}, "
            f"mlp_hidden_size={self.cfg.mlp_hidden_size}"
        )
        load_initial_weights(self.model, name, self.tokenizer_dir / "tokenizer.json", describe)

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
        self, method: str = "fastdllm", n: int | None = None, gen_length: int | None = None
    ) -> dict[str, float]:
        """Accuracy per task on the validation split (a fast decoder, to keep training moving),
        generating as long as the largest canvas (256 for `tiny`), in whole blocks of 64."""
        from caidllm.decode import generate

        gen_length = gen_length or -(-max(self.cfg.canvas_lengths) // 64) * 64
        lm = self.as_lm()
        n = n or self.cfg.eval_examples
        accuracy = {}
        for name in self.validated_tasks():
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

    def validated_tasks(self) -> tuple[str, ...]:
        """The long tasks the run trains on, and the benchmark families none of them covers (a
        cot variant's validation questions are drawn like its family's and scored alike: both at
        gen 512 would double the cost for nothing). Without long tasks: the benchmark families."""
        mixed = {name for _, weights in self.cfg.task_phases for name, w in weights.items() if w}
        if self.objective.mix_only:  # a slow decoder: only the tasks the run trains on
            return tuple(name for name in TASK_NAMES + COT_NAMES if name in mixed)
        cot = tuple(name for name in COT_NAMES if name in mixed)
        covered = {get_task(name).split_key for name in cot}
        return tuple(name for name in TASK_NAMES if name not in covered) + cot

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
