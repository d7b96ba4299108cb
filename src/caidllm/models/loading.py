"""Load a model folder in Hugging Face layout: config.json, safetensors
weights (one file or shards with an index), tokenizer.json and
tokenizer_config.json (special tokens, chat template)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import ModelLoadError
from .config import ModelConfig
from .families import get_family, load_config
from .lm import DiffusionLM
from .random_init import build_random, is_random_name

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED = {"tiny": ASSETS / "tiny", "tiny-bd": ASSETS / "tiny-bd"}  # tiny-bd: block-causal (block diffusion)
DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}
END_OF_TURN = ("<|eot_id|>", "<|im_end|>", "<|role_end|>")  # LLaMA-3, ChatML (Qwen, SDAR), LLaDA2
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "additional_special_tokens")


def load(path_or_name, device=None, dtype=None, compile: bool = False) -> DiffusionLM:
    """Load a LLaDA or Dream model from a local folder (or the embedded "tiny"), or
    build one with random weights: "random:llada-8b", "random:dream-7b", with
    config.json overrides as a query string ("random:llada-8b?n_layers=4"; random_init.py).

    device: None = "cuda" if available else "cpu" ("meta": random models only, no memory).
    dtype: None = the checkpoint's torch_dtype; or a torch.dtype / "bfloat16" / "float16" / "float32".
    compile: run the decoding forwards through torch.compile (models/compiled.py).
    """
    lm = _load(path_or_name, device, dtype)
    if compile:
        from .compiled import enable_compile

        enable_compile(lm)
    return lm


def _load(path_or_name, device, dtype) -> DiffusionLM:
    if is_random_name(path_or_name):
        return build_random(path_or_name, resolve_device(device), dtype)
    folder = resolve_folder(path_or_name)
    config = load_config(folder / "config.json")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype if dtype is not None else config.torch_dtype)
    check_device_dtype(device, dtype)
    tokenizer, config = load_tokenizer(folder, config)
    model = load_model(folder, config, device, dtype)
    return DiffusionLM(model, config, tokenizer, device, dtype, path=folder)


def resolve_folder(path_or_name) -> Path:
    if isinstance(path_or_name, str) and path_or_name in EMBEDDED:
        folder = EMBEDDED[path_or_name]
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"the embedded model {path_or_name!r} is not installed (expected it at {folder})")
        return folder
    folder = Path(path_or_name).expanduser()
    if not folder.exists():
        raise ModelLoadError(
            f"model folder {folder} does not exist (expected a local folder in Hugging Face layout, "
            f"or one of the embedded names {sorted(EMBEDDED)}, or random:llada-8b / random:dream-7b)"
        )
    if not folder.is_dir():
        raise ModelLoadError(f"{folder} is a file; expected a model folder containing config.json")
    return folder


def resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelLoadError(f"unknown device {device!r}: {e}") from None


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
        raise ModelLoadError(f"unsupported dtype {dtype}; expected bfloat16, float16 or float32")
    name = str(dtype).lower().removeprefix("torch.")
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


def check_device_dtype(device: torch.device, dtype: torch.dtype) -> None:
    # A tiny trial of the two kernels the model needs, so an unusable pair
    # fails here with a clear message instead of deep inside the first forward.
    try:
        a = torch.ones(1, 1, 4, 8, device=device, dtype=dtype)
        (a @ a.transpose(-1, -2)).sum().item()
        F.scaled_dot_product_attention(a, a, a).sum().item()
    except Exception as e:  # noqa: BLE001 - any failure means the pair is unusable
        raise ModelLoadError(f"device {device} cannot run dtype {dtype}: {type(e).__name__}: {e}") from None


# ---- tokenizer --------------------------------------------------------------


def load_tokenizer(folder: Path, config: ModelConfig):
    """A PreTrainedTokenizerFast from tokenizer.json, with the special tokens
    and chat template of tokenizer_config.json; returns it and the config
    completed with the tokenizer's end-of-turn and BOS ids."""
    tok_file, cfg_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if not tok_file.is_file():
        raise ModelLoadError(f"missing tokenizer file {tok_file}")
    tok_cfg = _read_json(cfg_file) if cfg_file.is_file() else {}
    try:
        tokenizer = fast_tokenizer(tok_cfg, _chat_template(folder, tok_cfg), tokenizer_file=str(tok_file))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types
        raise ModelLoadError(f"cannot load tokenizer {tok_file}: {type(e).__name__}: {e}") from None

    n = len(tokenizer)
    if n > config.vocab_size:
        raise ModelLoadError(f"{tok_file} has {n} tokens but the model's vocabulary has only {config.vocab_size}")
    mask_token = tokenizer.convert_ids_to_tokens(config.mask_id) if 0 <= config.mask_id < n else None
    if mask_token is None:
        raise ModelLoadError(f"mask_token_id {config.mask_id} of config.json is not a token of {tok_file} ({n} tokens)")
    if "mask" not in mask_token.lower() and mask_token != tokenizer.mask_token:
        raise ModelLoadError(f"token {mask_token!r} at mask_token_id {config.mask_id} is not a mask token ({tok_file})")
    if tokenizer.mask_token is None:
        tokenizer.mask_token = mask_token
    for name in ("eos_id", "pad_id"):
        value = getattr(config, name)
        if not 0 <= value < config.vocab_size:
            raise ModelLoadError(f"config.json {name}={value} is outside the vocabulary (size {config.vocab_size})")

    eos_ids = [config.eos_id]
    for token in (tokenizer.eos_token, *END_OF_TURN):
        tid = tokenizer.convert_tokens_to_ids(token) if token else None
        if tid is not None and tid != tokenizer.unk_token_id and tid not in eos_ids:
            eos_ids.append(tid)
    bos_id = config.bos_id if config.bos_id is not None else tokenizer.bos_token_id
    return tokenizer, replace(config, eos_ids=tuple(eos_ids), bos_id=bos_id)


