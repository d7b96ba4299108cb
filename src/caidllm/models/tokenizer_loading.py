"""A model folder's tokenizer (tokenizer.json, tokenizer_config.json, the chat template) and the ids the
checkpoint's own files give: the mask token (checked against the tokenizer), the end ids, BOS."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..errors import ModelLoadError
from .config import ModelConfig
from .families import get_family
from .tokenizer import END_OF_TURN, fast_tokenizer


def load_tokenizer(folder: Path, config: ModelConfig):
    """A PreTrainedTokenizerFast from tokenizer.json, with the special tokens
    and chat template of tokenizer_config.json; returns it and the config
    completed with the tokenizer's end-of-turn and BOS ids."""
    tok_file, cfg_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if not tok_file.is_file():
        raise ModelLoadError(f"missing tokenizer file {tok_file}")
    tok_cfg = read_json(cfg_file) if cfg_file.is_file() else {}
    try:
        tokenizer = fast_tokenizer(tok_cfg, _chat_template(folder, tok_cfg), tokenizer_file=str(tok_file))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types
        raise ModelLoadError(f"cannot load tokenizer {tok_file}: {type(e).__name__}: {e}") from None

    n = len(tokenizer)
    if n > config.vocab_size:
        raise ModelLoadError(
            f"{tok_file} has {n} tokens but the model's vocabulary has only {config.vocab_size}"
        )
    generation = (
        read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
    )
    # a uniform-state family (DiffusionGemma) has no mask token: its canvases start as random tokens
    mask_id = (
        None
        if get_family(config.family).uniform
        else checkpoint_mask_id(tokenizer, config, generation, folder)
    )
    if tokenizer.mask_token is None and mask_id is not None:
        tokenizer.mask_token = tokenizer.convert_ids_to_tokens(mask_id)
    for name in ("eos_id", "pad_id"):
        value = getattr(config, name)
        if not 0 <= value < config.vocab_size:
            raise ModelLoadError(
                f"config.json {name}={value} is outside the vocabulary (size {config.vocab_size})"
            )

    # Every id the checkpoint's own files give as an end: config.json's and generation_config.json's
    # eos, the tokenizer's eos and pad (an instruct model fills the tail with it: DiffuCoder's
    # <|dlm_pad|>) and the end-of-turn tokens its chat template writes.
    eos_ids = [config.eos_id, *_ids(generation.get("eos_token_id")), config.pad_id]
    for token in (tokenizer.eos_token, tokenizer.pad_token, *END_OF_TURN):
        tid = tokenizer.convert_tokens_to_ids(token) if token else None
        if tid is not None and tid != tokenizer.unk_token_id:
            eos_ids.append(tid)
    eos_ids = tuple(i for i in dict.fromkeys(eos_ids) if i != mask_id)
    bos_id = config.bos_id if config.bos_id is not None else tokenizer.bos_token_id
    return tokenizer, replace(config, mask_id=mask_id, eos_ids=eos_ids, bos_id=bos_id)


def checkpoint_mask_id(tokenizer, config: ModelConfig, generation: dict, folder: Path) -> int:
    """The mask id the checkpoint's own files give: config.json's mask_token_id, else
    generation_config.json's, else tokenizer_config.json's mask_token. The id must be a
    token of the tokenizer whose text is a mask token; two files naming different mask
    tokens are an error (never a silent choice)."""
    n = len(tokenizer)
    named = {}
    for source, value in (
        ("config.json mask_token_id", config.mask_id),
        ("generation_config.json mask_token_id", generation.get("mask_token_id")),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            named[source] = value
    if tokenizer.mask_token is not None:
        named["tokenizer_config.json mask_token"] = tokenizer.convert_tokens_to_ids(tokenizer.mask_token)
    if not named:
        raise ModelLoadError(
            f"{folder}: no mask token: config.json has no mask_token_id and tokenizer_config.json "
            "no mask_token (a masked diffusion model needs one)"
        )
    for source, mask_id in named.items():
        token = tokenizer.convert_ids_to_tokens(mask_id) if 0 <= mask_id < n else None
        if token is None:
            raise ModelLoadError(
                f"{source} {mask_id} is not a token of {folder / 'tokenizer.json'} ({n} tokens)"
            )
        if "mask" not in token.lower() and token != tokenizer.mask_token and not _config_mask(config, source):
            raise ModelLoadError(
                f"token {token!r} at {source.split()[1]} {mask_id} is not a mask token ({source})"
            )
    if len(set(named.values())) > 1:
        raise ModelLoadError(
            f"{folder}: the mask token ids disagree: "
            + ", ".join(f"{source} = {i}" for source, i in named.items())
        )
    return next(iter(named.values()))


def _config_mask(config: ModelConfig, source: str) -> bool:
    """config.json's own mask id on a family that takes it as given (Family.mask_from_config)."""
    return source.startswith("config.json") and get_family(config.family).mask_from_config


def _ids(value) -> list[int]:
    """eos_token_id of a generation_config.json: an int, a list of ints, or absent."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _chat_template(folder: Path, tok_cfg: dict):
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: use the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja = folder / "chat_template.jinja"  # newer transformers save it beside the config
    if template is None and jinja.is_file():
        template = jinja.read_text()
    return template


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path} as JSON: {e}") from None
