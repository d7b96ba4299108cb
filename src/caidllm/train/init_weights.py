"""A run's first weights from a model folder (`--init-from`), the vocabulary possibly larger.

A run whose vocabulary extends the start's (`--vocabulary tiny-cot` from `tiny`: the
same ids for every token of the start, new ones appended) keeps the start's embedding and
output rows for its tokens; every row past them (the new tokens and the padding) starts
as the mean of the start's token rows, so a new word begins as an average token rather
than one of the start's padding rows, which training pushed away from every prediction.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from caidllm.errors import InputError
from caidllm.models.loading import resolve_folder

# The tensors with one row per token, in the LLaDA layout.
VOCAB_TENSORS = ("model.transformer.wte.weight", "model.transformer.ff_out.weight")


def token_count(folder: Path) -> int | None:
    """Tokens in the folder's tokenizer.json (None without one)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return len(data["model"]["vocab"])


def check_vocabulary_extends(start: Path, run_tokenizer: Path, name: str) -> None:
    """Refuse a start whose tokens do not keep their ids in the run's tokenizer."""
    old = json.loads((start / "tokenizer.json").read_text())["model"]["vocab"]
    new = json.loads(run_tokenizer.read_text())["model"]["vocab"]
    if [t for t, _ in new[: len(old)]] != [t for t, _ in old]:
        raise InputError(
            f"init_from {name!r}: its tokenizer is not a prefix of the run's (--vocabulary), "
            "so its embedding rows would belong to other tokens"
        )


def grow_rows(weights: dict[str, torch.Tensor], rows: int, kept: int) -> dict[str, torch.Tensor]:
    """The vocabulary tensors widened to `rows` rows: the first `kept` copied, the rest
    the mean of those."""
    out = dict(weights)
    for key in VOCAB_TENSORS:
        if key not in weights or weights[key].shape[0] >= rows:
            continue
        old = weights[key].float()
        grown = old[:kept].mean(dim=0, keepdim=True).repeat(rows, 1)
        grown[:kept] = old[:kept]
        out[key] = grown
    return out


def load_initial_weights(model: torch.nn.Module, name: str, run_tokenizer: Path, describe: str) -> None:
    folder, _ = resolve_folder(name)
    if not (folder / "model.safetensors").is_file():
        raise InputError(f"init_from {name!r}: {folder} has no model.safetensors")
    weights = {key: value.float() for key, value in load_file(str(folder / "model.safetensors")).items()}
    rows = model.state_dict().get(VOCAB_TENSORS[0])
    kept = token_count(folder)
    if rows is not None and kept is not None and VOCAB_TENSORS[0] in weights:
        if weights[VOCAB_TENSORS[0]].shape[0] < rows.shape[0]:
            check_vocabulary_extends(folder, run_tokenizer, name)
            weights = grow_rows(weights, rows.shape[0], kept)
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1].strip()
        raise InputError(
            f"init_from {name!r}: its weights do not fit the model of this TrainConfig ({describe}): {first}"
        ) from None
