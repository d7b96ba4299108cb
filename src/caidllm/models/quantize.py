"""Quantized weights through torchao (``caidllm.load(..., quantize="int8")``, ``--quantize``).

Each value of ``QUANTIZATIONS`` names the torchao config applied, per device type, to
every ``nn.Linear`` inside the decoder layers (attention, feed-forward, and the routed
experts, unstacked into one Linear each first: moe_experts.unstack_experts); the embeddings,
the norms and the output head stay in the model dtype (``quantize_head=True`` quantizes an
untied head too). The model is quantized layer by
layer as it loads (loading.py, random_init.py), so only one layer at a time is ever held
in full precision. Where a device has a faster kernel for a scheme than torchao's (a
``Packing``: int8-dynamic on a CPU, models/cpu_int8.py), torchao's tensors are repacked for
it as each layer is quantized.

``check_quantization`` runs before any weight is read: an unknown value, a missing
torchao, or a config the device or dtype cannot run is one clear ``InputError``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import InputError, ModelLoadError
from .device import resolve_device
from .moe_experts import StackedExperts, unstack_experts
from .moe_kernels import check_kernel
from .packing import ONEDNN_INT8, Packing, kernel_of

INT4_GROUP = 32  # weights per int4 scale (as GGUF's Q4_0): finer groups keep more accuracy


@dataclass(frozen=True)
class Quantization:
    """One ``--quantize`` value: what it stores and the torchao config per device type."""

    name: str
    summary: str
    configs: dict[str, Callable[[], object]]  # device type -> a fresh torchao config
    # bytes torchao stores for an [out, in] weight in model dtype d: data, scales, zero points
    linear_bytes: Callable[[int, int, torch.dtype], int]
    dtypes: tuple[torch.dtype, ...] = ()  # model dtypes its kernels run in (empty: any)
    needs: Callable[[torch.device], str | None] = field(default=lambda device: None)  # why not here, or None
    packings: dict[str, Packing] = field(default_factory=dict)  # device type -> a faster kernel for it
    heads: dict[str, str] = field(default_factory=dict)  # device type -> the scheme of a quantized head

    def config(self, device: torch.device):
        return self.configs[device.type]()

    def for_head(self, device_type: str) -> Quantization:
        """The scheme that quantizes the output head (--quantize-head) on this device type."""
        return QUANTIZATIONS[self.heads.get(device_type, self.name)]

    def packing(self, device_type: str) -> Packing | None:
        """The kernel that replaces torchao's on this device type, where this torch can run it."""
        found = self.packings.get(device_type)
        return found if found is not None and found.available() else None

    def bytes_of(self, out: int, inp: int, dtype: torch.dtype, device_type: str) -> int:
        packing = self.packing(device_type)
        return (packing or self).linear_bytes(out, inp, dtype)


def _int8_weight_only():
    from torchao.quantization import Int8WeightOnlyConfig

    return Int8WeightOnlyConfig()


def _int8_dynamic():
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    return Int8DynamicActivationInt8WeightConfig()


def _int4_cuda():
    from torchao.quantization import Int4WeightOnlyConfig

    return Int4WeightOnlyConfig(group_size=INT4_GROUP, int4_packing_format="tile_packed_to_4d")


def _int4_cpu():
    # torchao 0.18's CPU layout for packed int4 (aten's _weight_int4pack_mm_for_cpu) is in its prototype
    # package.
    from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

    return PrototypeInt4WeightOnlyConfig(group_size=INT4_GROUP)


def _fp8_rowwise():
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow

    return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())


def _fp8_hardware(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None  # the device-type check names the problem
    if torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        return (
            "it needs float8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, Blackwell); "
            f"{name} has "
            f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}"
        )
    return None


def _int8_bytes(out: int, inp: int, dtype) -> int:
    return out * inp + out * (4 + 1)  # int8 data, a float32 scale and an int8 zero point per row


def _int4_bytes(out: int, inp: int, dtype) -> int:
    return out * inp // 2 + out * (inp // INT4_GROUP) * 2 * dtype.itemsize  # a scale and a zero per group


