"""int8-dynamic on a CPU through oneDNN (AMX / VNNI int8 matmuls), packed once at load.

torchao's ``Int8DynamicActivationInt8WeightConfig`` quantizes the weights (int8, one scale per
output channel) and, per forward, the activations (int8, one scale per token); on a CPU its
matmul is ``torch._int_mm``, which on the 126k-vocabulary head runs at about the speed of
float32 (BENCHMARKS.md, "Quantized CPU forwards against llama.cpp"). This module keeps
torchao's quantized values and swaps the matmul: the int8 weight is reordered once into
oneDNN's blocked layout (``onednn.qlinear_prepack``) and each forward is one
``onednn.qlinear_pointwise`` with int32 accumulation. The accumulation is exact, so a row's
result never depends on the other rows of its batch (batch invariance holds), and the
numbers are torchao's but for the order of the two float scale products.

``pack_int8_dynamic(module)`` converts every torchao int8-dynamic weight inside `module`;
quantize.py calls it on CPUs whose torch has oneDNN (``available()``), except under --compile:
Inductor cannot lower oneDNN's opaque packed weight, so a compiled model keeps torchao's kernel.
The routed experts of an MoE layer, once packed, become ``OnednnInt8Experts``: the loop kernel's
per-expert matmuls, with the per-token work of its three linears done once over all rows.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torchao.utils import TorchAOBaseTensor

from .moe_experts import PROJECTIONS, ExpertList

aten = torch.ops.aten
_EPS = torch.finfo(torch.float32).eps


def available() -> bool:
    """Whether this torch can run the oneDNN int8 linear (built with oneDNN, the op registered)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


