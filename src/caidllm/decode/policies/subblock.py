"""Fast-dLLM v2's decoder (NVlabs Fast-dLLM v2, the modeling file's ``generate`` and the
generation utilities' ``batch_sample``): threshold decoding one sub-block at a time.

A block is cut into sub-blocks of ``sub_block`` positions, decoded left to right. At each step,
of the first sub-block that still holds a mask, every masked position whose confidence is
strictly above ``threshold`` is committed, and always the most confident one. A block whose first
position is generated (every block but the one holding the end of the prompt) begins with an
autoregressive step: that position alone is committed, predicted from the last position of the
block before it (the token shift; the official loop takes the argmax of the completed block's
last logit, its "next token", before decoding the new block).
"""

from __future__ import annotations

import dataclasses

import torch

from caidllm.decode.policies.base import StepView, with_most_confident


def current_sub_block(masked: torch.Tensor, sub_block: int) -> torch.Tensor:
    """[R, block] True at the positions of each row's first sub-block that holds a mask."""
    index = torch.arange(masked.shape[1], device=masked.device) // sub_block
    beyond = masked.shape[1] // sub_block  # above every sub-block index: rows without a mask match none
    current = torch.where(masked, index, beyond).min(dim=1, keepdim=True).values
    return index == current


def select(view: StepView, threshold: float, sub_block: int) -> torch.Tensor:
    eligible = view.masked & current_sub_block(view.masked, sub_block)
    commit = with_most_confident(eligible & (view.confidence > threshold),
                                 dataclasses.replace(view, masked=eligible))
    first_only = torch.zeros_like(commit)
    first_only[:, 0] = True
    return torch.where(view.masked[:, :1], first_only, commit)
