"""What results.json records about a bench run besides its rows: the settings, model, tasks,
software and machine it ran with (so a figure can be reproduced and compared), and what each
figure of a row means (`DEFINITIONS`, written into every report)."""

from __future__ import annotations

import os
import platform

import torch

from caidllm.bench.sandbox import isolation_summary
from caidllm.bench.tasks import BenchTask
from caidllm.models.quantize import quantization_info

DEFINITIONS = {
    "accuracy": "mean per-sample score (exact match / pass@1: 0 or 1; LongBench: F1 or ROUGE-L in [0, 1]); "
    "samples that failed to generate or score count as 0",
    "stderr": (
        "standard error of the mean, sample std / sqrt(n) (= sqrt(p(1-p)/(n-1)) for 0/1 scores), as lm-eval"
    ),
    "nfe_mean": "forward passes per request, mean over the task's requests",
    "forwards_per_block": "forward passes per block decoded (a uniform-state decoder's: per canvas), mean "
    "over the task's requests",
    "tokens_per_forward": "answer tokens per forward pass: answer_tokens / the task's forward passes",
    "block_length": "the block length the method decoded with: the run's, or gen_length for Elastic-Cache's "
    "official loop (one block over the whole generation)",
    "steps_per_block": (
        "denoising steps per block index, mean over requests (0 for blocks skipped by early stop)"
    ),
    "steps_per_block_decoded": "the same, over the requests that decoded that block",
    "wall_s": "wall-clock seconds of the generate() calls of this method on this task, after a warm-up; "
    "tokenisation of the prompts and scoring are outside the clock; under torchrun the slowest rank's",
    "tps_positions": "generated positions per second: n * gen_length / wall_s (prompt never counted; "
    "all samples of all ranks)",
    "tps_answer": "answer tokens per second: sum of answer lengths (up to the first end token) / wall_s",
    "speedup": "wall_s of the first method listed / wall_s of this method, same task, same examples",
    "nfe_ratio": "nfe_mean of the first method listed / nfe_mean of this method",
    "weights_mb": "bytes of the model's parameters and buffers / 2^20 (quantized tensors: their data, scales "
    "and zero points), each shared tensor once",
    "high_first_confidence_share": "share of the decoded positions whose confidence at their block's first "
    "step "
    "(s_i) exceeds 0.9, the Fast-dLLM threshold",
    "peak_mem_mb": "CUDA: torch.cuda.max_memory_allocated, reset before each method; CPU: the process's "
    "peak RSS "
    "so far (getrusage; monotone, not per method); under torchrun the largest rank's",
    "energy_j": "GPU: NVML energy counter (or sampled power integrated) during the method's generate() "
    "calls; "
    "CPU: RAPL package energy; null when not measurable",
    "policy_share": "time in the commit policy (policy_s) / wall time, summed over batches (and ranks)",
    "forward_share": (
        "time inside the model forwards (the engine's forward timer, CUDA events on a GPU) / wall time"
    ),
    "engine_overhead_share": "the engine's own time: (wall - forwards - commit policy) / wall: batching, "
    "prediction, bookkeeping, host transfers",
    "flops_share": (
        "share of layer-token work computed (ES-dLLM style backends report it); null when not reported"
    ),
}


def run_settings(s, lm, tasks: list[BenchTask], data_dir, chat: bool, T: dict) -> dict:
    """The report's "settings": the run's BenchConfig (`s`, with its lengths resolved), the model,
    the tasks, and the software and machine it ran on. T: each method's most steps per block."""
    device = torch.device(lm.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    from importlib.metadata import PackageNotFoundError, version

    try:
        caidllm_version = version("caidllm")
    except PackageNotFoundError:
        caidllm_version = None
    return {
        "model": s.model,
        "model_path": str(lm.path) if getattr(lm, "path", None) else None,
        "random_weights": bool(getattr(lm, "random_weights", False)),
        "compile": bool(getattr(lm, "compiled", False)),
        **quantization_info(lm),
        "settings_file": s.loaded_settings().summary() if s.settings_file else None,
        "family": lm.config.family,
        "device": str(device),
        "gpu": gpu,
        "dtype": str(lm.dtype).removeprefix("torch."),
        "tasks": [t.name for t in tasks],
        "task_sources": {t.name: t.source for t in tasks},
        "task_metrics": {t.name: t.metric for t in tasks},
        "task_notes": {t.name: t.notes for t in tasks if t.notes},
        "methods": list(s.methods),
        "prefix_cache_mb": list(s.prefix_cache_mb),
        "baseline": s.methods[0],
        "limit": s.limit,
        "n": {t.name: len(t.samples) for t in tasks},
        "batch_size": s.batch_size,
        "gen_length": s.gen_length,
        "block_length": s.block_length,
        "steps_per_block_max": T,
        "early_stop": s.early_stop,
        "temperature": s.temperature,
        "seed": s.seed,
        "chat_template": chat,
        "fewshot": s.fewshot,
        "prompting": {t.name: (f"{t.fewshot}-shot" if t.fewshot else "zero-shot") for t in tasks},
        "data_dir": str(data_dir) if data_dir else None,
        "warmup": "one batch per method before timing" if s.warmup else "none",
        "code_execution": {"timeout_s": s.code_timeout, "isolation": isolation_summary()}
        if any(t.metric == "pass@1" for t in tasks)
        else None,
        "torch": torch.__version__,
        "caidllm": caidllm_version,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
