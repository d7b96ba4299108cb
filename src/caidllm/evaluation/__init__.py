"""lm-eval integration: the ``caidllm`` model (lm_eval_adapter) and offline
task configs for the files of the benchmark data folder (tasks/).

    python -m caidllm.evaluation --model caidllm --model_args pretrained=DIR,method=cai \\
        --tasks caidllm_gsm8k --batch_size 8 --output_path runs/lm-eval

Needs the optional extra: ``pip install 'caidllm[eval]'``.
"""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"

__all__ = ["TASKS_DIR"]
