"""How the routed experts run: ``sum_j weights[t, j] * expert_{chosen[t, j]}(x[t])`` for every
token t, by one of several kernels (``MOE_KERNELS``), chosen per model (``load(...,
moe_kernel=)``, ``--moe-kernel``); ``auto`` picks by device and dtype (``pick_kernel``).

- ``loop``: the reference. The (token, choice) pairs sorted by expert, one host sync to read
  how many each expert got, then each expert in turn on its contiguous slice (three matmuls
  per chosen expert). Runs any expert form, quantized ones included; experts with a ``run_rows``
  of their own (oneDNN int8 ones, cpu_int8.OnednnInt8Experts) get all the sorted rows at once.
- ``grouped``: the same sort on the device, offsets from the counts' cumulative sum, and each
  projection one ``torch._grouped_mm`` over the stacked weights; the outputs put back in
  (token, choice) order and weighted and summed as the loop does (``combine``). No host sync
  where torch's grouped_mm has a kernel of its own (CPU; CUDA bf16 on compute capability 9.x /
  10.x); elsewhere torch's fallback reads the offsets on the host.
- ``sized``: the loop's sort and host counts (free on a CPU), each expert's projections on its
  own rows by the CPU matmul measured fastest for that many rows (``_sized_linear``): in fp32
  oneDNN's matmul on the plain stacked weights from three rows (MKL's sgemm, torch.mm's fp32
  path, runs a few rows at about two thirds of its speed here), in bf16 a matrix-vector product
  for one row and weight @ rows.T for more; F.linear elsewhere. It reads the counts on the host.
- ``padded``: every expert on a [experts, tokens, hidden] buffer (a token meets an expert at
  most once, so tokens is a capacity no expert exceeds) with three ``bmm``: no host sync on
  any device, every expert's weights read, experts x tokens rows computed. Worth it only on
  a GPU at small token counts; never picked by ``auto`` on a CPU.
- ``native``: the loop's sort and host counts, then one call into a small compiled CPU kernel
  (``moe_native.cpp``, built on first use: ``moe_native.py``) that streams each chosen expert's
  weights once over all its rows (fp32 on AVX-512; bf16 on AMX, else AVX-512 BF16), the experts
  divided among torch's threads. CPU only, no gradient; unavailable without a C++ compiler or those
  instructions (``native_unavailable``). The first forward that needs it builds it (seconds, once per
  machine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.torch_version import TorchVersion

from ..errors import InputError
from . import moe_native
from .moe_experts import StackedExperts

AUTO = "auto"


@dataclass(frozen=True)
class SortedPairs:
    """The (token, choice) pairs ordered by expert: where each came from in the flattened
    [tokens x k] choices, its token and expert, and the counts per expert and the offsets (end
    of each expert's run, int32); all on the device."""

    order: torch.Tensor  # [P] long: the flat (token, choice) index of each sorted pair
    token: torch.Tensor  # [P] long
    expert: torch.Tensor  # [P] long
    counts: torch.Tensor  # [E] long
    ends: torch.Tensor  # [E] int32


def sort_pairs(chosen: torch.Tensor, num_experts: int) -> SortedPairs:
    flat = chosen.reshape(-1)
    order = flat.argsort(stable=True)
    # Counted by a scatter-add, not bincount: CUDA's bincount reads the largest id on the host.
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).index_add_(
        0, flat, torch.ones_like(flat)
    )
    return SortedPairs(
        order=order,
        token=order // chosen.shape[1],
        expert=flat[order],
        counts=counts,
        ends=counts.cumsum(0).to(torch.int32),
    )