def _fp8_bytes(out: int, inp: int, dtype) -> int:
    return out * inp + out * 4  # float8 data, a float32 scale per row


QUANTIZATIONS = {
    q.name: q
    for q in (
        Quantization(
            "int8",
            "int8 weights (one scale per output channel), activations in the model dtype",
            {"cpu": _int8_weight_only, "cuda": _int8_weight_only},
            _int8_bytes,
        ),
        Quantization(
            "int8-dynamic",
            "int8 weights (per output channel) and int8 activations (per token, quantized on the fly)",
            {"cpu": _int8_dynamic, "cuda": _int8_dynamic},
            _int8_bytes,
            packings={"cpu": ONEDNN_INT8},
        ),
        # On a CPU torch's int4 kernel runs the 126k-row head 7x slower than bfloat16 (BENCHMARKS.md): a
        # quantized head is int8-dynamic there, as llama.cpp's Q4_0 keeps its output head at Q6_K.
        Quantization(
            "int4",
            f"int4 weights in groups of {INT4_GROUP} (packed two per byte), activations in bfloat16",
            {"cpu": _int4_cpu, "cuda": _int4_cuda},
            _int4_bytes,
            dtypes=(torch.bfloat16,),
            heads={"cpu": "int8-dynamic"},
        ),
        Quantization(
            "fp8",
            "float8 e4m3 weights and activations, one scale per row (CUDA compute capability 8.9+)",
            {"cuda": _fp8_rowwise},
            _fp8_bytes,
            dtypes=(torch.bfloat16,),
            needs=_fp8_hardware,
        ),
    )
}


def quantization_names() -> list[str]:
    return list(QUANTIZATIONS)


@contextlib.contextmanager
def _quiet_import():
    # torchao logs a warning for each optional GPU extension it cannot load (and torch one more):
    # noise on every CPU run, not a problem.
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def torchao_version() -> str | None:
    """The installed torchao's version, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:
        return None


def check_quantization(name, device: torch.device, dtype: torch.dtype) -> Quantization | None:
    """The Quantization named `name` (None: none), after checking that it can run on `device` in
    `dtype`; InputError naming the value and the device otherwise. Reads no weight."""
    if name is None:
        return None
    if not isinstance(name, str) or name not in QUANTIZATIONS:
        raise InputError(f"unknown quantization {name!r}; expected one of {', '.join(QUANTIZATIONS)}")
    q = QUANTIZATIONS[name]
    if device.type not in q.configs:
        raise InputError(
            f"quantization {name!r} cannot run on {device}: caidllm runs it on "
            f"{' and '.join(q.configs)} devices only ({q.summary})"
        )
    reason = q.needs(device)
    if reason:
        raise InputError(f"quantization {name!r} cannot run on {device}: {reason}")
    _check_dtype(q, dtype)
    if torchao_version() is None:
        raise InputError(f"quantization {name!r} needs torchao: pip install 'caidllm[quant]'")
    try:
        with _quiet_import():
            import torchao  # noqa: F401 - the first import logs; do it here, quietly
        q.config(device)  # a torchao without this config fails here, before the model loads
    except (ImportError, AttributeError, TypeError) as e:
        raise InputError(
            f"quantization {name!r}: torchao {torchao_version()} cannot make its config on "
            f"{device.type} ({type(e).__name__}: {e}); pip install 'caidllm[quant]' "
            "(torchao>=0.18)"
        ) from None
    return q


def _check_dtype(q: Quantization, dtype: torch.dtype) -> None:
    if q.dtypes and dtype not in q.dtypes:
        wanted = " or ".join(str(d).removeprefix("torch.") for d in q.dtypes)
        raise InputError(
            f"quantization {q.name!r} runs its kernels in {wanted}; the model would load as "
            f"{str(dtype).removeprefix('torch.')}: add --dtype {wanted} (dtype= in the API)"
        )


def check_not_quantized(raw_config: dict, source) -> None:
    """A checkpoint saved quantized (config.json "quantization_config", as GPTQ, AWQ, bitsandbytes or
    torchao write it) cannot be loaded or quantized again: its tensors are not the model's."""
    found = raw_config.get("quantization_config")
    if found:
        method = found.get("quant_method", "unknown method") if isinstance(found, dict) else found
        raise ModelLoadError(
            f"{source} is an already quantized checkpoint (quantization_config: {method}); "
            "load the full-precision checkpoint, with --quantize for quantized weights"
        )