class OnednnInt8Weight(TorchAOBaseTensor):
    """An [out, in] int8 weight in oneDNN's packed layout and its float32 scale per output
    channel; F.linear on it quantizes the activation per token and runs oneDNN's int8 matmul."""

    tensor_data_names = ["packed", "scale"]
    tensor_attribute_names = ["shape", "act_dtype"]

    def __new__(cls, packed, scale, shape, act_dtype):
        return torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=act_dtype, device=scale.device, requires_grad=False
        )

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, shape, act_dtype: torch.dtype):
        super().__init__()
        self.packed, self.scale, self.act_dtype = packed, scale, act_dtype

    @classmethod
    def from_int8(cls, qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> OnednnInt8Weight:
        """From an [out, in] int8 weight and its scale per output channel (torchao's Int8Tensor data)."""
        packed = torch.ops.onednn.qlinear_prepack(qdata.contiguous(), None)
        return cls(packed, scale.reshape(-1).float().contiguous(), qdata.shape, dtype)

    def dequantize(self, output_dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight in floating point: the kernel applied to the identity (exact: int32 sums of one
        term)."""
        return _identity_product(self.packed, self.scale, self.shape, output_dtype or self.dtype)

    def int8_data(self) -> torch.Tensor:
        """The [out, in] int8 weight back from oneDNN's layout: oneDNN's reorder to a plain [in, out]
        layout, checked on its first columns against what the kernel computes (its product with the
        identity, unit scales: exact); that product in full, slower, should they ever differ. The
        reorder is returned as its transposed view, not copied again (torch.save keeps the strides;
        a 126k-row head is half a GB)."""
        ones = torch.ones_like(self.scale)
        plain = self.packed.to_dense().t()
        first = min(self.shape[1], _CHECKED_COLUMNS)
        if torch.equal(
            _identity_product(self.packed, ones, (self.shape[0], first), torch.int8), plain[:, :first]
        ):
            return plain
        return _identity_product(self.packed, ones, self.shape, torch.int8)

    # oneDNN's packed tensor is opaque, without storage: torch.save and deepcopy could not copy it.
    # They copy the int8 weight and its scales instead and repack as they rebuild; the model itself
    # holds the packed form only (no second copy of the weight), the packing being a cache of it.
    def __reduce_ex__(self, protocol):
        extra = {k: v for k, v in self.__dict__.items() if k not in ("packed", "scale", "act_dtype")}
        return repacked, (self.int8_data(), self.scale, self.act_dtype, extra)

    def __deepcopy__(self, memo):
        if (
            id(self) not in memo
        ):  # the int8 values are new already: made contiguous for packing, not copied again
            qdata, scale, act_dtype, extra = self.__reduce_ex__(2)[1]
            # the reorder's storage goes before the packing (a 126k-row head: 0.5 GB)
            qdata = qdata.contiguous()
            memo[id(self)] = repacked(qdata, scale.clone(), act_dtype, copy.deepcopy(extra, memo))
        return memo[id(self)]


def repacked(
    qdata: torch.Tensor, scale: torch.Tensor, act_dtype: torch.dtype, extra: dict
) -> OnednnInt8Weight:
    """An OnednnInt8Weight rebuilt from what __reduce_ex__ saved (``extra``: its other attributes,
    such as nn.Parameter's mark), checked first (_check_saved)."""
    _check_saved(qdata, scale, act_dtype, extra)
    weight = OnednnInt8Weight.from_int8(qdata, scale, act_dtype)
    weight.__dict__.update(extra)
    return weight


def _check_saved(qdata, scale, act_dtype, extra) -> None:
    """torch.load(weights_only=True) may read anyone's file and calls repacked with what it holds:
    only a plain [out, in] int8 weight, one float scale per row (oneDNN reads out's worth of scales
    without a bounds check), a floating dtype and plain marks rebuild a packed weight."""
    if type(qdata) is not torch.Tensor or qdata.dtype != torch.int8 or qdata.dim() != 2:
        problem = (
            f"its weight is a {_form(qdata) if isinstance(qdata, torch.Tensor) else type(qdata).__name__}"
            ", not a 2-D int8 tensor"
        )
    elif type(scale) is not torch.Tensor or not scale.is_floating_point() or scale.numel() != qdata.shape[0]:
        got = _form(scale) if isinstance(scale, torch.Tensor) else type(scale).__name__
        problem = (
            f"its scales are a {got}, not {qdata.shape[0]} floats (one per row of its "
            f"{list(qdata.shape)} weight)"
        )
    elif not isinstance(act_dtype, torch.dtype) or not act_dtype.is_floating_point:
        problem = f"its activation dtype {act_dtype!r} is not a floating dtype"
    elif not isinstance(extra, dict) or any(
        not isinstance(k, str)
        or k in ("packed", "scale", "act_dtype")
        or k.startswith("__")
        or not isinstance(v, (bool, int, float, str))
        for k, v in extra.items()
    ):
        named = [str(k) for k in extra] if isinstance(extra, dict) else type(extra).__name__
        problem = f"its other attributes {named} are not plain marks (such as nn.Parameter's _is_param)"
    else:
        return
    raise ValueError(f"cannot rebuild a saved packed int8-dynamic weight: {problem}")


# a state_dict holding packed weights loads with torch.load's default weights_only=True (repacked checks
# what it is given: it builds tensors only)
torch.serialization.add_safe_globals([repacked])

_IDENTITY_BLOCK_BYTES = 64 << 20  # float32 output of one block of identity rows
_CHECKED_COLUMNS = 64  # of a weight unpacked by oneDNN's reorder, checked against the kernel


def _identity_product(packed: torch.Tensor, scale: torch.Tensor, shape, dtype: torch.dtype) -> torch.Tensor:
    """[out, columns] in `dtype`: the kernel applied to the identity's first `columns` rows (shape:
    (out, columns)), a block of rows at a time (a 126k-row head's whole product is 2 GB in float32)."""
    out_features, columns = shape
    in_features = packed.shape[0]  # oneDNN's packed weight is [in, out]
    rows = max(1, min(columns, _IDENTITY_BLOCK_BYTES // (4 * out_features)))
    result = torch.empty(out_features, columns, dtype=dtype, device=scale.device)
    for start in range(0, columns, rows):
        n = min(rows, columns - start)
        eye = torch.zeros(n, in_features, dtype=torch.int8, device=scale.device)
        eye[torch.arange(n), torch.arange(start, start + n)] = 1
        result[:, start : start + n] = _matmul(eye, packed, scale, torch.float32).t()
    return result


def _matmul(x_int8: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype):
    zero_points = torch.zeros(scale.shape[0], dtype=torch.long, device=scale.device)
    return torch.ops.onednn.qlinear_pointwise(
        x_int8, 1.0, 0, packed, scale, zero_points, None, 1.0, 0, out_dtype, "none", [], ""
    )


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale [rows, 1]) of a [rows, in] activation: symmetric, one scale per
    row, as torchao's int8-dynamic (scale = max |x| / 127.5 computed in x's dtype, as torchao does,
    then float32; values quantized in float32, rounded and clamped to int8)."""
    scale = (x.abs().amax(dim=1, keepdim=True) / 127.5).float().clamp_min_(_EPS)
    x = x.float()
    return torch.round(x * (1.0 / scale)).clamp_(-128, 127).to(torch.int8), scale


def int8_linear(x: torch.Tensor, weight: OnednnInt8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    out_features = weight.shape[0]
    if rows.shape[0] == 0:
        y = rows.new_zeros(0, out_features)
    else:
        values, scale = quantize_per_token(rows)
        y = _matmul(values, weight.packed, weight.scale, x.dtype).mul_(scale.to(x.dtype))
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out_features)


@OnednnInt8Weight.implements(aten.linear.default)
@OnednnInt8Weight.implements_torch_function(torch.nn.functional.linear)
def _(func, types, args, kwargs):
    return int8_linear(args[0], args[1], args[2] if len(args) > 2 else (kwargs or {}).get("bias"))


class OnednnInt8Experts(ExpertList):
    """Routed experts whose projections are all OnednnInt8Weight, run by the loop kernel
    (models/moe_kernels.py) through ``run_rows``: each expert's three oneDNN matmuls on its own
    rows in turn, as the per-expert loop, while what int8_linear does per call for every row (the
    per-token quantization, shared by gate and up, and the scaling) and the SwiGLU's silu and
    product run once over all the layer's rows. Row by row the same operations as the per-expert
    loop (each row's int32 sums exact, its quantization its own), so the same numbers; the
    per-call overhead of 64 experts x 3 small linears was half their time (BENCHMARKS.md).
    (One caveat, shared with every CPU silu: torch computes a tensor's last numel mod 2 x its
    vector width elements by a scalar path, up to 1 ulp apart in float32. Expert widths that are
    multiples of 64 (the released MoEs': 512, 768, 1024) never leave such a tail; others can, and
    there the int8 rounding of the down projection's input hides it unless a value lies within
    that ulp of a rounding boundary.)"""

    def run_rows(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The experts' outputs for `rows` [P, hidden] sorted by expert, counts[e] rows each."""
        runs = [(e, start, start + n) for e, (start, n) in enumerate(zip(_starts(counts), counts)) if n]
        if not runs:  # no row at all (an empty forward)
            return rows.new_zeros(rows.shape[0], self[0].down_proj.weight.shape[0])
        values, scale = quantize_per_token(rows)
        scale = scale.to(rows.dtype)
        gate = self._each(runs, values, "gate_proj", rows.dtype).mul_(scale)
        up = self._each(runs, values, "up_proj", rows.dtype).mul_(scale)
        values, scale = quantize_per_token(F.silu(gate) * up)
        return self._each(runs, values, "down_proj", rows.dtype).mul_(scale.to(rows.dtype))

    def _each(self, runs, values: torch.Tensor, projection: str, dtype: torch.dtype) -> torch.Tensor:
        """Each expert's int8 matmul on its own rows (unscaled by the rows' scales), in row order."""
        parts = []
        for e, start, end in runs:
            weight = getattr(self[e], projection).weight
            parts.append(_matmul(values[start:end], weight.packed, weight.scale, dtype))
        return torch.cat(parts)


def _starts(counts: list[int]) -> list[int]:
    starts, total = [], 0
    for n in counts:
        starts.append(total)
        total += n
    return starts


@OnednnInt8Weight.implements(aten.copy_.default)
def _(func, types, args, kwargs):
    """load_state_dict's copy into a packed weight: another packed weight, or torchao's int8-dynamic
    one (repacked), of the same shape; anything else is refused naming the form that loads."""
    dst, src = args[0], args[1]
    if isinstance(dst, OnednnInt8Weight) and _symmetric_int8_dynamic(src):
        src = OnednnInt8Weight.from_int8(src.qdata, src.scale, dst.dtype)
    if not (
        isinstance(dst, OnednnInt8Weight) and isinstance(src, OnednnInt8Weight) and dst.shape == src.shape
    ):
        raise ValueError(_refusal(src, dst))
    dst.packed.copy_(src.packed)
    dst.scale.copy_(src.scale)
    return dst


def _refusal(src: torch.Tensor, dst: torch.Tensor) -> str:
    return (
        f"cannot copy a {_form(src)} into a {_form(dst)}: an int8-dynamic packed weight loads only into a "
        "model quantized the same way (load(..., quantize='int8-dynamic'), packed on this CPU or torchao's "
        "under compile=True), and only such a weight, or torchao's int8-dynamic one, loads into a packed one"
    )


def _form(t: torch.Tensor) -> str:
    kind = (
        "packed int8-dynamic weight"
        if isinstance(t, OnednnInt8Weight)
        else f"{type(t).__name__} of {t.dtype}"
    )
    return f"{kind} {list(t.shape)}"


def copies_and_saves(module: nn.Module) -> None:
    """torchao-quantized nn.Linears inside `module` made to copy, save and load: torchao's extra_repr
    (a method over a partial) dropped, as it stops torch.save (nn.Linear's serves); and a hook that
    unpacks a packed weight's state into torchao's int8-dynamic form before a load (a state saved from a
    packed model into a compile=True one), or refuses it naming both forms: torchao's own copy_ runs
    first and knows no packed weight ('no attribute qdata'). A weight packed since is the packed copy_'s."""
    for linear in module.modules():
        linear.__dict__.pop("extra_repr", None)
        if isinstance(linear, nn.Linear) and isinstance(linear.weight, TorchAOBaseTensor):
            linear.register_load_state_dict_pre_hook(_unpack_a_packed_state)


def _unpack_a_packed_state(
    linear, state_dict, prefix, local_metadata, strict, missing, unexpected, error_msgs
):
    key, weight = prefix + "weight", linear.weight
    saved = state_dict.get(key)
    if (
        not isinstance(saved, OnednnInt8Weight)
        or isinstance(weight, OnednnInt8Weight)
        or saved.shape != weight.shape
    ):
        return  # nothing of this hook's (a shape that differs: load_state_dict names it)
    if not _symmetric_int8_dynamic(weight):
        error_msgs.append(f'While copying the parameter named "{key}": {_refusal(saved, weight)}')
        state_dict[key] = weight  # refused: the weight stays as it is
        return
    names, attributes = weight.__tensor_flatten__()
    data = {name: getattr(weight, name) for name in names}
    data["qdata"] = saved.int8_data().to(weight.qdata.device)
    data["scale"] = saved.scale.reshape(weight.scale.shape).to(weight.scale)
    state_dict[key] = type(weight).__tensor_unflatten__(data, attributes, weight.shape, weight.stride())


def pack_int8_dynamic(module: nn.Module) -> None:
    """Replace every torchao int8-dynamic weight (per-row int8, symmetric) inside `module` by its
    oneDNN-packed equivalent; other weights (and any torchao layout this kernel does not compute
    the same way) are left as they are. Routed experts all packed become OnednnInt8Experts."""
    for linear in module.modules():
        w = getattr(linear, "weight", None)
        if isinstance(linear, nn.Linear) and _symmetric_int8_dynamic(w):
            linear.weight = nn.Parameter(
                OnednnInt8Weight.from_int8(w.qdata, w.scale, w.dtype), requires_grad=False
            )
    for parent in list(module.modules()):
        experts = getattr(parent, "experts", None)
        if type(experts) is ExpertList and all(
            isinstance(getattr(mlp, name).weight, OnednnInt8Weight) for mlp in experts for name in PROJECTIONS
        ):
            parent.experts = OnednnInt8Experts(list(experts))


def _symmetric_int8_dynamic(w) -> bool:
    from torchao.quantization import Int8Tensor, MappingType

    if not isinstance(w, Int8Tensor) or w.act_quant_kwargs is None or w.act_pre_scale is not None:
        return False
    per_row = w.scale.numel() == w.shape[0]
    no_zero = w.zero_point is None or not bool(w.zero_point.any())
    return per_row and no_zero and w.act_quant_kwargs.mapping_type == MappingType.SYMMETRIC