def combine(
    x: torch.Tensor, pairs: SortedPairs, outputs: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """sum_j weights[t, j] * output of (t, j), in fp32 and choice order, cast to x's dtype.

    The outputs go back to their (token, choice) slots and each token sums its own k: a fixed
    order on every device (an index_add_ over tokens adds with atomics on CUDA, in an order
    that changes from run to run), and the loop's exact arithmetic."""
    tokens, k = weights.shape
    per_pair = torch.empty_like(outputs)
    per_pair[pairs.order] = outputs
    mixed = (per_pair.view(tokens, k, -1).float() * weights.float()[..., None]).sum(dim=1)
    return mixed.to(x.dtype)


def _each_expert(experts, x, chosen, weights, expert_on_rows: Callable) -> torch.Tensor:
    """Sort the pairs, read the counts on the host (one sync), run expert_on_rows(e, rows) on each
    chosen expert's contiguous slice in turn, and combine."""

    def run_rows(routed_inputs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        routed_outputs = torch.empty_like(routed_inputs)
        start = 0
        for e, count in enumerate(counts):
            if count:
                routed_outputs[start : start + count] = expert_on_rows(
                    e, routed_inputs[start : start + count]
                )
                start += count
        return routed_outputs

    return _sorted_rows(experts, x, chosen, weights, run_rows)


def _sorted_rows(experts, x, chosen, weights, run_rows: Callable) -> torch.Tensor:
    """Sort the pairs, read the counts on the host (one sync), run_rows(routed inputs sorted by
    expert, counts) and combine."""
    pairs = sort_pairs(chosen, experts.num_experts)
    return combine(x, pairs, run_rows(x[pairs.token], pairs.counts.tolist()), weights)


def loop_kernel(experts, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The reference: each expert on its tokens in turn; one host sync (the counts). Experts that
    run their sorted rows themselves (``run_rows``: oneDNN int8 ones, models/cpu_int8.py) do so."""
    run_rows = getattr(experts, "run_rows", None)
    if run_rows is not None:
        return _sorted_rows(experts, x, chosen, weights, run_rows)
    return _each_expert(experts, x, chosen, weights, experts.expert)


def grouped_kernel(experts: StackedExperts, x, chosen, weights) -> torch.Tensor:
    pairs = sort_pairs(chosen, experts.num_experts)
    routed = x[pairs.token]

    def project(inputs, stacked):
        return torch._grouped_mm(inputs, stacked.transpose(1, 2), offs=pairs.ends)

    hidden = experts.activation(project(routed, experts.gate_proj)) * project(routed, experts.up_proj)
    return combine(x, pairs, project(hidden, experts.down_proj), weights)


def padded_kernel(experts: StackedExperts, x, chosen, weights) -> torch.Tensor:
    pairs = sort_pairs(chosen, experts.num_experts)
    tokens = x.shape[0]
    # Each pair's row inside its expert's run: its rank among the pairs sorted before it.
    starts = (pairs.ends - pairs.counts.to(torch.int32)).long()
    slot = torch.arange(pairs.token.shape[0], device=x.device) - starts[pairs.expert]
    buffer = x.new_zeros(experts.num_experts, tokens, x.shape[-1])
    buffer[pairs.expert, slot] = x[pairs.token]
    hidden = experts.activation(torch.bmm(buffer, experts.gate_proj.transpose(1, 2))) * torch.bmm(
        buffer, experts.up_proj.transpose(1, 2)
    )
    out = torch.bmm(hidden, experts.down_proj.transpose(1, 2))
    return combine(x, pairs, out[pairs.expert, slot], weights)


# oneDNN's fp32 matmul on a plain (not reordered) weight: absent from builds without mkldnn.
_ONEDNN_LINEAR = (
    getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
)
ONEDNN_MIN_ROWS = 3  # fewer fp32 rows run faster on torch's own path (BENCHMARKS.md, MoE section)


def _sized_linear(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """rows @ weight.T by the CPU path measured fastest for this many rows and this dtype
    (single thread): fp32 three rows or more through oneDNN; bf16 one row as a matrix-vector
    product, more as weight @ rows.T (the output transposed); anything else F.linear. oneDNN's
    linear has no autograd formula (its backward silently gives no gradient): not while training."""
    if rows.device.type == "cpu":
        if (
            rows.dtype == torch.float32
            and rows.shape[0] >= ONEDNN_MIN_ROWS
            and _ONEDNN_LINEAR is not None
            and not (torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad))
        ):
            return _ONEDNN_LINEAR(rows, weight, None, "none", [], "")
        if rows.dtype == torch.bfloat16:
            if rows.shape[0] == 1:
                return torch.mv(weight, rows[0])[None]
            return torch.mm(weight, rows.t()).t()
    return F.linear(rows, weight)


def _sized_expert(
    rows: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    activation: Callable = F.silu,
) -> torch.Tensor:
    return _sized_linear(activation(_sized_linear(rows, gate)) * _sized_linear(rows, up), down)


def sized_kernel(experts: StackedExperts, x, chosen, weights) -> torch.Tensor:
    """The loop's order and host counts (free on a CPU); each projection through _sized_linear."""

    def expert_on_rows(e: int, rows: torch.Tensor) -> torch.Tensor:
        return _sized_expert(
            rows, experts.gate_proj[e], experts.up_proj[e], experts.down_proj[e], experts.activation
        )

    return _each_expert(experts, x, chosen, weights, expert_on_rows)


def native_unavailable(experts, x: torch.Tensor | None = None) -> str | None:
    """None where the native kernel runs these experts (on x, when given); else why not, in words."""
    if not isinstance(experts, StackedExperts):
        return "it runs stacked full-precision experts, not quantized ones"
    if experts.activation is not F.silu:
        return "it computes SwiGLU experts (silu gates) only"
    stacks = [experts.gate_proj, experts.up_proj, experts.down_proj]
    if stacks[0].device.type != "cpu":
        return f"it runs on a CPU, not {stacks[0].device.type}"
    if not all(s.is_contiguous() and s.dtype == stacks[0].dtype for s in stacks):
        return "it reads contiguous expert stacks of one dtype"
    if x is not None and x.dtype != stacks[0].dtype:
        return f"its inputs ({x.dtype}) must have the experts' dtype ({stacks[0].dtype})"
    if x is not None and torch.is_grad_enabled() and (x.requires_grad or stacks[0].requires_grad):
        return "it computes no gradient (run it under torch.no_grad() or torch.inference_mode())"
    return moe_native.why_unavailable(stacks[0].dtype)


def native_bf16_on_amx(experts: StackedExperts) -> bool:
    """Whether the native kernel runs these bf16 experts on AMX (widths multiples of 32 on a CPU with
    it), where it is the fastest kernel at every row count; else it runs AVX-512 BF16's dot products,
    which compute slower than sized's matmul once an expert has more than about 6 rows (BENCHMARKS.md)."""
    return moe_native.bf16_on_amx() and all(w % 32 == 0 for w in experts.gate_proj.shape[1:])


def native_kernel(experts: StackedExperts, x, chosen, weights) -> torch.Tensor:
    """The loop's order and host counts; every expert in one call of the compiled kernel. Each
    expert on one code path whatever its row count: a row's sums never depend on how many other
    rows chose its expert (batch invariance; a hand-off of busy experts to sized broke it in bf16)."""
    reason = native_unavailable(experts, x)
    if reason:
        raise InputError(f"moe_kernel 'native' cannot run here: {reason}")
    pairs = sort_pairs(chosen, experts.num_experts)
    routed = x[pairs.token].contiguous()
    stacks = experts.gate_proj.detach(), experts.up_proj.detach(), experts.down_proj.detach()
    outputs = moe_native.run_routed(routed, pairs.counts, *stacks, threads=torch.get_num_threads())
    return combine(x, pairs, outputs, weights)


MOE_KERNELS: dict[str, Callable] = {
    "loop": loop_kernel,
    "grouped": grouped_kernel,
    "sized": sized_kernel,
    "padded": padded_kernel,
    "native": native_kernel,
}
# kernels that need StackedExperts (full-precision weights)
STACKED_ONLY = (
    "grouped",
    "sized",
    "padded",
    "native",
)
READS_COUNTS = ("loop", "sized", "native")  # kernels that read the counts on the host (a sync on a GPU)
# auto's switch from grouped to sized on a CPU in fp32: (token, expert) pairs per expert on average
# (bf16 runs sized at any count: 0.91x-0.99x grouped's time at 4-128 tokens, BENCHMARKS.md).
SIZED_ROWS_PER_EXPERT = 8
# auto picks native where torch runs this many threads or fewer: one (the targets' case) and two, the
# counts measured (BENCHMARKS.md); at two, in fp32 only from one row per expert on average (below it
# grouped was 0.89x native's time).
NATIVE_MAX_THREADS = 2


def kernel_names() -> list[str]:
    return [AUTO, *MOE_KERNELS]


def check_kernel(name, quantized: bool = False, experts=()) -> str:
    """`name` if it is a kernel this model (its layers' `experts`, where known) can run; InputError
    naming the problem otherwise."""
    if name not in kernel_names():
        raise InputError(f"unknown moe_kernel {name!r}; expected one of {', '.join(kernel_names())}")
    if quantized and name in STACKED_ONLY:
        raise InputError(
            f"moe_kernel {name!r} runs stacked full-precision experts; quantized experts run "
            "one at a time: use moe_kernel 'loop' or 'auto' with --quantize"
        )
    may_run_native = name == "native" or (name == AUTO and torch.get_num_threads() <= NATIVE_MAX_THREADS)
    # Asked now, so that a model's first forward does not wait for the build (seconds, once per machine).
    reason = next(filter(None, map(native_unavailable, experts)), None) if may_run_native else None
    if reason and name == "native":
        raise InputError(f"moe_kernel 'native' cannot run here: {reason}")
    return name


def pick_kernel(experts, x: torch.Tensor, choices: int = 1) -> str:
    """``auto``'s choice for tokens x each choosing `choices` experts. On a CPU with torch on one or
    two threads (NATIVE_MAX_THREADS): native where it runs (outside autograd; the fastest there at
    every size measured but fp32 at two threads below one row per expert), in bf16 only on AMX
    (native_bf16_on_amx: its dot products lose to sized's matmul at many rows).
    Else on a CPU: sized in bf16 (at any row count), and in fp32 once the experts get SIZED_ROWS_PER_EXPERT
    rows each on average (512 tokens on LLaDA2.0-mini's 256 experts, 128 on LLaDA-MoE's 64). Else grouped
    where torch's grouped_mm runs without a host sync (CPU, any dtype; CUDA bf16 on compute
    capability 9.x / 10.x) and the widths meet its stride rule; else padded on a GPU up to 64 tokens
    (sync-free, and every expert's weights are read anyway there); else the loop. Quantized experts always
    loop. BENCHMARKS.md has the CPU measurements behind it."""
    if not isinstance(experts, StackedExperts):
        return "loop"
    threads = torch.get_num_threads()
    few_threads = x.device.type == "cpu" and threads <= NATIVE_MAX_THREADS
    if (
        few_threads
        and native_unavailable(experts, x) is None
        and (
            native_bf16_on_amx(experts)
            if x.dtype == torch.bfloat16
            else threads == 1 or x.shape[0] * choices >= experts.num_experts
        )
    ):
        return "native"
    if x.device.type == "cpu" and (
        x.dtype == torch.bfloat16
        or (
            x.dtype == torch.float32
            and _ONEDNN_LINEAR is not None
            and x.shape[0] * choices >= SIZED_ROWS_PER_EXPERT * experts.num_experts
        )
    ):
        return "sized"
    if grouped_mm_runs(experts, x):
        return "grouped"
    return "padded" if x.device.type != "cpu" and x.shape[0] <= 64 else "loop"


# torch's grouped_mm: absent before 2.8, without a CPU kernel in 2.8.
_GROUPED_MM = hasattr(torch, "_grouped_mm")
_GROUPED_MM_CPU = _GROUPED_MM and TorchVersion(torch.__version__) >= "2.9"


def grouped_mm_runs(experts: StackedExperts, x: torch.Tensor) -> bool:
    """Whether torch's grouped_mm has a kernel of its own for `x` here, and the experts' widths
    are whole multiples of 16 bytes (its rule for strides, on CPU and CUDA alike: a random
    shape's moe_intermediate_size=20 in bf16 fails it)."""
    if x.device.type == "cpu":
        native = _GROUPED_MM_CPU
    else:
        native = (
            _GROUPED_MM
            and x.device.type == "cuda"
            and x.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device)[0] in (9, 10)
        )
    return native and all(width * x.element_size() % 16 == 0 for width in experts.gate_proj.shape[1:])


def run_experts(
    experts, kernel: str, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    name = pick_kernel(experts, x, chosen.shape[-1]) if kernel == AUTO else kernel
    return MOE_KERNELS[name](experts, x, chosen, weights)