# ---- applying it -----------------------------------------------------------


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(name, module list) of the model's transformer layers: the first ModuleList holding
    one module per layer (LLaDA's transformer.blocks, Dream's model.layers)."""
    n = model.cfg.n_layers
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return name, module
    raise TypeError(f"{type(model).__name__} has no ModuleList of its {n} layers")


def output_head(model: nn.Module) -> nn.Linear | None:
    """The untied output head: the Linear outside the layers that maps to the vocabulary."""
    prefix, _ = decoder_layers(model)
    for name, module in model.named_modules():
        if (
            isinstance(module, nn.Linear)
            and not name.startswith(prefix + ".")
            and module.out_features == model.cfg.vocab_size
        ):
            return module
    return None


def _is_linear(module: nn.Module, fqn: str) -> bool:
    return isinstance(module, nn.Linear)


def quantize_module(module: nn.Module, q: Quantization, device: torch.device, pack: bool = True) -> None:
    """Quantize every nn.Linear inside `module` in place (one decoder layer, or the head); `pack`:
    repacked for the device's faster kernel where there is one (not under --compile)."""
    from torchao.quantization import quantize_

    from .cpu_int8 import copies_and_saves

    with _quiet_import():
        quantize_(module, q.config(device), filter_fn=_is_linear, device=device)
    copies_and_saves(module)
    packing = q.packing(device.type) if pack else None
    if packing is not None:
        packing.apply(module)


@dataclass
class QuantizePlan:
    """What load() does to each part of the model as it materialises (None = full precision)."""

    quantization: Quantization
    device: torch.device
    head: bool = False  # also quantize the untied output head
    pack: bool = True  # the device's faster kernel where there is one (False: torchao's, for --compile)

    def layer(self, layer: nn.Module) -> None:
        unstack_experts(layer)  # torchao quantizes Linear layers: stacked experts become one each
        quantize_module(layer, self.quantization, self.device, self.pack)

    def check(self, model: nn.Module) -> None:
        """Before any weight is read (`model` on the meta device): a head to quantize exists."""
        if self.head and output_head(model) is None:
            raise InputError(
                "quantize_head: this model's output head is tied to its input embedding; "
                "embeddings stay in the model dtype"
            )

    def finish(self, model: nn.Module) -> None:
        """After every layer: the head, if asked."""
        if self.head:
            head = self.quantization.for_head(self.device.type)
            quantize_module(output_head(model), head, self.device, self.pack)


def make_plan(
    quantize, device: torch.device, dtype: torch.dtype, head: bool = False, pack: bool = True
) -> QuantizePlan | None:
    q = check_quantization(quantize, device, dtype)
    if q is None:
        if head:
            raise InputError("quantize_head needs a quantization (quantize= / --quantize)")
        return None
    return QuantizePlan(q, device, head, pack)


def is_quantized(model: nn.Module) -> bool:
    """Whether any parameter of `model` is a torchao quantized tensor."""
    return any(is_quantized_tensor(p) for p in model.parameters())


def is_quantized_tensor(t: torch.Tensor) -> bool:
    return type(t) not in (torch.Tensor, nn.Parameter) or hasattr(t, "__tensor_flatten__")