def fast_tokenizer(tok_cfg: dict, chat_template, **source):
    """A PreTrainedTokenizerFast from `source` (tokenizer_file= or tokenizer_object=) with the
    special tokens and settings of a tokenizer_config.json dict."""
    from transformers import PreTrainedTokenizerFast

    kwargs = {k: _token_text(tok_cfg[k]) for k in SPECIAL_KEYS if tok_cfg.get(k) is not None}
    kwargs["chat_template"] = chat_template
    if "model_max_length" in tok_cfg:
        kwargs["model_max_length"] = tok_cfg["model_max_length"]
    kwargs["clean_up_tokenization_spaces"] = bool(tok_cfg.get("clean_up_tokenization_spaces", False))
    return PreTrainedTokenizerFast(**source, **kwargs)


def _token_text(value):
    # tokenizer_config.json stores special tokens as strings or AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    if isinstance(value, list):
        return [_token_text(v) for v in value]
    return value


def _chat_template(folder: Path, tok_cfg: dict):
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: use the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja = folder / "chat_template.jinja"  # newer transformers save it beside the config
    if template is None and jinja.is_file():
        template = jinja.read_text()
    return template


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path} as JSON: {e}") from None


# ---- weights ----------------------------------------------------------------


def load_model(folder: Path, config: ModelConfig, device: torch.device, dtype: torch.dtype):
    """Build the module without memory (meta device), check every checkpoint
    tensor's name and shape against it, then assign the tensors read straight
    onto `device` in `dtype`: the weights are materialised once."""
    from safetensors import safe_open

    with torch.device("meta"):
        model = get_family(config.family).model_class(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    where = weight_files(folder)
    found = _check_weights(where, expected, config)

    state = {}
    for file, names in _by_file(found, where).items():
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in names:
                state[name] = f.get_tensor(name).to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> file holding it, from the shard index or the single file."""
    index, single = folder / "model.safetensors.index.json", folder / "model.safetensors"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index} has no 'weight_map' of tensor names to shard files")
        where = {name: folder / file for name, file in weight_map.items()}
        missing = sorted({p.name for p in where.values() if not p.is_file()})
        if missing:
            raise ModelLoadError(f"shards listed in {index} are missing from {folder}: {', '.join(missing)}")
        return where
    if single.is_file():
        return {name: single for name in _file_names(single)}
    raise ModelLoadError(f"no weights in {folder}: expected model.safetensors or model.safetensors.index.json")


def _file_names(file: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return list(f.keys())
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
        raise ModelLoadError(f"cannot read safetensors file {file}: {e}") from None


def _check_weights(where: dict[str, Path], expected: dict[str, tuple], config: ModelConfig) -> list[str]:
    """Names to load, after checking names and shapes against the module."""
    from safetensors import safe_open

    # Rotary tables are recomputed, and a tied head duplicated in the file is the embedding.
    tied_heads = {"model.transformer.ff_out.weight", "lm_head.weight"} if config.tie_embeddings else set()
    names = [n for n in where if not n.endswith("rotary_emb.inv_freq") and n not in tied_heads]
    missing = sorted(set(expected) - set(names))
    unexpected = sorted(set(names) - set(expected))
    if unexpected:
        raise ModelLoadError(f"unexpected tensors in the checkpoint for a {config.family} model: {_few(unexpected)}")
    if missing:
        raise ModelLoadError(f"tensors missing from the checkpoint: {_few(missing)}")

    for file, file_names in _by_file(names, where).items():
        try:
            with safe_open(str(file), framework="pt") as f:
                present = set(f.keys())
                for name in file_names:
                    if name not in present:
                        raise ModelLoadError(f"tensor {name} is listed for {file.name} but that file does not hold it")
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != expected[name]:
                        raise ModelLoadError(
                            f"tensor {name} in {file.name} has shape {list(shape)}, "
                            f"expected {list(expected[name])} from config.json"
                        )
        except ModelLoadError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(f"cannot read safetensors file {file}: {e}") from None
    return names


def _by_file(names, where) -> dict[Path, list[str]]:
    groups: dict[Path, list[str]] = {}
    for name in names:
        groups.setdefault(where[name], []).append(name)
    return groups


def _few(names: list[str], k: int = 5) -> str:
    more = f" (and {len(names) - k} more)" if len(names) > k else ""
    return ", ".join(names[:k]) + more
