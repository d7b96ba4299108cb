"""Load a model folder in Hugging Face layout: config.json, safetensors
weights (one file or shards with an index), tokenizer.json and
tokenizer_config.json (special tokens, chat template)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: F401 - tests patch loading.F

from ..errors import ModelLoadError
from .checkpoints import identify, refused_variant
from .config import ModelConfig
from .device import DTYPES, check_device_dtype, resolve_device, resolve_dtype  # noqa: F401 - also read here
from .families import get_family, load_config
from .hub import download, is_hub_id
from .lm import DiffusionLM
from .moe import set_moe_kernel
from .moe_experts import ExpertStacks
from .moe_kernels import check_kernel
from .quantize import (
    QuantizePlan,
    check_not_quantized,
    check_quantization,
    decoder_layers,
    is_quantized_tensor,
    make_plan,
)
from .random_init import build_random, is_random_name, random_raw_config
from .tokenizer_loading import load_tokenizer, read_json

ASSETS = Path(__file__).resolve().parent.parent / "assets"
# tiny-bd: block-causal (block diffusion); tiny-moe: LLaDA2 layout (MoE, block diffusion), upcycled from
# tiny-bd; tiny-dg: DiffusionGemma layout (uniform-state block diffusion, canvases of 64)
EMBEDDED = {name: ASSETS / name for name in ("tiny", "tiny-bd", "tiny-moe", "tiny-dg")}


def load(
    path_or_name,
    device=None,
    dtype=None,
    compile: bool = False,
    quantize: str | None = None,
    quantize_head: bool = False,
    moe_kernel: str = "auto",
    shard=None,
) -> DiffusionLM:
    """Load a LLaDA or Dream model from a local folder (or the embedded "tiny"), or
    build one with random weights: "random:llada-8b", "random:dream-7b", with
    config.json overrides as a query string ("random:llada-8b?n_layers=4"; random_init.py).

    device: None = "cuda" if available else "cpu" ("meta": random models only, no memory).
    dtype: None = the checkpoint's torch_dtype; or a torch.dtype / "bfloat16" / "float16" / "float32".
    compile: run the decoding forwards through torch.compile (models/compiled.py).
    quantize: None, or "int8", "int8-dynamic", "int4", "fp8": torchao quantized weights for the
    layers' linear layers, applied layer by layer as they load (models/quantize.py);
    quantize_head: the untied output head too.
    moe_kernel: how mixture-of-experts layers run their experts (models/moe_kernels.py): "auto",
    "loop" (the per-expert reference), "grouped", "sized", "padded", "native" (these four: full-precision
    experts only; native: a compiled CPU kernel, refused where it cannot build or run).
    shard: a tensor-parallel rank's reader (parallel/loading.py): it divides the model built on the
    meta device and reads only its rank's part of each tensor (checkpoint folders; a random model
    is drawn whole and `lm.sharded` stays False).
    """
    check_kernel(moe_kernel, quantized=quantize is not None)  # before any weight is read
    if compile and quantize is not None:  # a pair torch cannot compile fails before the model loads
        _check_compile_quantized(path_or_name, device, dtype, quantize)
    lm = _load(path_or_name, device, dtype, quantize, quantize_head, shard, pack=not compile)
    set_moe_kernel(lm.model, moe_kernel)
    if compile:
        from .compiled import enable_compile

        enable_compile(lm)
    return lm


def _check_compile_quantized(path_or_name, device, dtype, quantize) -> None:
    from .compiled import check_quantized_compile

    device = resolve_device(device)
    if dtype is None:  # the checkpoint's, as _load reads it
        if is_random_name(path_or_name):
            dtype = random_raw_config(path_or_name)[1]["torch_dtype"]
        else:
            dtype = load_config(resolve_folder(path_or_name)[0] / "config.json").torch_dtype
    dtype = resolve_dtype(dtype)
    check_quantization(quantize, device, dtype)
    check_quantized_compile(quantize, device.type, dtype)


def _load(path_or_name, device, dtype, quantize, quantize_head, shard=None, pack=True) -> DiffusionLM:
    if is_random_name(path_or_name):
        return build_random(
            path_or_name,
            resolve_device(device),
            dtype,
            quantize=quantize,
            quantize_head=quantize_head,
            pack=pack,
        )
    folder, hub_id = resolve_folder(path_or_name)
    config = load_config(folder / "config.json")
    checkpoint = identify(folder, config.raw, hub_id)
    if checkpoint is not None:  # its recommended gating and f, unless config.json sets its own
        config = replace(
            config,
            confidence_gating=config.raw.get(
                "caidllm_confidence_gating", checkpoint.recommended.confidence_gating
            ),
            cache_refresh_every=config.raw.get(
                "caidllm_cache_refresh_every", checkpoint.recommended.refresh_every
            ),
        )
    device = resolve_device(device)
    dtype = resolve_dtype(dtype if dtype is not None else config.torch_dtype)
    check_device_dtype(device, dtype)
    check_not_quantized(config.raw, folder / "config.json")
    plan = make_plan(quantize, device, dtype, quantize_head, pack)  # before any weight is read
    tokenizer, config = load_tokenizer(folder, config)
    if shard is not None and get_family(config.family).uniform:
        # DiffusionGemma's fused expert tensors have no part-by-part reader yet: the rank reads the whole
        # model, and parallel/launch.py divides it (as a random shape's): each rank holds it all a moment
        shard = None
    model = load_model(folder, config, device, dtype, plan, shard)
    lm = DiffusionLM(
        model,
        config,
        tokenizer,
        device,
        dtype,
        path=folder,
        quantization=quantize,
        quantized_head=quantize_head,
    )
    lm.name, lm.checkpoint = hub_id or str(path_or_name), checkpoint
    lm.sharded = shard is not None
    return lm


def resolve_folder(path_or_name) -> tuple[Path, str | None]:
    """The local folder of `path_or_name` and, when it was a hub id, that id (models/hub.py)."""
    refusal = refused_variant(path_or_name)  # a quantized variant caidllm cannot load: before any download
    if refusal:
        raise ModelLoadError(refusal)
    if isinstance(path_or_name, str) and path_or_name in EMBEDDED:
        folder = EMBEDDED[path_or_name]
        if not (folder / "config.json").is_file():
            raise ModelLoadError(
                f"the embedded model {path_or_name!r} is not installed (expected it at {folder})"
            )
        return folder, None
    folder = Path(path_or_name).expanduser()
    if not folder.exists() and isinstance(path_or_name, str) and is_hub_id(path_or_name):
        return download(path_or_name), path_or_name.split("@", 1)[0]
    if not folder.exists():
        raise ModelLoadError(
            f"model folder {folder} does not exist (expected a local folder in Hugging Face layout, a hub id "
            f"ORG/NAME[@REVISION], one of the embedded names {sorted(EMBEDDED)}, or random:llada-8b / "
            "random:dream-7b)"
        )
    if not folder.is_dir():
        raise ModelLoadError(f"{folder} is a file; expected a model folder containing config.json")
    return folder, None


# ---- tokenizer --------------------------------------------------------------


# ---- weights ----------------------------------------------------------------


def load_model(
    folder: Path,
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    plan: QuantizePlan | None = None,
    shard=None,
):
    """Build the module without memory (meta device), check every checkpoint
    tensor's name and shape against it, then assign the tensors read straight
    onto `device` in `dtype`: the weights are materialised once. With a
    quantization plan, the layers load one at a time, each quantized before
    the next is read (peak: the rest of the model, the quantized layers and
    one layer in full precision)."""
    from safetensors import safe_open

    with torch.device("meta"):
        model = get_family(config.family).model_class(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if plan is not None:
        plan.check(model)
    where = weight_files(folder)
    found = _check_weights(where, expected, config)
    if shard is not None and get_family(config.family).sequential:
        raise ModelLoadError(
            f"--tp: tensor parallelism is not implemented for the {config.family} family; "
            "load it on one device"
        )
    if shard is not None:  # a tensor-parallel rank: its part of each tensor only (parallel/loading.py)
        return shard(model, config, where, found, device, dtype).eval()

    stacks = ExpertStacks(expected)
    for group, layer in _load_groups(model, found, plan):
        state = {}
        # Each group opens its files anew: a file's mapped pages are let go once its group is read.
        for file, names in _by_file(group, where).items():
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for name in names:
                    tensor = f.get_tensor(name).to(dtype)
                    if not stacks.take(name, tensor):  # an expert's projection goes into its layer's stack
                        state[name] = tensor
        state.update(stacks.drain())
        model.load_state_dict(state, strict=plan is None, assign=True)  # in groups: each is a part
        del state
        if layer is not None:
            plan.layer(layer)
            _own_copies(layer)
    if plan is not None:
        plan.finish(model)
    return model.eval()


@torch.no_grad()
def _own_copies(layer) -> None:
    """Give the layer's unquantized tensors (norms, a router) memory of their own: on a CPU,
    safetensors' tensors are views of the file's mapping, and one small norm weight would keep the
    whole file mapped, with every page the layer's quantization read."""
    for module in layer.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if not is_quantized_tensor(param):
                module._parameters[name] = torch.nn.Parameter(
                    param.clone(), requires_grad=param.requires_grad
                )
        for name, buffer in list(module.named_buffers(recurse=False)):
            module._buffers[name] = buffer.clone()