def quantize_loaded(lm, quantize: str, head: bool = False) -> None:
    """Quantize an already loaded DiffusionLM in place, layer by layer (its full-precision
    weights are all in memory already; load(..., quantize=) keeps the peak lower)."""
    if lm.quantization is not None or is_quantized(lm.model):
        raise InputError(
            f"the model is already quantized ({lm.quantization or 'torchao tensors'}); "
            "load it again in full precision to quantize it another way"
        )
    if getattr(lm, "compiled", False):
        raise InputError("quantize a model before compiling it (load(..., quantize=..., compile=True))")
    plan = make_plan(quantize, torch.device(lm.device), lm.dtype, head)
    plan.check(lm.model)
    for module in lm.model.modules():  # a stacked-only kernel could not run the unstacked experts
        if isinstance(getattr(module, "experts", None), StackedExperts):
            check_kernel(module.kernel, quantized=True)
    for layer in decoder_layers(lm.model)[1]:
        plan.layer(layer)
    plan.finish(lm.model)
    lm.quantization, lm.quantized_head = plan.quantization.name, head


# ---- memory ------------------------------------------------------------------


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds; a torchao tensor is the sum of its inner tensors (data, scales, zeros)."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(inner) for inner in (getattr(t, n) for n in names) if inner is not None)
    return t.numel() * t.element_size()


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each shared tensor counted once."""
    seen, total = set(), 0
    for t in (*model.parameters(), *model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += tensor_bytes(t)
    return total


def expected_weights_bytes(
    model: nn.Module,
    dtype: torch.dtype,
    quantize: str | None = None,
    head: bool = False,
    device_type: str | None = None,
) -> int:
    """The bytes weights_bytes() will count once `model` (a meta-device module is fine: nothing is
    read) is loaded in `dtype` with `quantize` on `device_type` (None: load's default device): for
    `caidllm models` and sizing a GPU before a load."""
    if quantize is None and head:
        raise InputError("quantize_head needs a quantization (quantize= / --quantize)")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise InputError(f"unknown quantization {quantize!r}; expected one of {', '.join(QUANTIZATIONS)}")
    if quantize is not None:
        _check_dtype(QUANTIZATIONS[quantize], dtype)
    device_type = device_type or resolve_device(None).type
    quantized, head_module = set(), output_head(model) if head else None
    if quantize is not None:
        for layer in decoder_layers(model)[1]:
            quantized |= {id(m) for m in layer.modules() if isinstance(m, nn.Linear)}
        if head_module is not None:
            quantized.add(id(head_module))
    total, seen = 0, set()
    for module in model.modules():
        for name, t in (*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)):
            if id(t) in seen:
                continue
            seen.add(id(t))
            if id(module) in quantized and name == "weight":
                q = QUANTIZATIONS[quantize]
                q = q.for_head(device_type) if module is head_module else q
                total += q.bytes_of(module.out_features, module.in_features, dtype, device_type)
            elif quantize is not None and isinstance(module, StackedExperts):  # quantized expert by expert
                experts, out, inp = t.shape
                total += experts * QUANTIZATIONS[quantize].bytes_of(out, inp, dtype, device_type)
            else:
                total += t.numel() * dtype.itemsize
    return total


def weights_mb(lm) -> float:
    return weights_bytes(lm.model) / 2**20


def _kernels(lm, q: Quantization, device_type: str) -> str:
    """What runs the quantized matmuls; the head's own kernel where its scheme differs (int4's on a CPU)."""
    layers = kernel_of(lm.model, q.packings.get(device_type))
    head_q = q.for_head(device_type)
    if not getattr(lm, "quantized_head", False) or head_q is q:
        return layers
    head = kernel_of(output_head(lm.model), head_q.packings.get(device_type))
    return layers if head == layers else f"{layers}; head: {head}"


def quantization_info(lm) -> dict:
    """What a report, /v1/models or `caidllm models` states about the model's weights."""
    q = QUANTIZATIONS.get(lm.quantization) if lm.quantization else None
    return {
        "quantization": lm.quantization,
        "quantization_kernel": _kernels(lm, q, torch.device(lm.device).type) if q else None,
        "quantization_summary": q.summary
        if q
        else f"none: every weight in {str(lm.dtype).removeprefix('torch.')}",
        "quantized_head": bool(getattr(lm, "quantized_head", False)),
        "head_quantization": q.for_head(torch.device(lm.device).type).name
        if q and getattr(lm, "quantized_head", False)
        else None,
        "torchao": torchao_version() if q else None,
        "weights_mb": round(weights_mb(lm), 3),
    }
