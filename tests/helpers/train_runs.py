"""Run folders and micro settings for the trainer's tests."""

import shutil

from caidllm.models.loading import ASSETS

# A micro model that trains in seconds (block_diffusion; the uniform tests override the objective)
MICRO = dict(
    d_model=32,
    n_layers=2,
    n_heads=2,
    mlp_hidden_size=64,
    batch_size=4,
    threads=1,
    bf16_autocast=False,
    eval_every=10_000,
    save_every=5,
    warmup_steps=5,
    objective="block_diffusion",
)


def run_folder(folder):
    """A run folder holding the tokenizer already: the shipped one, which `caidllm train`
    would rebuild (test_train.py checks they are the same; building it takes seconds)."""
    (folder / "tokenizer").mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ASSETS / "tiny" / name, folder / "tokenizer" / name)
    return str(folder)
