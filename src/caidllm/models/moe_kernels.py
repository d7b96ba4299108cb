"""How the routed experts run: ``sum_j weights[t, j] * expert_{chosen[t, j]}(x[t])`` for every
token t, by one of several kernels (``MOE_KERNELS``), chosen per model (``load(...,
moe_kernel=)``, ``--moe-kernel``); ``auto`` picks by device and dtype (``pick_kernel``).

- ``loop``: the reference. The (token, choice) pairs sorted by expert, one host sync to read
  how many each expert got, then each expert in turn on its contiguous slice (three matmuls
  per chosen expert). Runs any expert form, quantized ones included.
- ``grouped``: the same sort on the device, offsets from the counts' cumulative sum, and each
  projection one ``torch._grouped_mm`` over the stacked weights; the weighted outputs added
  back per token with ``index_add_``. No host sync where torch's grouped_mm has a kernel of
  its own (CPU; CUDA bf16 on compute capability 9.x / 10.x); elsewhere torch's fallback reads
  the offsets on the host.
- ``padded``: every expert on a [experts, tokens, hidden] buffer (a token meets an expert at
  most once, so tokens is a capacity no expert exceeds) with three ``bmm``: no host sync on
  any device, every expert's weights read, experts x tokens rows computed. Worth it only on
  a GPU at small token counts; never picked by ``auto`` on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import InputError
from .moe_experts import StackedExperts

AUTO = "auto"


@dataclass(frozen=True)
class SortedPairs:
    """The (token, choice) pairs ordered by expert: the token of each, its weight, and the
    offsets (end of each expert's run, int32) and counts per expert; all on the device."""

    token: torch.Tensor  # [P] long
    expert: torch.Tensor  # [P] long
    weight: torch.Tensor  # [P] float32
    counts: torch.Tensor  # [E] long
    ends: torch.Tensor  # [E] int32


def sort_pairs(chosen: torch.Tensor, weights: torch.Tensor, num_experts: int) -> SortedPairs:
    flat = chosen.reshape(-1)
    order = flat.argsort(stable=True)
    # Counted by a scatter-add, not bincount: CUDA's bincount reads the largest id on the host.
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).index_add_(0, flat, torch.ones_like(flat))
    return SortedPairs(token=order // chosen.shape[1], expert=flat[order], weight=weights.reshape(-1)[order].float(),
                       counts=counts, ends=counts.cumsum(0).to(torch.int32))


def combine(x: torch.Tensor, pairs: SortedPairs, outputs: torch.Tensor) -> torch.Tensor:
    """Each pair's output times its weight, added to its token's row (fp32), cast to x's dtype."""
    mixed = torch.zeros(x.shape[0], outputs.shape[-1], dtype=torch.float32, device=x.device)
    mixed.index_add_(0, pairs.token, outputs.float() * pairs.weight[:, None])
    return mixed.to(x.dtype)


def loop_kernel(experts, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The reference: each expert on its tokens in turn; one host sync (the counts)."""
    tokens, k = chosen.shape
    pairs = chosen.reshape(-1)
    order = pairs.argsort(stable=True)
    counts = torch.bincount(pairs, minlength=len(experts) if not isinstance(experts, StackedExperts)
                            else experts.num_experts).tolist()
    routed_inputs = x[order // k]
    routed_outputs = torch.empty_like(routed_inputs)
    start = 0
    for e, count in enumerate(counts):
        if count:
            routed_outputs[start:start + count] = experts.expert(e, routed_inputs[start:start + count])
            start += count
    per_pair = torch.empty_like(routed_outputs)
    per_pair[order] = routed_outputs
    mixed = (per_pair.view(tokens, k, -1).float() * weights.float()[..., None]).sum(dim=1)
    return mixed.to(x.dtype)


def grouped_kernel(experts: StackedExperts, x, chosen, weights) -> torch.Tensor:
    pairs = sort_pairs(chosen, weights, experts.num_experts)
    routed = x[pairs.token]

    def project(inputs, stacked):
        return torch._grouped_mm(inputs, stacked.transpose(1, 2), offs=pairs.ends)

    hidden = F.silu(project(routed, experts.gate_proj)) * project(routed, experts.up_proj)
    return combine(x, pairs, project(hidden, experts.down_proj))


def padded_kernel(experts: StackedExperts, x, chosen, weights) -> torch.Tensor:
    pairs = sort_pairs(chosen, weights, experts.num_experts)
    tokens = x.shape[0]
    # Each pair's row inside its expert's run: its rank among the pairs sorted before it.
    starts = (pairs.ends - pairs.counts.to(torch.int32)).long()
    slot = torch.arange(pairs.token.shape[0], device=x.device) - starts[pairs.expert]
    buffer = x.new_zeros(experts.num_experts, tokens, x.shape[-1])
    buffer[pairs.expert, slot] = x[pairs.token]
    hidden = F.silu(torch.bmm(buffer, experts.gate_proj.transpose(1, 2))) \
        * torch.bmm(buffer, experts.up_proj.transpose(1, 2))
    out = torch.bmm(hidden, experts.down_proj.transpose(1, 2))
    return combine(x, pairs, out[pairs.expert, slot])


MOE_KERNELS: dict[str, Callable] = {"loop": loop_kernel, "grouped": grouped_kernel, "padded": padded_kernel}
STACKED_ONLY = ("grouped", "padded")  # kernels that need StackedExperts (full-precision weights)


def kernel_names() -> list[str]:
    return [AUTO, *MOE_KERNELS]


def check_kernel(name, quantized: bool = False) -> str:
    """`name` if it is a kernel this model can run; InputError naming the problem otherwise."""
    if name not in kernel_names():
        raise InputError(f"unknown moe_kernel {name!r}; expected one of {', '.join(kernel_names())}")
    if quantized and name in STACKED_ONLY:
        raise InputError(f"moe_kernel {name!r} runs stacked full-precision experts; quantized experts run "
                         "one at a time: use moe_kernel 'loop' or 'auto' with --quantize")
    return name


def pick_kernel(experts, x: torch.Tensor) -> str:
    """``auto``'s choice: grouped where torch's grouped_mm runs without a host sync (CPU, any
    dtype; CUDA bf16 on compute capability 9.x / 10.x); padded on other GPUs up to 64 tokens
    (sync-free, and every expert's weights are read anyway there); else the loop. Quantized
    experts always loop. BENCHMARKS.md has the CPU measurements behind it."""
    if not isinstance(experts, StackedExperts):
        return "loop"
    if x.device.type == "cpu":
        return "grouped"
    cuda_bf16 = x.device.type == "cuda" and x.dtype == torch.bfloat16
    if cuda_bf16 and torch.cuda.get_device_capability(x.device)[0] in (9, 10):
        return "grouped"
    return "padded" if x.shape[0] <= 64 else "loop"


def run_experts(experts, kernel: str, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    name = pick_kernel(experts, x) if kernel == AUTO else kernel
    return MOE_KERNELS[name](experts, x, chosen, weights)