def _load_groups(model, names: list[str], plan: QuantizePlan | None):
    """(tensor names, layer to quantize after them or None): all at once without a plan; else
    everything outside the layers first, then each layer's own."""
    if plan is None:
        return [(names, None)]
    prefix, layers = decoder_layers(model)
    per_layer = {i: [] for i in range(len(layers))}
    rest = []
    for name in names:
        head, _, tail = name.partition(prefix + ".")
        if head == "" and tail:
            per_layer[int(tail.split(".", 1)[0])].append(name)
        else:
            rest.append(name)
    return [(rest, None)] + [(per_layer[i], layers[i]) for i in range(len(layers))]


def weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> file holding it, from the shard index or the single file."""
    index, single = folder / "model.safetensors.index.json", folder / "model.safetensors"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index} has no 'weight_map' of tensor names to shard files")
        where = {name: folder / file for name, file in weight_map.items()}
        missing = sorted({p.name for p in where.values() if not p.is_file()})
        if missing:
            raise ModelLoadError(f"shards listed in {index} are missing from {folder}: {', '.join(missing)}")
        return where
    if single.is_file():
        return {name: single for name in _file_names(single)}
    pickles = sorted(p.name for p in folder.glob("*.bin"))
    hint = (
        f" ({', '.join(pickles[:2])} found: caidllm reads safetensors only, never .bin pickles)"
        if pickles
        else ""
    )
    raise ModelLoadError(
        f"no weights in {folder}: expected model.safetensors or model.safetensors.index.json{hint}"
    )


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
    ignores = get_family(config.family).ignores_weight or (lambda name: False)  # a vision tower, tied copies
    names = [
        n for n in where if not n.endswith("rotary_emb.inv_freq") and n not in tied_heads and not ignores(n)
    ]
    missing = sorted(set(expected) - set(names))
    unexpected = sorted(set(names) - set(expected))
    if unexpected:
        raise ModelLoadError(
            f"unexpected tensors in the checkpoint for a {config.family} model: {_few(unexpected)}"
        )
    if missing:
        raise ModelLoadError(f"tensors missing from the checkpoint: {_few(missing)}")

    for file, file_names in _by_file(names, where).items():
        try:
            with safe_open(str(file), framework="pt") as f:
                present = set(f.keys())
                for name in file_names:
                    if name not in present:
                        raise ModelLoadError(
                            f"tensor {name} is listed for {file.name} but that file does not hold it"
                        )
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
